"""Reading a ``--config FILE`` (YAML or JSON) into a mapping, with what is refused: a key given
twice in one mapping, and values that expand (through YAML aliases of aliases, or an alias inside
itself) to more than :data:`CONFIG_MAX_VALUES`. :mod:`marlhf.cli` turns the mapping into flags."""

from __future__ import annotations

import json
from typing import Any

# the values a config file may hold in all (YAML aliases can make a few lines stand for billions)
CONFIG_MAX_VALUES = 100_000


def _yaml_load(text: str, path: str, flag: str = "--config") -> Any:
    """``text`` parsed by PyYAML's safe loader, refusing a key given twice in one mapping."""
    import yaml

    class _Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[str, int] = {}
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                        continue
                    line = key_node.start_mark.line + 1
                    if key_node.value in seen:
                        raise ValueError(
                            f"{flag} {path} line {line}: {key_node.value} is given twice "
                            f"(first on line {seen[key_node.value]}); keep one"
                        )
                    seen[key_node.value] = line
            return super().construct_mapping(node, deep)

    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _json_pairs(path: str, flag: str = "--config"):
    """``object_pairs_hook`` of ``json.loads`` refusing a key given twice in one object."""

    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"{flag} {path}: {key} is given twice in one object; keep one")
            out[key] = value
        return out

    return hook


def _check_size(data: dict, path: str, flag: str = "--config") -> None:
    """Refuse a file whose values, expanded, number more than :data:`CONFIG_MAX_VALUES` (aliases of
    aliases, or an alias inside itself); the walk stops at the bound."""
    budget = CONFIG_MAX_VALUES
    for key, value in data.items():
        stack = [value]
        while stack:
            budget -= 1
            if budget < 0:
                raise ValueError(
                    f"{flag} {path}: the value of {key} expands to more than "
                    f"{CONFIG_MAX_VALUES} values (YAML aliases?); write the values out"
                )
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)


def load_config_file(path: str, flag: str = "--config") -> dict:
    """The mapping in a YAML (``.yaml``/``.yml``, needs PyYAML) or JSON file (ValueError naming
    ``flag`` and the file otherwise). A key given twice in one mapping is refused, and so is a file
    whose values expand (through YAML aliases) to more than :data:`CONFIG_MAX_VALUES`."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ValueError(f"{flag} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{flag} {path}: not UTF-8 text (byte {err.start})") from None
    is_yaml = path.endswith((".yaml", ".yml"))
    try:
        if is_yaml:
            try:
                import yaml  # noqa: F401
            except ImportError:
                raise ValueError(
                    f"{flag} {path}: reading YAML needs PyYAML (pip install pyyaml); or give "
                    "the file as JSON"
                ) from None
            data = _yaml_load(text, path, flag)
        else:
            data = json.loads(text, object_pairs_hook=_json_pairs(path, flag))
    except (json.JSONDecodeError, ValueError) as err:
        if str(err).startswith(flag):
            raise
        raise ValueError(
            f"{flag} {path}: not valid {'YAML' if is_yaml else 'JSON'} ({err})"
        ) from None
    except RecursionError:
        raise ValueError(f"{flag} {path}: nested too deeply") from None
    except Exception as err:  # yaml.YAMLError
        raise ValueError(f"{flag} {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        what = "flags to values" if flag == "--config" else "names to values"
        raise ValueError(f"{flag} {path}: must hold a mapping of {what}")
    _check_size(data, path, flag)
    return data
