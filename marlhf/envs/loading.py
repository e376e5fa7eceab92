"""Finding the environment class that ``--env`` names, reading ``--env_config``, and building one
environment per prompt row.

``--env`` takes three forms:

- an id registered with ``skyrl_gym.register``: skyrl-gym's own (``gsm8k``, ``gsm8k_multi_turn``,
  ``aime``, ``lcb``, ``search``, ``searchcode``, ``text2sql``) and the bundled
  ``marlhf-trail-{2,4,8}`` (:mod:`marlhf.data.trail`), registered by :func:`register_bundled`;
- ``path/to/file.py:ClassName``: the class in a Python file (imported as a module of its own);
- ``module:ClassName``: the class in an importable module.

An environment is built as SkyRL builds it: ``cls(**registered_kwargs, env_config=...,
extras=...)``, where ``env_config`` is an OmegaConf ``DictConfig`` of ``--env_config`` (SkyRL's
environments read it by attribute, ``env_config.db_path``) and ``extras`` the prompt row's other
columns (``reward_spec``, ``extra_info``, ...) plus ``max_turns``. skyrl-gym's Python tool is then
swapped for the sandboxed one (:mod:`marlhf.envs.tools`).

skyrl-gym is imported inside the functions that need it: it imports pandas, seconds on a CPU.

>>> EnvTarget.parse("envs/maze.py:Maze").kind, EnvTarget.parse("my_pkg.envs:Maze").kind
('file', 'module')
>>> EnvTarget.parse("gsm8k_multi_turn").kind
'id'
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from marlhf.config_file import load_config_file
from marlhf.envs.tools import sandbox_python_tools

# The bundled environments: id -> (entry point, registered kwargs).
BUNDLED_ENVS = {
    f"marlhf-trail-{n}": ("marlhf.envs.trail:TrailEnv", {"turns": n}) for n in (2, 4, 8)
}


def register_bundled() -> None:
    """Register the bundled environments with skyrl-gym (once; an id already taken is left)."""
    import skyrl_gym

    for env_id, (entry_point, kwargs) in BUNDLED_ENVS.items():
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""


@dataclass(frozen=True)
class EnvTarget:
    """Where an environment class is: ``kind`` ``id`` (``where`` the id), ``module`` (``where`` the
    module) or ``file`` (``where`` the file), and ``attr`` the class in the module or file."""

    kind: str
    where: str
    attr: str = ""

    @staticmethod
    def parse(spec: str) -> EnvTarget:
        if ":" not in spec:
            return EnvTarget("id", spec)
        where, _, attr = spec.rpartition(":")
        is_file = where.endswith(".py") or "/" in where or os.sep in where
        return EnvTarget("file" if is_file else "module", where, attr)

    def text(self) -> str:
        return self.where if self.kind == "id" else f"{self.where}:{self.attr}"


def _module_of_file(path: str, flag: str):
    """The module of the Python file ``path``, imported once under a name derived from its absolute
    path (so a worker process that imports the same file gets the same module name)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{flag}: no such file {path}")
    stem = "".join(c if c.isalnum() else "_" for c in os.path.basename(path)[:-3])
    name = f"marlhf_env_file_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{flag}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the file raises is the user's to see
        del sys.modules[name]
        raise ValueError(f"{flag}: importing {path} failed: {type(err).__name__}: {err}") from None
    return module


