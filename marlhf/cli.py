"""One CLI generator for every stage: argparse flags are generated from typed config dataclasses.

A stage config is a dataclass whose fields are themselves config dataclasses ("parts", e.g. model, data,
optimisation). Every leaf field of every part becomes one flag ``--field_name``; help text, extra
spellings (``aliases``) and ``choices`` come from the field's metadata, written once next to the field.
Flag names are global across parts, so two parts defining the same name is a programming error, caught
when the parser is built.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class Part:
...     ngram: int = field(default=1, metadata={"help": "tokens per macro action"})
...     sizes: tuple[int, ...] = field(default=(1, 2), metadata={"help": "choices"})
...     eos: bool = field(default=True, metadata={"help": "EOS alone"})
>>> @dataclass
... class Stage:
...     part: Part = field(default_factory=Part)
>>> cfg = parse_config(Stage, ["--ngram", "5", "--sizes", "2,3", "--no_eos"])
>>> (cfg.part.ngram, cfg.part.sizes, cfg.part.eos)
(5, (2, 3), False)

Shared parts compose into a part as fields of their own type ("sub-parts"), so a flag is defined
once and reused: the sub-part's fields become flags of the enclosing part, named with the field
metadata's ``prefix`` (``actor_`` turns ``lora_dim`` into ``--actor_lora_dim``), only those listed
in ``flags`` (the others keep their default), with the defaults of the sub-part's default instance
(a stage may default a shared flag differently) and, per flag, a ``help`` text of the composition
where the shared one does not fit. A sub-part's validation errors name its prefixed flags.

>>> @dataclass
... class Train:
...     lr: float = field(default=1e-3, metadata={"help": "learning rate"})
...     wd: float = field(default=0.0, metadata={"help": "weight decay"})
>>> @dataclass
... class Two:
...     actor: Train = field(default_factory=Train, metadata={"prefix": "actor_"})
...     critic: Train = field(default_factory=lambda: Train(lr=1e-2),
...                           metadata={"prefix": "critic_", "flags": ("lr",)})
>>> @dataclass
... class Stage2:
...     two: Two = field(default_factory=Two)
>>> cfg = parse_config(Stage2, ["--actor_lr", "5e-4", "--actor_wd", "0.1"])
>>> (cfg.two.actor.lr, cfg.two.actor.wd, cfg.two.critic.lr, cfg.two.critic.wd)
(0.0005, 0.1, 0.01, 0.0)
"""

import argparse
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from marlhf.config import check_numbers
from marlhf.config_file import load_config_file
from marlhf.plugins import load_plugins

C = TypeVar("C")

_SCALARS = (int, float, str)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise TypeError(f"unsupported union type {tp}")
    return tp, False


