"""The curve bank: every finished reference or audit curve, with its controls, in one parquet file.

Schema (long format, one row per logged point; zstd-compressed parquet):

| column | meaning |
|---|---|
| ``run_id`` | sha1 (12 hex) of the run's resolved trainer config: the same config is the same run |
| ``sweep`` | name of the calibration or sweep that produced it |
| ``step``, ``tokens``, ``train_fraction`` | position in the run (t̂ = tokens / D) |
| ``train_loss`` | mean training loss over the log interval (raw) |
| ``smoothed_loss`` | trailing moving average over ``smoothing_tokens`` (what the scheduler sees) |
| ``val_loss`` | validation loss on the fixed held-out set (NaN where not evaluated) |
| ``lr`` | LR of the hidden matrices at that step |
| ``tau``, ``tokens_per_param``, ``schedule``, ``warmup_fraction``, ``decay_fraction`` | the TLC controls |
| ``n_params``, ``total_tokens``, ``batch_size``, ``eta``, ``weight_decay`` | N, D, B, η, λ |
| ``d_model``, ``n_layers``, ``seq_len``, ``seed``, ``data_seed`` | model shape and seeds |
| ``corpus_hash``, ``status`` | sha256 of the corpus bytes (token datasets: of train.bin and val.bin); completed / diverged |
| ``vocab_size``, ``epochs`` | V (256 = bytes) and passes over the training tokens; optional: banks from before they existed read as 256 and NaN |
| ``final_fraction``, ``decay_shape`` | the schedule's floor η(1)/η_peak and WSD cooldown shape; optional: banks from before them read as 0 and ``linear`` |
| ``config_json`` | the resolved trainer config (JSON), to rerun exactly |

Loading never unpickles anything: parquet only.

Several processes may append to one bank (two calibrations sharing a bank, a calibration and
an audit): :func:`append_runs` holds an exclusive ``fcntl.flock`` on ``<bank>.lock`` for the
whole read-modify-write and replaces the file atomically through a uniquely named temporary
file (``predictors.io.atomic_write_with``), so no append is lost and a reader never sees a
half-written file. Readers take no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from hpo.common.errors import InputError
from predictors import run_keys
from predictors.io import atomic_write_with
from trainers.corpus import BYTE_VOCAB_SIZE, corpus_hash_of, training_tokens

#: The bank's columns, from the table of a run's keys (predictors.run_keys).
RUN_COLUMNS = run_keys.names(banked=True, bank_default=None)
#: Run columns added later, with what a bank written before them is read as.
OPTIONAL_RUN_COLUMNS: dict[str, Any] = run_keys.bank_defaults()
POINT_COLUMNS = run_keys.names(point=True)


class CurveBankError(InputError):
    """The bank file is missing columns or unreadable; the message names the file."""


#: Trainer fields that choose how a run executes, not what it computes, left out of its id:
#: ``compile`` (compiled and eager runs agree to float noise, ``tests/test_train.py``). Leaving
#: it out also keeps the ids of every run banked before the field existed.
EXECUTION_ONLY_FIELDS = ("compile",)


#: Trainer fields added after runs were banked, with the value every earlier run had, by
#: section ("": the top level): left out of the id at that value, so a run keeps the id it
#: was banked under.
FIELDS_ADDED_LATER: dict[str, dict[str, Any]] = {
    "model": {"vocab_size": BYTE_VOCAB_SIZE}, "data": {"token_dtype": "uint16"},
    "": {"final_fraction": 0.0, "decay_shape": "linear"},
}


def run_id_of(trainer_config: dict[str, Any]) -> str:
    """A stable id for a resolved trainer config (canonical JSON → sha1), execution-only
    fields (:data:`EXECUTION_ONLY_FIELDS`) left out.

    A run on a token dataset also carries the dataset's sha256 (the same config on other
    token files is another run) and, in its config, ``model.vocab_size``; a byte-level run's
    id is what it was before token datasets existed (:data:`FIELDS_ADDED_LATER`)."""
    identity = {k: v for k, v in trainer_config.items() if k not in EXECUTION_ONLY_FIELDS}
    for section, defaults in FIELDS_ADDED_LATER.items():
        if section == "":
            identity = {k: v for k, v in identity.items() if not (k in defaults and v == defaults[k])}
        elif isinstance(identity.get(section), dict):
            identity[section] = {k: v for k, v in identity[section].items()
                                 if not (k in defaults and v == defaults[k])}
    if isinstance(identity.get("data"), dict):
        token_hash = corpus_hash_of(identity["data"])
        if token_hash is not None:
            identity["corpus_hash"] = token_hash
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()[:12]


def load_bank(path: str | Path) -> pd.DataFrame:
    """Read the bank; an absent file is an empty bank."""
    path = Path(path)
    if not path.exists():
        return pd.DataFrame(columns=list(RUN_COLUMNS + tuple(OPTIONAL_RUN_COLUMNS) + POINT_COLUMNS))
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader error becomes one clear message
        raise CurveBankError(f"{path}: cannot read curve bank: {exc}") from None
    missing = [c for c in RUN_COLUMNS + POINT_COLUMNS if c not in frame.columns]
    if missing:
        raise CurveBankError(f"{path}: curve bank lacks columns {missing}")
    for column, default in OPTIONAL_RUN_COLUMNS.items():
        if column not in frame.columns:
            frame[column] = default
    return frame


def run_ids(path: str | Path) -> set[str]:
    frame = load_bank(path)
    return set(frame["run_id"].unique()) if len(frame) else set()


def curve_frame(run: dict[str, Any], points: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows for one run: ``run`` holds the run-level columns, ``points`` the logged records."""
    frame = pd.DataFrame([{c: p.get(c, np.nan) for c in POINT_COLUMNS} for p in points])
    for column in RUN_COLUMNS:
        frame[column] = run.get(column)
    for column, default in OPTIONAL_RUN_COLUMNS.items():
        value = run.get(column)
        frame[column] = default if value is None else value
    return frame[list(RUN_COLUMNS + tuple(OPTIONAL_RUN_COLUMNS) + POINT_COLUMNS)]


