"""Plugins (``--plugin``): Python files or modules of the user's, imported before a program checks
its flags, so that the termination rules, advantage estimators, reward sources and generation
backends they register (:func:`marlhf.macro.rules.register_rule`,
:func:`marlhf.algo.registry.register_estimator`, :func:`marlhf.rewards.registry.register_source`,
:func:`marlhf.models.generation.registry.register_backend`) are valid values of
``--termination_condition``, ``--advantage_estimator``, ``--reward_source`` and
``--generation_backend``.

A plugin is named by a path ending in ``.py`` (relative to the working directory) or by a dotted
module name on ``sys.path`` (``my_package.rules``). Each is imported once per process: a second
:func:`load_plugins` of the same file or module returns the module imported the first time, so a
program may load the plugins of its command line and then those its saved configuration names.

>>> load_plugins(["json"])[0].__name__
'json'
>>> load_plugins(["no_such_dir/rules.py"])
Traceback (most recent call last):
...
ValueError: --plugin no_such_dir/rules.py: no such file

The registries declare their built-in entries without importing them: an entry names its
implementation as ``"package.module:attr"``, which :func:`resolve_reference` imports when the entry
is first built (the entry-point pattern of setuptools' and skyrl-gym's registries), so that a
program's flags are parsed and checked without torch.

>>> resolve_reference("json:dumps", "--reward_source j")([1])
'[1]'
>>> resolve_reference("json:no_such_name", "--reward_source j")
Traceback (most recent call last):
...
ValueError: --reward_source j: its implementation json:no_such_name cannot be imported (AttributeError: module 'json' has no attribute 'no_such_name')
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "declared_implementation",
    "implements_declaration",
    "lazy_attributes",
    "load_plugins",
    "plugin_module_name",
    "resolve_reference",
]


def plugin_module_name(path: Path) -> str:
    """The module name a plugin file is imported under: ``marlhf_plugin_<stem>_<hash of its
    resolved path>`` (two files of one name in different folders are two modules)."""
    resolved = path.resolve()
    stem = re.sub(r"\W", "_", resolved.stem)
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    return f"marlhf_plugin_{stem}_{digest}"


def _where(err: BaseException) -> str:
    """``file:line`` of the innermost frame of ``err`` (the plugin's own line, usually)."""
    frames = traceback.extract_tb(err.__traceback__)
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _import_file(spec: str) -> ModuleType:
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--plugin {spec}: no such file")
    name = plugin_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path.resolve())
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"--plugin {spec}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before running it: dataclasses and pickle look modules up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ValueError(f"--plugin {spec}: {type(err).__name__}: {err}{_where(err)}") from err
    return module


def _import_module(spec: str) -> ModuleType:
    if spec in sys.modules:
        return sys.modules[spec]
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name is not None and spec.startswith(err.name):
            raise ValueError(
                f"--plugin {spec}: no module {err.name!r} (give a path ending in .py, or a "
                "module on PYTHONPATH)"
            ) from err
        raise ValueError(f"--plugin {spec}: {type(err).__name__}: {err}{_where(err)}") from err
    except Exception as err:
        raise ValueError(f"--plugin {spec}: {type(err).__name__}: {err}{_where(err)}") from err


def load_plugins(specs: Iterable[str]) -> list[ModuleType]:
    """Import every plugin of ``specs`` (a ``.py`` path or a dotted module name), in order, each
    once per process; returns their modules.

    Raises:
        ValueError: ``--plugin SPEC: ...``: a missing file or module, or the error its import
            raised, with the plugin's file and line.
    """
    modules = []
    for spec in specs:
        spec = str(spec).strip()
        if not spec:
            continue
        modules.append(_import_file(spec) if spec.endswith(".py") else _import_module(spec))
    return modules


def resolve_reference(target: str, owner: str) -> Any:
    """The object ``target`` (``"package.module:attr"``) names, its module imported: the
    implementation of a registry's entry (``owner``: the flag and value that chose it, for the
    message).

    Raises:
        ValueError: ``OWNER: its implementation TARGET cannot be imported (...)``.
    """
    module, sep, attr = target.partition(":")
    try:
        if not sep or not module or not attr:
            raise ImportError("not of the form package.module:attr")
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"{owner}: its implementation {target} cannot be imported ({type(err).__name__}: {err})"
        ) from err


def implements_declaration(registry: dict[str, type], cls: Any, name: str) -> bool:
    """Whether ``cls`` implements the declaration ``registry`` holds as ``name``: a subclass of
    it, while the declaration still names an implementation (so it may take the declaration's
    place)."""
    entry = registry.get(name)
    return (
        entry is not None
        and entry.__dict__.get("implementation") is not None
        and isinstance(cls, type)
        and issubclass(cls, entry)
    )


def declared_implementation(registry: dict[str, type], name: str, flag: str, kind: str) -> type:
    """The class that answers ``name`` in ``registry``: the registered class, or, for a
    declaration, the subclass its ``implementation`` names (its module imported:
    :func:`resolve_reference`), which then takes its place in ``registry`` under its ``name``.
    ``flag`` (``--termination_condition``) and ``kind`` (``rule``) name the entry in the errors.

    Raises:
        ValueError: an implementation that cannot be imported (naming it).
        TypeError: an implementation that is no subclass of its declaration.
    """
    cls = registry[name]
    target = cls.__dict__.get("implementation")
    if target is None:
        return cls
    impl = resolve_reference(target, f"{flag} {name}")
    if not (isinstance(impl, type) and issubclass(impl, cls)):
        raise TypeError(f"{target} is no subclass of {cls.__qualname__}, the {kind} {name!r}")
    impl.name = name
    registry[name] = impl
    return impl


def lazy_attributes(package: str, modules: dict[str, str], namespace: dict[str, Any]):
    """A package's module-level ``__getattr__`` (PEP 562) for the names ``modules`` maps to the
    module that defines each: imported on first use (a package that must import without torch
    offers the names that need it this way), then kept in ``namespace`` (the package's
    ``globals()``). ``package`` names the package in the ``AttributeError`` of other names.

    >>> __getattr__ = lazy_attributes("pkg", {"dumps": "json"}, {})
    >>> __getattr__("dumps")([1])
    '[1]'
    >>> __getattr__("loads")
    Traceback (most recent call last):
    ...
    AttributeError: module 'pkg' has no attribute 'loads'
    """

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
