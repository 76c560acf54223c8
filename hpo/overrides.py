"""`--set key=value` overrides for YAML configs, and readable config errors."""

from __future__ import annotations

import copy
from typing import Any, Iterable

import yaml
from pydantic import ValidationError


class ConfigError(ValueError):
    """A config problem, with a message that names the field (and file) at fault."""


def apply_overrides(data: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` applied.

    Values are parsed as YAML scalars/lists (``lr=3e-3``, ``rungs=[0.1,0.2]``), so the same
    spelling works on the command line and in files.
    """
    result = copy.deepcopy(data)
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: expected key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: cannot parse value {raw!r}: {exc}") from None
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return result


def format_validation_error(exc: ValidationError, source: str = "config") -> str:
    """One line per problem, each naming the dotted field path."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{source}: {where}: {message}")
    return "\n".join(lines)


def read_yaml(path: str) -> dict[str, Any]:
    """Read a YAML mapping, with an error naming the file on any problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data
