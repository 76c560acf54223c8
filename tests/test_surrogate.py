"""The surrogate ℓ̂ of Eq. 4–5 wired to the controls (predictors/surrogate.py)."""

import numpy as np
import pytest

from predictors import Controls, SurrogateParams, normalized_surrogate
from predictors import equations
from predictors.schedules import NAMED_SCHEDULES, Schedule

P = SurrogateParams(0.3, -0.3, 2.0, -0.2)


@pytest.mark.parametrize("name", NAMED_SCHEDULES)
@pytest.mark.parametrize("warmup", [0.0, 0.05, 0.3])
def test_surrogate_is_one_at_the_end_for_every_schedule(name, warmup):
    # ℓ̂(1) = 1 for any schedule and warmup fraction, and ℓ̂ is finite and positive everywhere.
    c = Controls(0.2, 20.0, Schedule(name, warmup_fraction=warmup, decay_fraction=0.2))
    t = np.linspace(0.0, 1.0, 201)
    ell = normalized_surrogate(t, c, P)
    assert ell[-1] == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.isfinite(ell)) and np.all(ell > 0)


def test_surrogate_calls_the_paper_equation():
    # normalized_surrogate equals equations.surrogate with η from the schedule and b, q from Eq. 5.
    sched = Schedule("cosine", warmup_fraction=0.1)
    c = Controls(0.07, 80.0, sched)
    t = np.linspace(0.01, 1.0, 50)
    b = 0.3 * 0.07**-0.3
    q = 2.0 * 80.0**-0.2
    expect = equations.surrogate(t, sched(t), sched(1.0), b, q)
    np.testing.assert_allclose(normalized_surrogate(t, c, P), expect, rtol=1e-14)


def test_constant_schedule_uses_eta_one_at_the_end():
    # Under a constant LR η(1) = 1, so ℓ̂(t̂) − 1 comes only from the power-law term after warmup.
    c = Controls(0.2, 20.0, Schedule("constant", warmup_fraction=0.0))
    t = np.array([0.5])
    expect = ((1.001 / 0.501) ** 0.05 + P.b(0.2) * 1.1 ** P.q(20.0)) / (1 + P.b(0.2) * 1.1 ** P.q(20.0))
    np.testing.assert_allclose(normalized_surrogate(t, c, P), expect)


def test_smaller_tau_gives_larger_late_drop_under_decay():
    # With b_exp < 0, smaller τ has larger b, so ℓ̂ mid-training is higher (bigger late drop, paper §5).
    t = np.array([0.5])
    small = normalized_surrogate(t, Controls(0.02, 20.0), P)[0]
    large = normalized_surrogate(t, Controls(1.0, 20.0), P)[0]
    assert small > large > 1.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"eps1": -1e-3}, "eps1"),
        ({"eps2": 0.0}, "eps2"),
        ({"m": float("nan")}, "m"),
        ({"b_const": 0.0}, "b_const"),
        ({"q_const": -1.0}, "q_const"),
        ({"b_exp": float("inf")}, "b_exp"),
    ],
)
def test_params_reject_bad_values(kwargs, field):
    # Non-finite parameters and non-positive constants are ValueErrors naming the field.
    base = dict(b_const=0.3, b_exp=-0.3, q_const=2.0, q_exp=-0.2)
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        SurrogateParams(**base)


def test_surrogate_rejects_t_outside_unit_interval():
    # t̂ outside [0, 1] or non-finite is a ValueError, never extrapolated silently.
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        normalized_surrogate([0.5, 1.5], Controls(0.2, 20.0), P)
    with pytest.raises(ValueError, match="non-finite"):
        normalized_surrogate([np.nan], Controls(0.2, 20.0), P)