def _import_module(name: str, flag: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise ValueError(
                f"{flag}: no module named {name!r} (a file? write path/to/file.py:ClassName)"
            ) from None
        raise ValueError(f"{flag}: importing {name} failed: {type(err).__name__}: {err}") from None
    except Exception as err:  # noqa: BLE001 - whatever the module raises is the user's to see
        raise ValueError(f"{flag}: importing {name} failed: {type(err).__name__}: {err}") from None


def _attribute(module, attr: str, where: str, flag: str):
    if not hasattr(module, attr):
        classes = sorted(k for k, v in vars(module).items() if isinstance(v, type))
        raise ValueError(f"{flag}: {where} has no {attr}{_did_you_mean(attr, classes)}")
    return getattr(module, attr)


def resolve_target(target: EnvTarget, flag: str) -> tuple[Any, dict, str]:
    """(class or creator, registered kwargs, importable ``module:attr`` or ``file:attr`` text) of
    ``target``; ValueError naming ``flag`` when it cannot be found."""
    if target.kind == "file":
        module = _module_of_file(target.where, flag)
        where = os.path.abspath(target.where)
        return _attribute(module, target.attr, where, flag), {}, f"{where}:{target.attr}"
    if target.kind == "module":
        module = _import_module(target.where, flag)
        return _attribute(module, target.attr, target.where, flag), {}, target.text()
    import skyrl_gym

    register_bundled()
    spec = skyrl_gym.registry.get(target.where)
    if spec is None:
        known = sorted(skyrl_gym.registry)
        raise ValueError(
            f"{flag}: no environment registered with id {target.where!r}"
            f"{_did_you_mean(target.where, known)} (registered: {', '.join(known)}; or give "
            "path/to/file.py:ClassName or module:ClassName)"
        )
    entry = spec.entry_point
    if callable(entry):
        text = f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', '?')}"
        return entry, dict(spec.kwargs), text
    where, _, attr = str(entry).rpartition(":")
    module = _import_module(where, f"{flag} (id {target.where!r}, entry point {entry})")
    return _attribute(module, attr, where, flag), dict(spec.kwargs), str(entry)


@dataclass(frozen=True)
class EnvFactory:
    """What builds the environment of each row.

    ``spec``: ``--env`` as given; ``name``: how errors and metrics name it (the id, or the class
    name); ``target``: ``module:attr`` or ``/abs/file.py:attr``, what a worker process imports;
    ``cls``: the class (or creator); ``kwargs``: the registered kwargs; ``env_config``: the parsed
    ``--env_config`` (a plain mapping).
    """

    spec: str
    name: str
    target: str
    cls: Any = field(repr=False)
    kwargs: dict = field(default_factory=dict)
    env_config: dict = field(default_factory=dict)

    def make(self, extras: dict) -> Any:
        """A new environment with ``extras`` (its Python tool sandboxed); ValueError when the class
        does not make a skyrl_gym ``Env``; the constructor's own errors propagate."""
        return build_env(self.cls, self.kwargs, self.env_config, extras, self.name)

    def aggregate_metrics(self, metrics: list[dict]) -> dict:
        """The class's ``aggregate_metrics`` of per-episode ``get_metrics`` dicts (skyrl-gym's
        default, the mean of the numbers, for a class without one)."""
        agg = getattr(self.cls, "aggregate_metrics", None)
        if agg is None:
            from skyrl_gym.metrics import default_aggregate_metrics

            return default_aggregate_metrics(metrics)
        return dict(agg(metrics))


def build_env(cls, kwargs: dict, env_config: dict, extras: dict, name: str):
    """``cls(**kwargs, env_config=DictConfig(env_config), extras=extras)`` with skyrl-gym's Python
    tool swapped for the sandboxed one."""
    import skyrl_gym
    from omegaconf import OmegaConf

    env = cls(**kwargs, env_config=OmegaConf.create(env_config), extras=extras)
    if not isinstance(env, skyrl_gym.Env):
        raise ValueError(
            f"--env {name}: builds a {type(env).__name__}, not a skyrl_gym Env (subclass "
            "skyrl_gym.envs.base_text_env.BaseTextEnv)"
        )
    sandbox_python_tools(env)
    return env


def parse_env_config(value: str | None) -> dict:
    """``--env_config``: None -> ``{}``; text starting with ``{`` -> that JSON object; else a
    ``.json``/``.yaml``/``.yml`` file holding a mapping (ValueError naming the flag otherwise)."""
    if value is None:
        return {}
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"--env_config: not a valid JSON object ({err})") from None
        if not isinstance(data, dict):
            raise ValueError("--env_config: must be a JSON object")
        return data
    if not value.endswith((".json", ".yaml", ".yml")):
        raise ValueError(
            f"--env_config {value}: give a JSON object ({{...}}) or a .json/.yaml/.yml file"
        )
    return load_config_file(value, flag="--env_config")


def load_env(spec: str, env_config: str | None = None) -> EnvFactory:
    """The :class:`EnvFactory` of ``--env spec`` with ``--env_config env_config`` (see the module
    doc); ValueError naming the flag and the spec when the class cannot be found or the config
    cannot be read."""
    flag = f"--env {spec}"
    target = EnvTarget.parse(spec)
    cls, kwargs, text = resolve_target(target, flag)
    if not callable(cls):
        raise ValueError(f"{flag}: {text} is a {type(cls).__name__}, not an environment class")
    name = target.where if target.kind == "id" else target.attr
    return EnvFactory(spec, name, text, cls, kwargs, parse_env_config(env_config))


def factory_from_target(
    spec: str, name: str, target: str, kwargs: dict, env_config: dict
) -> EnvFactory:
    """The factory a worker process rebuilds from what :func:`load_env` resolved in the parent."""
    cls, _, _ = resolve_target(EnvTarget.parse(target), f"--env {spec}")
    return EnvFactory(spec, name, target, cls, kwargs, env_config)
