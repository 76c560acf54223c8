"""The table of a run's keys (predictors/run_keys.py): what a trial reports, what MLflow logs,
what the bank keeps and what the replay re-reports all follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.trials import replay
from hpo.tracking import runs as tracking
from hpo.trials.curve_bank import OPTIONAL_RUN_COLUMNS, RUN_COLUMNS
from hpo.trials.trainable import report_controls
from predictors.run_keys import KEY_TYPES, RUN_KEYS, names
from tests.test_trainable import _trainable


def test_a_trial_reports_every_reported_key_with_the_tables_type(tmp_path: Path) -> None:
    controls = report_controls(_trainable(tmp_path / "sweep").trainer)
    assert tuple(controls) == names(reported=True)
    assert all(type(v) is KEY_TYPES[k] for k, v in controls.items())
    # What MLflow logs once per trial is reported by every trial.
    assert set(tracking.TRIAL_PARAMS) <= set(controls)


def test_the_bank_and_the_replay_follow_the_table() -> None:
    assert set(RUN_COLUMNS) | set(OPTIONAL_RUN_COLUMNS) == {k.name for k in RUN_KEYS if k.banked}
    # A replayed curve reports the banked controls a live trial reports, and its config
    # columns name the configuration without the seeds.
    assert set(names(reported=True, banked=True)) <= set(replay.REPORT_KEYS)
    assert "seed" not in replay.CONFIG_COLUMNS and "tau" in replay.CONFIG_COLUMNS
    with pytest.raises(TypeError, match="unknown field.*'logged'"):
        names(logged=True)
