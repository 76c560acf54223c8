"""Atomic writes and strict JSON (predictors/io.py), the only copies in the project."""

import json
import math
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from predictors.io import atomic_write_json, atomic_write_text, dumps, json_safe, loads_strict


def test_written_files_are_world_readable(tmp_path: Path) -> None:
    # Predictors and reports live on shared storage: 0644, not mkstemp's 0600.
    path = atomic_write_text(tmp_path / "sub" / "a.txt", "x")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert path.read_text() == "x"


def test_concurrent_writers_never_share_a_temporary_file(tmp_path: Path) -> None:
    # Many threads rewriting one file: every write lands whole, nothing is left behind.
    target = tmp_path / "state.json"
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for _ in range(20):
                atomic_write_json(target, {"writer": i, "payload": list(range(200))})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(target.read_text())["payload"] == list(range(200))
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_json_is_strict() -> None:
    # NaN/inf become null; numpy values become plain numbers; reading NaN back is an error.
    text = dumps({"a": math.nan, "b": np.float32(1.5), "c": np.arange(2), "d": (math.inf,)})
    assert json.loads(text) == {"a": None, "b": 1.5, "c": [0, 1], "d": [None]}
    assert json_safe({1: np.int64(3)}) == {"1": 3}
    with pytest.raises(ValueError, match="NaN"):
        loads_strict('{"a": NaN}')


def test_loads_strict_refuses_a_duplicated_key() -> None:
    # json.loads keeps the last of two values without a word; a predictor file edited by hand
    # could then mean something else than it reads.
    import pytest

    from predictors.io import loads_strict

    with pytest.raises(ValueError, match="duplicate key 'm'"):
        loads_strict('{"params": {"m": 0.1, "m": 0.2}}')
    assert loads_strict('{"a": {"m": 1}, "b": {"m": 2}}') == {"a": {"m": 1}, "b": {"m": 2}}