def _bool_value(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _tuple_parser(elem: type, flag: str):
    def parse(values: Sequence[str]) -> tuple:
        items: list[str] = []
        for v in values:
            items.extend(x for x in v.split(",") if x.strip() != "")
        try:
            return tuple(elem(x.strip()) for x in items)
        except ValueError as err:
            raise SystemExit(f"error: {flag}: {err}") from None

    return parse


def _leaf_fields(cls: type) -> list[tuple[str, dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _is_part(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


# the program's name in usage and errors when a front end names it (``marlhf sft``)
PROG: str | None = None


def _module_prog() -> str | None:
    """The name set in :data:`PROG` (the ``marlhf`` command sets ``marlhf SUB``); else ``python -m
    PACKAGE`` when a package runs as ``python -m PACKAGE`` (its ``__main__``), where argparse would
    name the program ``__main__.py``; None (argparse's default) otherwise."""
    if PROG is not None:
        return PROG
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or ""
    return f"python -m {name.removesuffix('.__main__')}" if name.endswith(".__main__") else None


@dataclasses.dataclass(frozen=True)
class _Flag:
    """One flag: its name, where its value goes (``part.sub.field``), the field and its type, its
    default and its help text."""

    name: str
    dest: str
    field: dataclasses.Field
    tp: Any
    default: Any
    help: str


def _sub_default(f: dataclasses.Field, tp: type) -> Any:
    """A part field's default instance; None for a part with required fields (flags without a
    default), which is built from the parsed flags alone."""
    if any(
        g.default is dataclasses.MISSING and g.default_factory is dataclasses.MISSING
        for g in dataclasses.fields(tp)
        if g.init
    ):
        return None
    value = _field_default(f)
    return tp() if value is dataclasses.MISSING else value


def _flags(cls: type, default: Any, path: str, prefix: str = "", only=None, helps=None):
    """The flags of part ``cls`` (default instance ``default``), sub-parts flattened (see the module
    docstring): ``only`` the field names that are flags (None: all), ``helps`` texts by field name
    (for the fields of nested sub-parts too)."""
    for name, f, tp in _leaf_fields(cls):
        if only is not None and name not in only:
            continue
        value = getattr(default, name) if default is not None else _field_default(f)
        if _is_part(tp):
            meta = f.metadata
            own_helps = meta.get("help") if isinstance(meta.get("help"), dict) else {}
            yield from _flags(
                tp,
                value if value is not dataclasses.MISSING else _sub_default(f, tp),
                f"{path}.{name}",
                prefix + meta.get("prefix", ""),
                meta.get("flags"),
                {**own_helps, **(helps or {})},  # the outer composition's texts win
            )
            continue
        text = (helps or {}).get(name, f.metadata.get("help", ""))
        yield _Flag(prefix + name, f"{path}.{name}", f, tp, value, str(text))


def _norm(flag: str) -> str:
    """A flag's spelling-free form: ``--max-new-tokens`` and ``--max_new_tokens`` agree."""
    return flag.replace("-", "_").lstrip("_")


def _flag_value(value: Any) -> str:
    """A config file's value as the text of a flag (lists comma-joined, None as ``none``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(_flag_value(v) for v in value)
    return str(value)


class Parser(argparse.ArgumentParser):
    """``argparse`` with the conventions of every marlhf program:

    - ``--a_b`` and ``--a-b`` are the same flag (whichever the program registered);
    - ``--config FILE`` (YAML or JSON) gives flags from a file: a mapping of flag names (``lr: 1e-3``,
      dashes or underscores) or, as ``run_config.json`` holds them, of parts to flags
      (``{"optim": {"learning_rate": 1e-3}}``); flags on the command line win;
    - an unknown flag gets "did you mean"; an error is two lines (what is wrong, where ``--help``
      is), not the usage of every flag.
    """

    config_paths: frozenset[str] = frozenset()  # dotted fields of the config that are no flags

    def __init__(self, *args, **kwargs):
        if PROG is not None:  # the front end's name (``marlhf tiny``) wins
            kwargs["prog"] = PROG
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        if "--config" not in self._option_string_actions:
            self.add_argument(
                "--config",
                metavar="FILE",
                help="YAML or JSON file of flags (a run's run_config.json reproduces the run); "
                "flags on the command line override it.",
            )

    def _flags(self) -> dict[str, str]:
        """normalised spelling -> registered option string."""
        return {_norm(o): o for o in self._option_string_actions if o.startswith("--")}

    def _by_dest(self) -> dict[str, str]:
        return {
            a.dest: a.option_strings[0]
            for a in self._actions
            if a.option_strings
            and a.option_strings[0].startswith("--")
            and a.help != argparse.SUPPRESS
        }

    def _respell(self, args: list[str]) -> list[str]:
        flags, out, after = self._flags(), [], False
        for a in args:
            if a == "--":
                after = True
            if not after and a.startswith("--") and len(a) > 2:
                key, eq, value = a.partition("=")
                if key not in self._option_string_actions and _norm(key) in flags:
                    a = flags[_norm(key)] + eq + value
            out.append(a)
        return out

    def _config_args(self, path: str) -> list[str]:
        """The flags a config file gives, as command-line tokens (``--flag=value``)."""
        data, flags, dests = load_config_file(path), self._flags(), self._by_dest()
        out: list[str] = []
        set_by: dict[str, str] = {}  # flag -> the key of the file that sets it

        def add(flag: str, value: Any, key: str) -> None:
            if flag == "--config":
                raise ValueError(
                    f"--config {path}: {key} names another config file, which is not read; "
                    "give each file with its own --config on the command line"
                )
            if flag in set_by:
                raise ValueError(
                    f"--config {path}: {set_by[flag]} and {key} both set {flag}; keep one"
                )
            set_by[flag] = key
            action = self._option_string_actions[flag]
            if isinstance(value, list | tuple) and not value:
                return  # an empty list has no spelling on the command line: the default stays
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                if bool(value) == isinstance(action, argparse._StoreTrueAction):
                    out.append(flag)
                return
            out.append(f"{flag}={_flag_value(value)}")

        def walk(prefix: str, mapping: dict) -> None:
            for key, value in mapping.items():
                dest = f"{prefix}{key}"
                if dest in dests:
                    add(dests[dest], value, dest)
                elif isinstance(value, dict) and any(d.startswith(f"{dest}.") for d in dests):
                    walk(f"{dest}.", value)  # a part (or sub-part) of run_config.json
                elif dest in self.config_paths:
                    continue  # a field of the config that is no flag (it keeps its default)
                elif not prefix and _norm(str(key)) in flags:
                    add(flags[_norm(str(key))], value, str(key))
                else:
                    raise ValueError(
                        f"--config {path}: {dest} is no flag of this program{self._hint(str(key))}"
                    )

        walk("", data)
        return out

    def _hint(self, key: str) -> str:
        names = [f for f in self._flags() if f]
        close = difflib.get_close_matches(_norm(key), names, n=1, cutoff=0.6)
        return f" (did you mean --{close[0]}?)" if close else ""

    def parse_known_args(self, args=None, namespace=None):
        args = self._respell(list(sys.argv[1:] if args is None else args))
        configs = [
            a.partition("=")[2] if a.startswith("--config=") else args[i + 1]
            for i, a in enumerate(args)
            if (a == "--config" and i + 1 < len(args)) or a.startswith("--config=")
        ]
        if configs:
            try:
                given = [t for path in configs for t in self._config_args(path)]
            except ValueError as err:
                self.error(str(err))
            args = given + args  # the command line's flags come later, so they win
        self._load_plugins(args)
        return super().parse_known_args(args, namespace)

    def _load_plugins(self, args: list[str]) -> None:
        """Import the files and modules of a ``plugins`` flag (``--plugin``) before any flag is
        checked: the rules, estimators, reward sources and generation backends they register are
        values of the flags."""
        for action in self._actions:
            if getattr(action, "plugins", False):
                pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
                pre.add_argument(*action.option_strings, dest="specs", nargs="+", action="extend")
                given = pre.parse_known_args(args)[0].specs or []
                try:  # a, b or a,b as every tuple flag
                    load_plugins(x for v in given for x in v.split(","))
                except ValueError as err:
                    self.error(str(err))

    def error(self, message: str):
        """Two lines on stderr, exit status 2: the problem (with "did you mean" for an unknown
        flag) and where the flags are listed."""
        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ").split()
            flags = [u for u in unknown if u.startswith("-")]
            if flags:
                message = "; ".join(
                    f"unknown flag {u.partition('=')[0]}{self._hint(u.partition('=')[0])}"
                    for u in flags
                )
        self.exit(2, f"{self.prog}: error: {message}\nsee {self.prog} --help for the flags\n")


# --help lists the flags by what they are about, in this order; a part's fields go to its part's
# group unless the part names one per field (``HELP_GROUPS``, e.g. inference's single part)
GROUP_ORDER = (
    "model", "data", "generation", "algorithm", "macro actions", "optimisation", "logging",
    "performance",
)  # fmt: skip
PART_GROUPS = {
    "model": "model",
    "models": "model",
    "data": "data",
    "generation": "generation",
    "ppo": "algorithm",
    "reward": "algorithm",
    "macro": "macro actions",
    "optim": "optimisation",
    "log": "logging",
    "ds": "performance",
    "perf": "performance",
    "code": "code rewards",
}


# the shared parts a part composes (sub-parts) go to their own group: an actor's learning rate is
# optimisation, its ZeRO stage performance
CLASS_GROUPS = {
    "ModelConfig": "model",
    "OptimConfig": "optimisation",
    "DeepSpeedConfig": "performance",
    "DataConfig": "data",
    "MacroConfig": "macro actions",
    "LoggingConfig": "logging",
}


def _owner(stage_cls: type, dest: str) -> type:
    """The config class that holds the field at ``dest`` (``models.actor.optim.learning_rate`` ->
    OptimConfig)."""
    cls = stage_cls
    for name in dest.split(".")[:-1]:
        cls, _ = _unwrap_optional(typing.get_type_hints(cls)[name])
    return cls


def _group_title(part_name: str, part_tp: type, name: str, owner: type | None = None) -> str:
    per_field = getattr(part_tp, "HELP_GROUPS", {})
    if name in per_field:
        return per_field[name]
    if owner is not None and owner is not part_tp and owner.__name__ in CLASS_GROUPS:
        return CLASS_GROUPS[owner.__name__]
    return PART_GROUPS.get(part_name, part_name)


def _help_groups(parser: argparse.ArgumentParser, stage_cls: type) -> dict[str, Any]:
    """One argparse group per title the stage's flags use, created in :data:`GROUP_ORDER`."""
    titles: dict[str, str | None] = {}
    for part_name, _pf, part_tp in _leaf_fields(stage_cls):
        if not _is_part(part_tp):
            raise TypeError(f"{stage_cls.__name__}.{part_name} must be a config dataclass")
        doc = (part_tp.__doc__ or "").strip().splitlines()[0] if part_tp.__doc__ else None
        for flag in _flags(part_tp, _sub_default(_pf, part_tp), part_name):
            owner = _owner(stage_cls, flag.dest)
            title = _group_title(part_name, part_tp, flag.dest.split(".")[1], owner)
            # a whole part in its group: the part's docstring describes it
            whole = not getattr(part_tp, "HELP_GROUPS", {}) and owner is part_tp
            if title not in titles or (whole and titles[title] is None):
                titles[title] = doc if whole else None
    rank = {t: i for i, t in enumerate(GROUP_ORDER)}
    ordered = sorted(titles, key=lambda t: (rank.get(t, len(rank)), list(titles).index(t)))
    return {t: parser.add_argument_group(t, titles[t]) for t in ordered}


def build_parser(stage_cls: type, description: str | None = None) -> argparse.ArgumentParser:
    """An ``argparse`` parser with one flag per leaf field of ``stage_cls``'s parts."""
    parser = Parser(
        prog=_module_prog(),
        # the flags are listed by group in --help; the usage line does not repeat them all
        usage="%(prog)s [-h] [--config FILE] [flags]",
        description=description or (stage_cls.__doc__ or "").strip().splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    seen: dict[str, str] = {}
    post: dict[str, Any] = {}
    groups = _help_groups(parser, stage_cls)
    for part_name, pf, part_tp in _leaf_fields(stage_cls):
        if not _is_part(part_tp):
            raise TypeError(f"{stage_cls.__name__}.{part_name} must be a config dataclass")
        for flag in _flags(part_tp, _sub_default(pf, part_tp), part_name):
            owner = _owner(stage_cls, flag.dest)
            group = groups[_group_title(part_name, part_tp, flag.dest.split(".")[1], owner)]
            _add_flag(group, flag, part_name, seen, post)
    parser.set_defaults(_tuple_post=post)
    parser.config_paths = frozenset(_field_paths(stage_cls))
    return parser


def _field_paths(cls: type, prefix: str = ""):
    """Every field of a config as a dotted path (``models.critic.optim.weight_decay``)."""
    for name, _f, tp in _leaf_fields(cls):
        base, _ = _unwrap_optional(tp) if not _is_part(tp) else (tp, False)
        yield f"{prefix}{name}"
        if _is_part(base):
            yield from _field_paths(base, f"{prefix}{name}.")


def _add_flag(group, flag: _Flag, part_name: str, seen: dict, post: dict) -> None:
    """Add ``flag`` to ``group`` (a name defined twice is a programming error)."""
    f, tp, default = flag.field, flag.tp, flag.default
    meta = dict(f.metadata)
    # ``flag``: the name every program uses for this (e.g. --model_name_or_path); the field's own
    # spelling stays an alias
    name = meta.get("flag", f"--{flag.name}")
    if name in seen:
        raise TypeError(f"flag {name} defined by both {seen[name]} and {part_name}")
    seen[name] = part_name
    aliases = ((f"--{flag.name}",) if name != f"--{flag.name}" else ()) + tuple(
        meta.get("aliases", ())
    )
    for a in aliases:
        if a in seen:
            raise TypeError(f"alias {a} of {name} already used by {seen[a]}")
        seen[a] = part_name
    text = flag.help + (f" Range {meta['range']}." if "range" in meta else "")
    kwargs: dict[str, Any] = {
        "dest": flag.dest,
        "help": text.replace("%", "%%"),  # argparse formats help with %
        "metavar": flag.name.upper(),
    }
    if default is dataclasses.MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    base, optional = _unwrap_optional(tp)
    if isinstance(meta.get("choices"), Mapping):
        # a registry: its names are read when a value is checked and when --help lists them
        # (argparse's own {a,b} metavar), so the names --plugin files register count too
        kwargs["choices"] = meta["choices"]
        del kwargs["metavar"]
    elif "choices" in meta:
        kwargs["choices"] = tuple(meta["choices"])
        # --help lists the values (argparse shows only the metavar otherwise)
        kwargs["metavar"] = "{" + ",".join(map(str, kwargs["choices"])) + "}"
    if base is bool:
        kwargs.pop("default", None)
        group.add_argument(
            name,
            *aliases,
            nargs="?",
            const=True,
            type=_bool_value,
            default=default,
            **{k: v for k, v in kwargs.items() if k in ("dest", "help", "metavar")},
        )
        group.add_argument(
            f"--no_{flag.name}", dest=kwargs["dest"], action="store_false", help=argparse.SUPPRESS
        )
        return
    if typing.get_origin(base) is tuple:
        elem = typing.get_args(base)[0]
        kwargs["nargs"] = "+"
        kwargs["type"] = str
        kwargs.pop("choices", None)
        post[kwargs["dest"]] = _tuple_parser(elem, name)
        if meta.get("repeat"):  # --label a --label b: the values add up
            kwargs["action"] = "extend"
            kwargs["default"] = list(default)
    elif base in _SCALARS:
        kwargs["type"] = base
        if optional:
            kwargs["type"] = _optional(base)
            if "choices" in kwargs:  # `none` is a value of an optional flag too
                kwargs["choices"] = (*kwargs["choices"], None)
    else:
        raise TypeError(f"unsupported field type {tp} for {name}")
    action = group.add_argument(name, *aliases, **kwargs)
    action.plugins = bool(meta.get("plugins"))  # imported before any flag is checked


def _optional(base: type):
    def parse(text: str):
        if text.strip().lower() in ("none", "null", ""):
            return None
        return base(text)

    parse.__name__ = base.__name__
    return parse


def parse_config(
    stage_cls: type[C], argv: Sequence[str] | None = None, description: str | None = None
) -> C:
    """Parse ``argv`` (default ``sys.argv[1:]``) into a validated ``stage_cls`` instance.

    Each part's ``__post_init__`` validates; its ``ValueError`` becomes a clean CLI error naming the flag.
    """
    parser = build_parser(stage_cls, description)
    ns = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return config_from_namespace(stage_cls, parser, ns)


def config_from_namespace(
    stage_cls: type[C], parser: argparse.ArgumentParser, ns: argparse.Namespace
) -> C:
    """The validated ``stage_cls`` of a namespace parsed by ``build_parser(stage_cls)`` (a program
    that adds positional arguments to that parser removes them from ``ns`` first)."""
    values = dict(vars(ns))
    values.pop("config", None)  # --config FILE: its flags are parsed already
    post = values.pop("_tuple_post")
    for dest, value in values.items():
        if dest in post and isinstance(value, list):
            values[dest] = post[dest](value)
    try:
        built = {
            name: _build(tp, _sub_default(f, tp), values, name)
            for name, f, tp in _leaf_fields(stage_cls)
        }
        cfg = stage_cls(**built)
        for part in built.values():  # what the flags need installed (a tracker's package, ...)
            if hasattr(part, "check_environment"):
                part.check_environment()
        return cfg
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits


def _build(cls: type, default: Any, values: dict[str, Any], path: str, prefix: str = "") -> Any:
    """Part ``cls`` from the parsed ``values`` (by dest), starting from its default instance (the
    fields without a flag keep their default); a prefixed sub-part's errors name prefixed flags.
    Its numbers are checked first (finite, in their ``range``: :func:`marlhf.config.check_numbers`),
    whatever the part's own validation does with them."""
    kw: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for name, f, tp in _leaf_fields(cls):
        dest = f"{path}.{name}"
        if _is_part(tp):
            sub = getattr(default, name) if default is not None else _sub_default(f, tp)
            kw[name] = _build(tp, sub, values, dest, prefix + f.metadata.get("prefix", ""))
        elif dest in values:
            kw[name] = given[name] = values[dest]
    check_numbers(cls, given, prefix)
    try:
        return cls(**kw) if default is None else dataclasses.replace(default, **kw)
    except ValueError as err:
        if not prefix:
            raise
        own = {f.name for f in dataclasses.fields(cls)}
        text = re.sub(r"--(\w+)", lambda m: f"--{prefix}{m[1]}" if m[1] in own else m[0], str(err))
        raise ValueError(text) from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def flag_values(cfg: Any) -> dict[str, Any]:
    """``{flag name: value}`` of a stage config, one entry per flag its parser has (the name
    without dashes, as ``--help`` lists it, a composed part's prefix included: ``actor_dropout``),
    the values JSON-able as in :func:`config_to_dict`.

    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Train:
    ...     lr: float = 1e-3
    ...     wd: float = 0.0
    >>> @dataclass
    ... class Two:
    ...     actor: Train = field(default_factory=Train, metadata={"prefix": "actor_"})
    ...     critic: Train = field(default_factory=Train, metadata={"prefix": "critic_",
    ...                                                            "flags": ("lr",)})
    >>> @dataclass
    ... class Stage:
    ...     two: Two = field(default_factory=Two)
    >>> flag_values(Stage())
    {'actor_lr': 0.001, 'actor_wd': 0.0, 'critic_lr': 0.001}
    """
    out = {}
    for part_name, _f, part_tp in _leaf_fields(type(cfg)):
        for flag in _flags(part_tp, getattr(cfg, part_name), part_name):
            out[flag.name] = flag.default
    return json.loads(json.dumps(out, default=str))


def config_from_dict(stage_cls: type[C], data: dict[str, Any]) -> C:
    """Inverse of :func:`config_to_dict` (a run's ``run_config.json`` back into its config; keys the
    config does not know are ignored, missing ones take their defaults). The plugins it names are
    imported first (:func:`marlhf.plugins.load_plugins`), as its rules and estimators are values."""
    load_plugins(_plugin_specs(stage_cls, data))
    hints = typing.get_type_hints(stage_cls)
    kw = {}
    for name, value in data.items():
        if name not in hints:
            continue
        base, _ = _unwrap_optional(hints[name])
        if _is_part(base) and isinstance(value, dict):
            value = config_from_dict(base, value)
        elif typing.get_origin(base) is tuple and isinstance(value, list):
            value = tuple(value)
        kw[name] = value
    return stage_cls(**kw)


def _plugin_specs(cls: type, data: Any) -> list[str]:
    """The values in ``data`` (``run_config.json``'s mapping) of ``cls``'s fields that name plugins
    (metadata ``plugins``), in every part."""
    if not isinstance(data, dict):
        return []
    specs: list[str] = []
    for name, f, tp in _leaf_fields(cls):
        base = _unwrap_optional(tp)[0]
        if _is_part(base):
            specs += _plugin_specs(base, data.get(name))
        elif f.metadata.get("plugins") and isinstance(data.get(name), list | tuple):
            specs += [str(v) for v in data[name]]
    return specs


_UNSET = object()


def given_dests(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> frozenset[str]:
    """The destinations (``part.field``) that ``argv`` sets explicitly with ``parser`` (from
    :func:`build_parser`): a flag given with any value, even the default, as opposed to those left
    at their defaults; what a caller that fills the gaps from elsewhere (a run's saved
    configuration) must not override."""
    ns = argparse.Namespace(
        **{a.dest: _UNSET for a in parser._actions if a.dest not in ("help", "_tuple_post")}
    )
    parser.parse_args(sys.argv[1:] if argv is None else list(argv), namespace=ns)
    return frozenset(
        k for k, v in vars(ns).items() if v is not _UNSET and "." in k and k != "_tuple_post"
    )
