"""The controls of a run (predictors/controls.py): the flat mapping a result, a bank row or a file carries."""

from __future__ import annotations

import json

import pytest

from predictors.controls import Controls
from predictors.schedules import Schedule


@pytest.mark.parametrize(
    "schedule",
    [Schedule("cosine", 0.05, final_fraction=0.1), Schedule("wsd", 0.02, 0.2, decay_shape="sqrt"),
     Schedule("logged", 0.1, points=((0.0, 0.1, 1.0), (0.0, 1.0, 0.25)))],
)
def test_schedule_fields_round_trip_through_the_flat_mapping(schedule: Schedule) -> None:
    controls = Controls(0.3, 20.0, schedule, 1e5)
    flat = controls.to_dict()
    assert Controls.from_mapping(flat) == controls
    # Through JSON too (a result file), and with the points as a JSON string (a CSV cell).
    assert Controls.from_mapping(json.loads(json.dumps(flat))) == controls
    if schedule.points is not None:
        assert Controls.from_mapping({**flat, "schedule_points": json.dumps(flat["schedule_points"])}) == controls
    else:
        assert "schedule_points" not in flat


def test_old_mappings_read_as_floor_zero_and_linear_cooldown() -> None:
    # A mapping from before final_fraction and decay_shape (or a bank row with them NaN) is unchanged.
    for extra in ({}, {"final_fraction": float("nan"), "decay_shape": None}):
        c = Controls.from_mapping({"tau": 0.3, "tokens_per_param": 20, "schedule": "wsd", **extra})
        assert c.schedule == Schedule("wsd")


def test_bad_schedule_points_name_the_field() -> None:
    with pytest.raises(ValueError, match="schedule_points"):
        Controls.from_mapping({"tau": 0.3, "tokens_per_param": 20, "schedule": "logged", "schedule_points": "[[0, 1"})
    with pytest.raises(ValueError, match="points"):
        Controls.from_mapping({"tau": 0.3, "tokens_per_param": 20, "schedule": "logged"})
