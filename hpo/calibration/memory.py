"""The memory budget of a calibration from a user's curves (``hpo calibrate --from-curves``,
``--from-mlflow``; ``hpo monitor`` reads curve files the same way).

A curve file of any size either fits the budget or is refused before any work, with the memory
it would need: first from the file itself (its bytes, rows and columns, counted without parsing
it), then, once read, from the number of curves the fit would hold. The budget is
:data:`MEMORY_BUDGET_MB`, or ``HPO_MEMORY_MB`` where the machine has more (or less) to give.

The estimates are upper bounds of peak RSS measured on a generated 99 MB CSV (17,682 runs of 60
points, 12 columns; ``benchmarks/curve_memory.py``): reading it peaked at 533 MB, the calibration
at 549 MB over its first 7 minutes (estimated: 836 MB to read, 968 MB to fit), and between 300 and
1,200 curves the fit's peak grows by ~23 KB per curve on top of a fixed ~75 MB of chunked grids.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from hpo.common.errors import InputError

#: Memory a calibration may use (MB) unless ``HPO_MEMORY_MB`` says otherwise: what a laptop can
#: spare; a 99 MB CSV of 17,682 runs needs about 860 MB by the estimate below.
MEMORY_BUDGET_MB = 4096.0
MEMORY_BUDGET_ENV = "HPO_MEMORY_MB"

#: Python, pandas, numpy, matplotlib and MLflow loaded, calibrating a few curves (313 MB measured
#: calibrating 60 runs of the generated file, rounded up).
BASE_MB = 350.0
#: Reading: pandas holds each parsed cell as a number or a Python string (33 B per cell measured
#: on the 99 MB file, with the curves built from it), and a file's text is held at most ~5 times
#: over when it is not the table it claims to be (one long field, few separators).
BYTES_PER_CELL = 40.0
BYTES_PER_FILE_BYTE = 5.0
#: Fitting: the chunked candidate grids (fixed) and, per curve, its points resampled on the fit's
#: 200-point grid plus its per-curve tables (23 KB measured between 300 and 1,200 curves).
FIT_FIXED_MB = 100.0
FIT_KB_PER_CURVE = 30.0

_BLOCK = 1 << 20


class MemoryBudgetError(InputError):
    """The work would need more memory than the budget; the message says how much."""


def memory_budget_mb() -> float:
    """The budget in MB (``HPO_MEMORY_MB``, else :data:`MEMORY_BUDGET_MB`)."""
    raw = os.environ.get(MEMORY_BUDGET_ENV)
    try:
        value = float(raw) if raw else MEMORY_BUDGET_MB
    except ValueError:
        raise MemoryBudgetError(f"{MEMORY_BUDGET_ENV}: {raw!r} is not a number of MB") from None
    if not (math.isfinite(value) and value > 0):
        raise MemoryBudgetError(f"{MEMORY_BUDGET_ENV}: {raw!r} must be a finite number of MB > 0")
    return value


def read_memory_mb(size_bytes: int, rows: int, columns: int) -> float:
    """Peak memory (MB) to read a curve file of ``rows`` x ``columns`` cells and build its curves."""
    return BASE_MB + max(rows * columns * BYTES_PER_CELL, size_bytes * BYTES_PER_FILE_BYTE) / 2**20


def fit_memory_mb(curves: int) -> float:
    """Peak memory (MB) to calibrate on ``curves`` curves, with them in memory."""
    return BASE_MB + FIT_FIXED_MB + curves * FIT_KB_PER_CURVE / 1024


def check_curve_file_memory(path: Path) -> None:
    """Refuse ``path`` (a regular file) before it is parsed when reading it would exceed the
    budget. Counts rows by streaming the file in 1 MB blocks (a CSV) or from its metadata (a
    parquet file), so the check itself holds a few MB whatever the size."""
    budget = memory_budget_mb()
    size = path.stat().st_size
    if read_memory_mb(size, 0, 0) > budget:  # the bytes alone say so: no need to count
        _refuse_file(path, read_memory_mb(size, 0, 0), budget, f"{size / 2**20:,.0f} MB")
    rows, columns = _shape(path)
    need = read_memory_mb(size, rows, columns)
    if need > budget:
        _refuse_file(path, need, budget, f"{size / 2**20:,.0f} MB, {rows:,} rows x {columns} columns")


def check_fit_memory(curves: int, source: str) -> None:
    """Refuse a calibration on ``curves`` curves that would exceed the budget (before the fit)."""
    budget = memory_budget_mb()
    need = fit_memory_mb(curves)
    if need > budget:
        raise MemoryBudgetError(f"{source}: calibrating {curves:,} curves needs about {need:,.0f} MB, above the "
                                f"memory budget of {budget:,.0f} MB (set {MEMORY_BUDGET_ENV}=N to allow more, "
                                "or calibrate on fewer runs)")


#: Time a calibration may take (s) unless ``HPO_TIME_BUDGET_S`` says otherwise.
TIME_BUDGET_S = 3600.0
TIME_BUDGET_ENV = "HPO_TIME_BUDGET_S"
#: ``hpo calibrate --from-curves`` with its held-out refits (the default), measured on copies of
#: the 6 example runs on 2 cores under load ~6: 52 s for 12 curves, 78 s for 24, 242 s for 48;
#: fitted as FIXED + PER_CURVE_SQUARED·curves² (the refits grow with the curves, each over them).
FIT_FIXED_S = 40.0
FIT_S_PER_CURVE_SQUARED = 0.088


def fit_seconds(curves: int) -> float:
    """Estimated seconds of a calibration with held-out refits on ``curves`` curves."""
    return FIT_FIXED_S + FIT_S_PER_CURVE_SQUARED * curves**2


def check_fit_time(curves: int, source: str, held_out: bool) -> None:
    """Refuse, before the fit, a calibration whose held-out refits would run past the time
    budget (a 99 MB file of 17,682 runs had not finished after 300 s), with the time it would take."""
    if not held_out:
        return
    raw = os.environ.get(TIME_BUDGET_ENV)
    try:
        budget = float(raw) if raw else TIME_BUDGET_S
    except ValueError:
        raise MemoryBudgetError(f"{TIME_BUDGET_ENV}: {raw!r} is not a number of seconds") from None
    need = fit_seconds(curves)
    if need > budget:
        raise MemoryBudgetError(f"{source}: calibrating {curves:,} curves with held-out refits would take about "
                                f"{_duration(need)}, above the time budget of {_duration(budget)} (set "
                                f"{TIME_BUDGET_ENV}=N to allow more, fit.held_out_error: false to skip the refits, "
                                "or calibrate on fewer runs)")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def _refuse_file(path: Path, need: float, budget: float, what: str) -> None:
    raise MemoryBudgetError(f"{path}: reading this curve file ({what}) needs about {need:,.0f} MB, above the "
                            f"memory budget of {budget:,.0f} MB (set {MEMORY_BUDGET_ENV}=N to allow more, "
                            "or thin the points per run first)")


def _shape(path: Path) -> tuple[int, int]:
    """(rows, columns) of a curve file, upper bounds, without parsing it; (0, 0) when the file
    type is unknown or its metadata unreadable (the reader then names the problem)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            meta = pq.read_metadata(path)
        except Exception:  # noqa: BLE001 - not a parquet file: the reader's own error names it
            return 0, 0
        return int(meta.num_rows), int(meta.num_columns)
    if suffix != ".csv":
        return 0, 0
    rows, header, last = 0, b"", b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            if len(header) < _BLOCK and b"\n" not in header:
                header += block
            rows += block.count(b"\n")
            last = block[-1:]
    first = header.split(b"\n", 1)[0][:_BLOCK].decode("utf-8", errors="replace")
    columns = len(next(csv.reader([first]), [])) or 1
    return rows + (last != b"\n"), columns  # the header counts as a row: an upper bound
