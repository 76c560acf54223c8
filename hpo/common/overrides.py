"""Reading YAML configs strictly, `--set key=value` overrides, and readable config errors.

Every config the project reads (train, sweep, calibration) goes through :func:`read_yaml` and
:func:`apply_overrides`, so the same rules hold everywhere: a duplicate key is an error (YAML
would silently keep the last one), a non-finite number (``.inf``, ``.nan``) is an error (no
field of ours means anything at infinity), and every problem is one line naming the file and
the field.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from hpo.common.errors import InputError


class ConfigError(InputError):
    """A config problem, with a message that names the field (and file) at fault."""


#: Names that become directory names (a sweep's Ray experiment, a calibration's folder):
#: letters, digits, '.', '_' and '-', starting with a letter or digit, so a name can never
#: climb out of its parent directory ('../x') or name an absolute path.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_safe_name(value: str) -> str:
    """``value`` if it is a safe directory name (see :data:`SAFE_NAME`), else ``ValueError``."""
    if not isinstance(value, str) or not SAFE_NAME.match(value):
        raise ValueError(f"{value!r} is not a safe name: use letters, digits, '.', '_' and '-' "
                         "(starting with a letter or digit, at most 128 characters)")
    return value


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)  # resolve `<<` merge keys first: a merge may override
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: let SafeLoader raise its own error
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {first + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

#: Caps on one YAML document (a file or a `--set` value). A config is a few hundred values a
#: few levels deep; an alias bomb ("billion laughs": 9 levels of 9 aliases expand to 387 million
#: values from a 1 KB file), a recursive alias (``&a [*a]``) or a 1,000-deep nesting would hang
#: or overflow the stack of everything that walks the config, so they are refused up front,
#: counting values as expanded (an alias counts as the whole value it stands for).
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 50


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_node_graph(root: yaml.Node) -> None:
    """Refuse a composed document that is recursive, deeper than :data:`MAX_YAML_DEPTH` or
    larger than :data:`MAX_YAML_VALUES` once its aliases are expanded (``yaml.YAMLError``, so
    the caller names the file). Iterative, memoised per node: linear in the file, not in the
    expansion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key, children = id(node), _children(node)
        if leaving:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if depth[key] > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels (from line {node.start_mark.line + 1})")
            if size[key] > MAX_YAML_VALUES:
                raise yaml.YAMLError(f"more than {MAX_YAML_VALUES:,} values once its aliases are expanded (an alias "
                                     f"bomb? from line {node.start_mark.line + 1})")
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise yaml.YAMLError(f"recursive alias at line {child.start_mark.line + 1} (a value that contains itself)")
            if id(child) not in size:
                stack.append((child, False))


def _load_bounded(stream: Any) -> Any:
    """``yaml.load`` with :class:`_StrictLoader`, refusing recursive, too deep or too large
    documents before any Python object is built."""
    loader = _StrictLoader(stream)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # PyYAML composes nested values recursively
            raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
        if node is None:
            return None
        _check_node_graph(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: what is wrong and where (PyYAML's own text spans lines)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


#: Keys whose values are names or paths, never numbers: a sweep may be named 'nan'.
_TEXT_KEYS = frozenset({"name", "experiment", "output_dir", "predictor", "tracking_uri", "address", "corpus",
                        "cache_dir", "device", "schedule", "dtype", "token_dtype", "bank", "predictor_out"})


def check_finite(data: Any, source: str, _where: str = "") -> None:
    """Raise ``ConfigError`` naming the first non-finite number in ``data`` (nested), also one
    written as a string (``tau: "inf"``: pydantic would turn it into a float)."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(f"{source}: {_where or '(top level)'}: {data} is not a finite number")
    if isinstance(data, str) and _where.rsplit(".", 1)[-1] not in _TEXT_KEYS:
        try:
            number = float(data.strip())
        except ValueError:
            number = 0.0
        if not math.isfinite(number):
            raise ConfigError(f"{source}: {_where or '(top level)'}: {data!r} is not a finite number")
    if isinstance(data, dict):
        for key, value in data.items():
            check_finite(value, source, f"{_where}.{key}" if _where else str(key))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            check_finite(value, source, f"{_where}[{i}]")


def parse_yaml_value(raw: str, key: str) -> Any:
    """One `--set` value, parsed as YAML (``3e-3``, ``[0.1, 0.2]``, ``{a: 1}``)."""
    try:
        return _load_bounded(raw)
    except yaml.YAMLError as exc:
        shown = raw if len(raw) <= 60 else f"{raw[:40]}...({len(raw):,} characters)"
        raise ConfigError(f"--set {key}: cannot parse value {shown!r}: {_yaml_problem(exc)}") from None


def apply_overrides(data: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` applied.

    Values are parsed as YAML scalars/lists (``lr=3e-3``, ``rungs=[0.1,0.2]``), so the same
    spelling works on the command line and in files, under the same rules (no duplicate keys,
    finite numbers only).
    """
    result = copy.deepcopy(data)
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: expected key=value")
        parts = key.strip().split(".")
        if len(parts) > MAX_YAML_DEPTH:  # the same bound as a file's nesting (the checks after recurse)
            raise ConfigError(f"--set {key[:60]}...: a key of {len(parts):,} dotted parts, nested deeper than "
                              f"{MAX_YAML_DEPTH} levels")
        value = parse_yaml_value(raw, key)
        check_finite(value, "--set", key.strip())
        node = result
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
    """Read a YAML mapping strictly, with one error line naming the file on any problem:
    missing, a directory, unreadable, not UTF-8 text (a binary file), not valid YAML, a
    duplicate key, a non-finite number, or not a mapping at the top level."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = _load_bounded(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a YAML file") from None
    except PermissionError:
        raise ConfigError(f"{path}: cannot read (permission denied)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML file (not UTF-8 text; a binary file?)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    check_finite(data, path)
    return data
