"""Shapes of the shared LR schedules (predictors/schedules.py) and their validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictors.schedules import NAMED_SCHEDULES, Schedule


@pytest.mark.parametrize("name", NAMED_SCHEDULES)
def test_warmup_ramps_linearly_to_the_peak(name: str) -> None:
    schedule = Schedule(name, warmup_fraction=0.1)  # type: ignore[arg-type]
    # Warmup starts at 0, is linear, and reaches exactly 1 at its end.
    assert schedule.at(0.0) == 0.0
    np.testing.assert_allclose(schedule([0.025, 0.05, 0.075]), [0.25, 0.5, 0.75])
    assert schedule.at(0.1) == pytest.approx(1.0)


@pytest.mark.parametrize("name", NAMED_SCHEDULES)
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


@pytest.mark.parametrize("name", ["linear", "cosine", "wsd"])
def test_final_fraction_is_the_floor_at_the_end(name: str) -> None:
    # Decay to 10% of the peak: η(1) is the floor, not 0; the peak is unchanged.
    schedule = Schedule(name, warmup_fraction=0.1, final_fraction=0.1)  # type: ignore[arg-type]
    assert schedule.at(1.0) == pytest.approx(0.1)
    assert schedule.at(0.1) == pytest.approx(1.0)


def test_cosine_to_a_floor_is_halfway_at_mid_decay() -> None:
    # f + (1 - f)·½(1 + cos πp) at p = ½: halfway between the peak and the floor.
    assert Schedule("cosine", 0.1, final_fraction=0.1).at(0.55) == pytest.approx(0.55)


def test_linear_10x_is_linear_to_a_tenth() -> None:
    # The old name is the same function as linear with final_fraction 0.1, and the same schedule.
    t = np.linspace(0, 1, 201)
    old, new = Schedule("linear_10x", 0.1), Schedule("linear", 0.1, final_fraction=0.1)
    np.testing.assert_allclose(old(t), new(t), rtol=0, atol=1e-15)
    assert old.same_as(new) and not Schedule("linear", 0.1).same_as(new)


def test_sqrt_cooldown_midpoint() -> None:
    # The "1-sqrt" cooldown: at half the decay phase η is 1 - √0.5; linear gives 0.5.
    sqrt = Schedule("wsd", 0.1, 0.2, decay_shape="sqrt")
    assert sqrt.at(0.9) == pytest.approx(1.0 - np.sqrt(0.5))
    assert sqrt.at(0.8) == 1.0 and sqrt.at(1.0) == 0.0
    assert Schedule("wsd", 0.1, 0.2, final_fraction=0.1, decay_shape="sqrt").at(0.9) == pytest.approx(
        0.1 + 0.9 * (1.0 - np.sqrt(0.5)))


def test_logged_schedule_is_the_logged_lr_over_its_max() -> None:
    t = (0.0, 0.05, 0.1, 0.4, 0.7, 1.0)
    lr = (0.0, 1.5e-4, 3e-4, 3e-4, 1.2e-4, 3e-5)
    schedule = Schedule("logged", points=(t, lr))
    # Exactly logged / max at each knot, linear between, flat beyond the ends.
    assert schedule(t).tolist() == (np.asarray(lr) / 3e-4).tolist()
    assert schedule.at(0.55) == pytest.approx((1.0 + 0.4) / 2)
    clipped = Schedule("logged", points=((0.2, 0.9), (2.0, 1.0)))
    assert clipped.at(0.0) == 1.0 and clipped.at(1.0) == 0.5
    # Peak-normalised when built: the same LR curve at another peak is the same schedule.
    assert Schedule("logged", points=(t, tuple(2 * x for x in lr))) == schedule


@pytest.mark.parametrize(
    "points",
    [None, ((0.5,), (1.0,)), ((0.0, 0.5), (1.0,)), ((0.0, 0.5, 0.4), (1.0, 1.0, 0.5)),
     ((0.0, 1.5), (1.0, 0.5)), ((0.0, 1.0), (1.0, float("nan"))), ((0.0, 1.0), (0.0, 0.0)),
     ((0.0, 1.0), (1.0, -0.1))],
)
def test_bad_logged_points_name_the_field(points: object) -> None:
    with pytest.raises(ValueError, match="points"):
        Schedule("logged", points=points)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"final_fraction": 1.0}, "final_fraction"), ({"final_fraction": -0.1}, "final_fraction"),
     ({"name": "linear_10x", "final_fraction": 0.2}, "final_fraction"),
     ({"decay_shape": "cubic"}, "decay_shape"), ({"points": ((0, 1), (1, 0))}, "points")],
)
def test_invalid_new_fields_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Schedule(**kwargs)


@pytest.mark.parametrize(
    "schedule",
    [Schedule("cosine", 0.05, final_fraction=0.1), Schedule("wsd", 0.02, 0.2, decay_shape="sqrt"),
     Schedule("wsd", 0.1, 0.6), Schedule("constant", 0.03), Schedule("linear", 0.1),
     Schedule("wsd", 0.05, 0.3, final_fraction=0.1, decay_shape="sqrt")],
    ids=["cosine-to-10pct", "wsd-sqrt-20pct", "wsd-linear-60pct", "constant", "linear", "wsd-sqrt-to-10pct"],
)
@pytest.mark.parametrize("steps", [(0, 1001, 10), (0, 996, 5)], ids=["every-10", "every-5-ends-early"])
def test_from_logged_names_the_schedule(schedule: Schedule, steps: tuple[int, int, int]) -> None:
    # A logged LR (float32, at an arbitrary peak, last point before the end on the second grid)
    # is recognised as its named schedule: the floor extrapolated to t̂ = 1.
    t = np.arange(*steps) / 1000
    found = Schedule.from_logged(t, (3e-4 * schedule(t)).astype(np.float32))
    assert found.same_as(schedule), found
    assert np.max(np.abs(found(t) - schedule(t))) < 1e-3


def test_from_logged_keeps_an_unnamed_lr_as_logged() -> None:
    # A step schedule is none of the named ones: the points are kept.
    t = np.linspace(0, 1, 21)
    lr = np.where(t < 0.5, 1e-3, 3e-4)
    found = Schedule.from_logged(t, lr)
    assert found.name == "logged" and found.warmup_fraction == 0.0
    assert found(t).tolist() == (lr / 1e-3).tolist()


def test_new_fields_round_trip_and_old_dicts_load() -> None:
    for schedule in (Schedule("wsd", 0.05, 0.3, final_fraction=0.1, decay_shape="sqrt"),
                     Schedule("logged", 0.1, points=((0.0, 0.1, 1.0), (0.0, 2.0, 1.0)))):
        data = json.loads(json.dumps(schedule.to_dict()))
        assert Schedule.from_dict(data) == schedule
        assert hash(Schedule.from_dict(data)) == hash(schedule)
    assert "points" not in Schedule().to_dict()
    # A dict written before the new fields existed reads as their defaults.
    assert Schedule.from_dict({"name": "cosine", "warmup_fraction": 0.1, "decay_fraction": 0.2}) == Schedule("cosine")


def test_same_as_compares_every_field_that_shapes_the_lr() -> None:
    base = Schedule("wsd", 0.1, 0.2)
    assert base.same_as(Schedule("wsd", 0.101, 0.2))  # within the fraction tolerance
    assert not base.same_as(Schedule("wsd", 0.1, 0.2, decay_shape="sqrt"))
    assert not base.same_as(Schedule("wsd", 0.1, 0.2, final_fraction=0.1))
    assert not base.same_as(Schedule("wsd", 0.1, 0.3))
    # A cosine's decay_fraction shapes nothing.
    assert Schedule("cosine", decay_fraction=0.3).same_as(Schedule("cosine"))
