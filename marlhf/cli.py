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
"""

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

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


def _module_prog() -> str | None:
    """``python -m PACKAGE`` when a package runs as ``python -m PACKAGE`` (its ``__main__``), where
    argparse would name the program ``__main__.py``; None (argparse's default) otherwise."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None) or ""
    return f"python -m {name.removesuffix('.__main__')}" if name.endswith(".__main__") else None


def build_parser(stage_cls: type, description: str | None = None) -> argparse.ArgumentParser:
    """An ``argparse`` parser with one flag per leaf field of ``stage_cls``'s parts."""
    parser = argparse.ArgumentParser(
        prog=_module_prog(),
        description=description or (stage_cls.__doc__ or "").strip().splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    seen: dict[str, str] = {}
    post: dict[str, Any] = {}
    for part_name, _pf, part_tp in _leaf_fields(stage_cls):
        if not _is_part(part_tp):
            raise TypeError(f"{stage_cls.__name__}.{part_name} must be a config dataclass")
        group = parser.add_argument_group(
            part_name, (part_tp.__doc__ or "").strip().splitlines()[0] if part_tp.__doc__ else None
        )
        for name, f, tp in _leaf_fields(part_tp):
            flag = f"--{name}"
            if flag in seen:
                raise TypeError(f"flag {flag} defined by both {seen[flag]} and {part_name}")
            seen[flag] = part_name
            meta = dict(f.metadata)
            aliases = tuple(meta.get("aliases", ()))
            for a in aliases:
                if a in seen:
                    raise TypeError(f"alias {a} of {flag} already used by {seen[a]}")
                seen[a] = part_name
            help_text = str(meta.get("help", "")).replace("%", "%%")  # argparse formats help with %
            default = _field_default(f)
            kwargs: dict[str, Any] = {
                "dest": f"{part_name}.{name}",
                "help": help_text,
                "metavar": name.upper(),
            }
            if default is dataclasses.MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = default
            base, optional = _unwrap_optional(tp)
            if "choices" in meta:
                kwargs["choices"] = tuple(meta["choices"])
                # --help lists the values (argparse shows only the metavar otherwise)
                kwargs["metavar"] = "{" + ",".join(map(str, kwargs["choices"])) + "}"
            if base is bool:
                kwargs.pop("default", None)
                group.add_argument(
                    flag,
                    *aliases,
                    nargs="?",
                    const=True,
                    type=_bool_value,
                    default=default,
                    **{k: v for k, v in kwargs.items() if k in ("dest", "help", "metavar")},
                )
                group.add_argument(
                    f"--no_{name}",
                    dest=kwargs["dest"],
                    action="store_false",
                    help=argparse.SUPPRESS,
                )
                continue
            if typing.get_origin(base) is tuple:
                elem = typing.get_args(base)[0]
                kwargs["nargs"] = "+"
                kwargs["type"] = str
                kwargs.pop("choices", None)
                post[kwargs["dest"]] = _tuple_parser(elem, flag)
            elif base in _SCALARS:
                kwargs["type"] = base
                if optional:
                    kwargs["type"] = _optional(base)
            else:
                raise TypeError(f"unsupported field type {tp} for {flag}")
            group.add_argument(flag, *aliases, **kwargs)
    parser.set_defaults(_tuple_post=post)
    return parser


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
    values = vars(ns)
    post = values.pop("_tuple_post")
    parts: dict[str, dict[str, Any]] = {}
    for dest, value in values.items():
        part, name = dest.split(".", 1)
        if dest in post and isinstance(value, list):
            value = post[dest](value)
        parts.setdefault(part, {})[name] = value
    hints = typing.get_type_hints(stage_cls)
    try:
        built = {p: hints[p](**kw) for p, kw in parts.items()}
        return stage_cls(**built)
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def config_from_dict(stage_cls: type[C], data: dict[str, Any]) -> C:
    """Inverse of :func:`config_to_dict` (used when resuming and by later stages reading a run)."""
    hints = typing.get_type_hints(stage_cls)
    parts = {}
    for part_name, part_tp in hints.items():
        if part_name not in data:
            continue
        kw = {}
        part_hints = typing.get_type_hints(part_tp)
        for name, value in data[part_name].items():
            if name not in part_hints:
                continue
            base, _ = _unwrap_optional(part_hints[name])
            if typing.get_origin(base) is tuple and isinstance(value, list):
                value = tuple(value)
            kw[name] = value
        parts[part_name] = part_tp(**kw)
    return stage_cls(**parts)
