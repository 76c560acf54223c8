"""Shapes of the shared LR schedules (predictors/schedules.py) and their validation."""

from __future__ import annotations

import numpy as np
import pytest

from predictors.schedules import SCHEDULE_NAMES, Schedule


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_warmup_ramps_linearly_to_the_peak(name: str) -> None:
    schedule = Schedule(name, warmup_fraction=0.1)  # type: ignore[arg-type]
    # Warmup starts at 0, is linear, and reaches exactly 1 at its end.
    assert schedule.at(0.0) == 0.0
    np.testing.assert_allclose(schedule([0.025, 0.05, 0.075]), [0.25, 0.5, 0.75])
    assert schedule.at(0.1) == pytest.approx(1.0)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_peak_is_one_and_values_stay_in_unit_interval(name: str) -> None:
    values = Schedule(name)(np.linspace(0, 1, 1001))  # type: ignore[arg-type]
    # The schedule is peak-normalised: its maximum is 1 and it never leaves [0, 1].
    assert values.max() == pytest.approx(1.0)
    assert values.min() >= 0.0


def test_linear_decays_to_zero() -> None:
    schedule = Schedule("linear", warmup_fraction=0.1)
    # D2Z: linear from 1 at the end of warmup to exactly 0 at t̂ = 1, halfway at the middle.
    assert schedule.at(1.0) == 0.0
    assert schedule.at(0.55) == pytest.approx(0.5)


def test_linear_10x_ends_at_a_tenth() -> None:
    schedule = Schedule("linear_10x", warmup_fraction=0.1)
    # 10x decay: ends at 0.1 of the peak, linearly.
    assert schedule.at(1.0) == pytest.approx(0.1)
    assert schedule.at(0.55) == pytest.approx(0.55)


def test_constant_stays_at_peak() -> None:
    # After warmup, constant stays at 1 through the end.
    np.testing.assert_allclose(Schedule("constant")(np.linspace(0.1, 1.0, 50)), 1.0)


def test_cosine_half_period() -> None:
    schedule = Schedule("cosine", warmup_fraction=0.1)
    # Half-cosine: 0.5 at the middle of the decay, 0 at the end.
    assert schedule.at(0.55) == pytest.approx(0.5)
    assert schedule.at(1.0) == pytest.approx(0.0, abs=1e-12)


def test_wsd_is_stable_then_decays() -> None:
    schedule = Schedule("wsd", warmup_fraction=0.1, decay_fraction=0.2)
    # Stable at the peak until 1 − decay_fraction, then linear to 0.
    np.testing.assert_allclose(schedule(np.linspace(0.1, 0.8, 20)), 1.0)
    assert schedule.at(0.9) == pytest.approx(0.5)
    assert schedule.at(1.0) == 0.0


def test_no_warmup_starts_at_peak() -> None:
    # warmup_fraction 0: the first value is the peak.
    assert Schedule("linear", warmup_fraction=0.0).at(0.0) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "exponential"}, "schedule"),
        ({"warmup_fraction": 1.0}, "warmup_fraction"),
        ({"warmup_fraction": -0.1}, "warmup_fraction"),
        ({"name": "wsd", "warmup_fraction": 0.5, "decay_fraction": 0.6}, "decay_fraction"),
        ({"name": "wsd", "decay_fraction": 0.0}, "decay_fraction"),
    ],
)
def test_invalid_schedules_name_the_field(kwargs: dict, field: str) -> None:
    # Bad names and fractions raise ValueError naming the field.
    with pytest.raises(ValueError, match=field):
        Schedule(**kwargs)


def test_round_trip_through_dict() -> None:
    schedule = Schedule("wsd", 0.05, 0.3)
    # to_dict / from_dict preserve the schedule.
    assert Schedule.from_dict(schedule.to_dict()) == schedule
