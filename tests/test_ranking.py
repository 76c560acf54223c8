"""Ranking errors by kind of sweep (predictors/ranking.py) and their measurement (hpo/calibration/ranking_error.py)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import predictors.ranking
from hpo.calibration.ranking_error import probit_scale
from predictors.ranking import KindError, RankingError, probability_best


def test_docstring_examples_run() -> None:
    assert doctest.testmod(predictors.ranking).failed == 0


def test_unknown_kinds_and_bad_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown sweep kind"):
        RankingError({"weird": KindError((0.1,), (0.01,), (0.01,), (1,), (1,))})
    with pytest.raises(ValueError, match="one entry per stop fraction"):
        KindError((0.1, 0.2), (0.01,), (0.01, 0.02), (1, 1), (1, 1))


def test_cross_scale_scale_applies_off_scale_only_when_larger() -> None:
    small = KindError((0.1,), (0.01,), (0.01,), (10,), (2,))
    large = KindError((0.1,), (0.05,), (0.05,), (10,), (2,))
    # A file without held-out groups (older calibrations): off the calibrated scale the pooled
    # cross-scale table applies where it is the harder evidence.
    from predictors.ranking import Position

    off = [Position("tokens_per_param", False, 0.5)]
    table = RankingError({"lambda": small}, {"lambda": large}, cross_scale_source="leave-one-TPP-out")
    assert table.order_at(0.1, "lambda").scale == 0.01
    order = table.order_at(0.1, "lambda", off)
    assert order.scale == 0.05 and "lambda across scales (leave-one-TPP-out)" in order.words
    assert RankingError({"lambda": large}, {"lambda": small}).order_at(0.1, "lambda", off).scale == 0.05


def test_probit_scale_recovers_the_noise_of_the_order() -> None:
    # Pairs whose true log-ratio is the predicted one plus N(0, σ²): the fitted scale is near σ,
    # its upper bound above it, and tighter with more pairs.
    rng = np.random.default_rng(0)
    for sigma in (0.01, 0.03):
        dp = rng.uniform(-0.08, 0.08, size=2000)
        dt = dp + rng.normal(0, sigma, size=dp.size)
        mle, upper = probit_scale(dp, dt, np.ones_like(dp))
        assert mle == pytest.approx(sigma, rel=0.2) and mle <= upper <= 1.3 * mle
    # With a handful of pairs that all agree, the bound stays wide (no false confidence).
    mle, upper = probit_scale(np.array([0.02, 0.03]), np.array([0.01, 0.02]), np.ones(2))
    assert upper >= 0.01
    # No pair with a predicted order: no evidence at all.
    assert probit_scale(np.zeros(3), np.ones(3), np.ones(3)) == (1.0, 1.0)


def test_off_scale_runs_get_the_error_of_analogous_held_out_groups() -> None:
    # Calibrated at TPP 20/80/200, held out one at a time: 80 was an interpolation (0.92 in
    # log from 200), 20 and 200 extrapolations. A sweep at TPP 40 (inside, 0.69 away) gets the
    # TPP-80 group's scale; one at TPP 400 (outside, 0.69 away) the extrapolations' (the larger
    # of those at least as far); one at TPP 2000 (2.3 away) the farthest extrapolation measured.
    from predictors.ranking import HeldOutGroup, Position

    def k(v: float) -> KindError:
        return KindError((0.3,), (v,), (v,), (10,), (2,))

    groups = (HeldOutGroup(20.0, Position("tokens_per_param", False, 1.386), {"lambda": k(0.09)}),
              HeldOutGroup(80.0, Position("tokens_per_param", True, 0.916), {"lambda": k(0.03)}),
              HeldOutGroup(200.0, Position("tokens_per_param", False, 0.916), {"lambda": k(0.05)}))
    table = RankingError({"lambda": k(0.01)}, {"lambda": k(0.09)}, cross_groups=groups)
    assert table.order_at(0.3, "lambda").scale == 0.01  # at a calibrated TPP
    inside = Position.of(40.0, [20, 80, 200], "tokens_per_param")
    assert inside.inside and inside.distance == pytest.approx(np.log(2))
    order = table.order_at(0.3, "lambda", [inside])
    assert order.scale == 0.03 and "80 held out" in order.words
    assert table.order_at(0.3, "lambda", [Position.of(400.0, [20, 80, 200], "tokens_per_param")]).scale == 0.09
    assert table.order_at(0.3, "lambda", [Position("tokens_per_param", False, 2.3)]).scale == 0.09
    assert Position.of(21.0, [20, 80], "tokens_per_param") is None  # within 10%: at the calibrated scale
    back = RankingError.from_dict(table.to_dict())
    assert back.cross_groups == table.cross_groups


def test_beyond_the_range_a_sweep_is_judged_by_the_groups_held_out_on_its_side() -> None:
    # Issue 28: TPP 20 held out (below 80/200) ordered well, TPP 200 (above 20/80) badly. A
    # sweep at TPP 15 (below, 0.29 away) extrapolates down: it gets the TPP-20 group's scale,
    # not TPP 200's; a file that records no side matches either (the larger); a sweep above
    # gets TPP 200's.
    from predictors.ranking import HeldOutGroup, Position

    def k(v: float) -> KindError:
        return KindError((0.3,), (v,), (v,), (10,), (2,))

    below = Position.of(20.0, [80, 200], "tokens_per_param")
    above = Position.of(200.0, [20, 80], "tokens_per_param")
    assert (below.direction, above.direction) == ("below", "above")
    groups = (HeldOutGroup(20.0, below, {"lambda": k(0.02)}), HeldOutGroup(200.0, above, {"lambda": k(0.20)}))
    table = RankingError({"lambda": k(0.01)}, cross_groups=groups)
    sweep = Position.of(15.0, [20, 80, 200], "tokens_per_param")
    assert table.order_at(0.3, "lambda", [sweep]).scale == 0.02
    assert table.order_at(0.3, "lambda", [Position.of(400.0, [20, 80, 200], "tokens_per_param")]).scale == 0.20
    unsided = RankingError.from_dict({**table.to_dict(), "cross_groups": [
        {key: v for key, v in g.to_dict().items() if key != "direction"} for g in groups]})
    assert unsided.order_at(0.3, "lambda", [sweep]).scale == 0.20
    assert RankingError.from_dict(table.to_dict()).cross_groups == table.cross_groups


def test_a_sweep_at_a_size_calibrated_without_sweeps_is_judged_off_in_size() -> None:
    # Issue 28: a width ladder makes 0.39M a calibrated size, but the order was only measured on
    # sweeps at 0.1M. A sweep at 0.39M gets the order error held out above 0.1M in size (a λ
    # sweep there ordered at 20%), not the in-scale 1%; at 0.1M, and in a file without swept
    # sizes, nothing changes.
    from predictors.ranking import HeldOutGroup, Position

    def k(v: float) -> KindError:
        return KindError((0.3,), (v,), (v,), (10,), (2,))

    above = Position.of(3.9e5, [1e5], "n_params")
    table = RankingError({"lambda": k(0.01)}, cross_groups=(HeldOutGroup(3.9e5, above, {"lambda": k(0.20)}),),
                         swept_sizes=(1e5,))
    ladder_calibrated: list[Position] = []  # what the predictor's positions say at 0.39M
    assert table.order_at(0.3, "lambda", table.sized(ladder_calibrated, [3.9e5])).scale == 0.20
    assert table.order_at(0.3, "lambda", table.sized([], [1e5])).scale == 0.01
    old = RankingError.from_dict({key: v for key, v in table.to_dict().items() if key != "swept_sizes"})
    assert old.sized([], [3.9e5]) == [] and RankingError.from_dict(table.to_dict()) == table


def test_probability_best_follows_the_gap_and_the_scale() -> None:
    # Equal predictions: a coin flip; a gap of 2σ_pair: the leader is best ~92% of the time.
    assert probability_best([0.0, 0.0], [0.01, 0.01]) == pytest.approx([0.5, 0.5], abs=0.01)
    sigma_pair = 0.01
    p = probability_best([0.0, 2 * sigma_pair], [sigma_pair / math.sqrt(2)] * 2)
    assert p[0] == pytest.approx(0.977, abs=0.005) and sum(p) == pytest.approx(1.0)
    many = probability_best(list(np.linspace(0, 0.05, 6)), [0.01] * 6)
    assert many[0] == max(many) and many == sorted(many, reverse=True)
