"""The project's only atomic-write and JSON-safety helpers (the lowest layer: stdlib only).

Every file the project writes goes through :func:`atomic_write_bytes` (or its text/JSON
wrappers): a uniquely named temporary file in the destination folder, flushed and fsynced,
made world-readable (0644, not ``mkstemp``'s 0600: reports, predictors and state files
are read by other users on shared storage), then ``os.replace``-d over the destination. A
reader never sees a half-written file, and two writers never share a temporary name.

Every JSON file is strict JSON: :func:`json_safe` turns NaN/±inf into ``null`` (and numpy
values into plain numbers) before :func:`dumps` serialises with ``allow_nan=False``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]
#: Mode of every file the project writes.
FILE_MODE = 0o644


def atomic_write_bytes(path: PathLike, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write ``data`` to ``path`` atomically (unique temporary file, fsync, ``mode`` (0644), replace)."""
    return atomic_write_with(path, lambda tmp: Path(tmp).write_bytes(data), mode=mode)


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathLike, value: Any, *, indent: Optional[int] = 2) -> Path:
    """Write ``value`` as strict JSON (:func:`dumps`, newline-terminated) atomically."""
    return atomic_write_text(path, dumps(value, indent=indent) + "\n")


def atomic_write_with(path: PathLike, write: Callable[[str], Any], mode: int = FILE_MODE) -> Path:
    """Call ``write(temporary_path)`` (e.g. ``frame.to_parquet``, ``torch.save``), then move
    the temporary file over ``path`` atomically (with permissions ``mode``); the temporary
    file is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def json_safe(value: Any) -> Any:
    """A strict-JSON-serialisable copy of ``value``: non-finite floats become None, numpy
    scalars plain numbers, arrays and tuples lists, mapping keys strings, dataclass-like
    objects with ``to_dict()`` their dict, anything else its ``repr``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)  # numpy scalar
    if callable(item) and getattr(value, "ndim", None) == 0:
        try:
            return json_safe(item())
        except Exception:  # noqa: BLE001 - fall back below
            pass
    tolist = getattr(value, "tolist", None)  # numpy array
    if callable(tolist):
        try:
            return json_safe(tolist())
        except Exception:  # noqa: BLE001
            pass
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        try:
            return json_safe(to_dict())
        except Exception:  # noqa: BLE001
            pass
    return repr(value)


def dumps(value: Any, *, indent: Optional[int] = 2) -> str:
    """Strict JSON of ``json_safe(value)`` (never ``NaN``/``Infinity``)."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False, ensure_ascii=False)


def finite_or_none(value: Any) -> Optional[float]:
    """``value`` as a finite float, or None (missing, non-numeric, bool, NaN, ±inf)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} (NaN/Infinity are not strict JSON)")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:  # json.loads would keep the last one without a word
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def loads_strict(text: str) -> Any:
    """Parse strict JSON: ``NaN``/``Infinity`` and a key given twice in one object are a
    ``ValueError``, not floats or the last value."""
    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_refuse_duplicate_keys)