def lock_path(path: str | Path) -> Path:
    """The lock file of a bank: ``<bank>.lock`` beside it (kept; removing it would race)."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def bank_lock(path: str | Path) -> Iterator[None]:
    """Hold the bank's exclusive inter-process lock (``flock`` on :func:`lock_path`).

    ``flock`` locks are released by the kernel when the holder dies, so a killed writer never
    leaves the bank locked.
    """
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def append_runs(path: str | Path, frames: Iterable[pd.DataFrame]) -> int:
    """Add runs to the bank (replacing any with the same run_id). Returns rows added.

    Safe against concurrent appends from other processes: the read-modify-write runs under
    :func:`bank_lock`, and the new file replaces the old one atomically.
    """
    path = Path(path)
    new = [f for f in frames if len(f)]
    if not new:
        return 0
    added = pd.concat(new, ignore_index=True)
    with bank_lock(path):
        existing = load_bank(path)
        if len(existing):
            existing = existing[~existing["run_id"].isin(set(added["run_id"]))]
            combined = pd.concat([existing, added], ignore_index=True)
        else:
            combined = added
        atomic_write_with(path, lambda tmp: combined.to_parquet(tmp, compression="zstd", index=False))
    return len(added)


def smoothing_window_of(run: dict[str, Any]) -> float:
    """A banked run's smoothing window in tokens: its config's ``smoothing_tokens``, else the
    trainer's default (2% of the run's tokens, ``trainers.config.run_controls``)."""
    config = json.loads(run["config_json"]) if isinstance(run.get("config_json"), str) else {}
    window = config.get("smoothing_tokens")
    if window is None:
        window = int(round(0.02 * float(run["total_tokens"])))
    return float(window)


def resmooth(frame: pd.DataFrame) -> pd.DataFrame:
    """The bank with ``smoothed_loss`` recomputed from ``train_loss`` (the interval means) by
    the project's one smoother (``predictors.smoothing.trailing_mean``, token-weighted), over
    each run's own window. Points from the first non-finite ``train_loss`` on (a divergence)
    keep NaN. Used to bring banks written by an older smoother up to date."""
    from predictors.smoothing import trailing_mean

    out = frame.copy()
    for _, rows in out.groupby("run_id", sort=False):
        rows = rows.sort_values("step", kind="stable")
        loss = rows["train_loss"].to_numpy(dtype=float)
        bad = ~np.isfinite(loss)
        n = int(np.argmax(bad)) if bad.any() else len(loss)
        smoothed = np.full(len(loss), np.nan)
        if n:
            window = smoothing_window_of(rows.iloc[0].to_dict())
            smoothed[:n] = trailing_mean(rows["tokens"].to_numpy(dtype=float)[:n], loss[:n], window)
        out.loc[rows.index, "smoothed_loss"] = smoothed
    return out


def fill_epochs(frame: pd.DataFrame) -> pd.DataFrame:
    """The bank rows with ``epochs`` (passes over the training tokens) for every run: runs
    banked before the bank recorded it get total_tokens / the training split of their
    config's corpus as found here (NaN where the corpus is not here)."""
    if not len(frame) or not frame["epochs"].isna().any():
        return frame
    frame = frame.copy()
    split_sizes: dict[str, float] = {}
    for run_id, rows in frame[frame["epochs"].isna()].groupby("run_id", sort=False):
        first = rows.iloc[0]
        try:
            data = json.loads(first["config_json"]).get("data") or {}
            key = json.dumps(data, sort_keys=True)
            if key not in split_sizes:
                split_sizes[key] = float(training_tokens(data))
            frame.loc[rows.index, "epochs"] = float(first["total_tokens"]) / split_sizes[key]
        except (OSError, ValueError, TypeError, AttributeError):
            continue  # the corpus is not here (or the config unreadable): unknown
    return frame


def bank_curves(frame: pd.DataFrame, *, loss_column: str = "smoothed_loss", completed_only: bool = True) -> list:
    """Turn bank rows into ``predictors.Curve`` objects (one per run)."""
    from predictors import Controls, Curve

    curves = []
    for run_id, rows in frame.groupby("run_id", sort=True):
        first = rows.iloc[0]
        if completed_only and first["status"] != "completed":
            continue
        rows = rows.sort_values("train_fraction")
        values = rows[loss_column].to_numpy(dtype=float)
        t_hat = rows["train_fraction"].to_numpy(dtype=float)
        keep = np.isfinite(values) & (t_hat > 0)
        controls = Controls.from_mapping(first.to_dict())
        meta = {k: (first[k].item() if hasattr(first[k], "item") else first[k])
                for k in RUN_COLUMNS + tuple(OPTIONAL_RUN_COLUMNS) if k != "config_json" and k in first}
        meta["name"] = str(run_id)
        curves.append(Curve(t_hat[keep], values[keep], controls, meta=meta))
    return curves
