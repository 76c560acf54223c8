"""Held-out errors (hpo/calibration/held_out.py): grouping across scales, the shipped error table, coverage."""

from __future__ import annotations

import numpy as np
import pytest

from hpo.calibration import held_out
from predictors import Controls, Curve, Predictor, SurrogateParams
from predictors.schedules import Schedule

TRUTH = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1, m=0.15))
T = np.linspace(0.01, 1.0, 200)


def _curves(tpps=(20.0, 80.0, 200.0), taus=(0.05, 0.2, 0.8), sizes=(1e5,), bend=0.0):
    """Surrogate curves; ``bend`` adds a TPP-dependent early excess the q(TPP) law cannot follow."""
    out = []
    for n in sizes:
        for tpp in tpps:
            for tau in taus:
                c = Controls(tau, tpp, Schedule("linear"), n_params=n)
                ell = TRUTH.normalized_curve(T, c) * (1 + bend * np.sin(np.log(tpp)) ** 2 * (1 - T) ** 2)
                out.append(Curve(T, 1.7 * ell, c, {"n_params": n, "name": f"{n:g}-{tpp:g}-{tau:g}"}))
    return out


def test_leave_one_out_error_small_on_surrogate_curves():
    # On noiseless curves drawn from the surrogate itself, held-out predictions are accurate
    # (< 1% at every decision fraction) and the table says it was measured leave-one-out.
    curves = _curves(tpps=(20.0, 80.0), taus=(0.05, 0.1, 0.2, 0.4, 0.8))
    loo = held_out.leave_one_out(curves, fit_kwargs={"t_min": 0.05, "fit_m": True})
    table = held_out.decision_error_table(loo)
    assert table.source == "leave-one-out"
    assert max(table.rel_error) < 0.01


def test_groups_of_merges_equal_values_and_skips_unknown():
    curves = _curves(tpps=(20.0, 20.1, 80.0), taus=(0.1,))
    assert held_out.groups_of(curves, held_out.SCALE_GROUPINGS["leave-one-TPP-out"]) == [[0, 1], [2]]
    assert held_out.groups_of(curves, lambda c: None) == []


def test_across_scales_holds_out_each_tpp_and_size_the_bank_has():
    # One size → only leave-one-TPP-out; two sizes → both groupings, each group predicted by a
    # refit that never saw it.
    fit_kwargs = {"t_min": 0.05, "fit_m": True}
    one = held_out.across_scales(_curves(taus=(0.2,)), fit_kwargs=fit_kwargs, fractions=(0.2,))
    assert [h.scheme for h in one] == ["leave-one-TPP-out"] and one[0].n_groups == 3
    two = held_out.across_scales(_curves(tpps=(20.0, 80.0), sizes=(1e5, 4e5)), fit_kwargs=fit_kwargs,
                                 fractions=(0.2,), extrapolate=False)
    assert [h.scheme for h in two] == ["leave-one-TPP-out", "leave-one-size-out", "leave-one-τ-out"]
    assert all(np.isfinite(h.predicted).all() for h in two)


def test_decision_error_table_ships_the_larger_cross_scale_error():
    # With a TPP effect the power law cannot follow, holding a TPP out costs more than holding
    # one curve out; the table keeps the leave-one-out RMS in-scale and the larger as cross_scale.
    curves = _curves(bend=0.08)
    kwargs = {"t_min": 0.05, "fit_m": True}
    fractions = (0.1, 0.3)
    loo = held_out.leave_one_out(curves, fit_kwargs=kwargs, fractions=fractions)
    cross = held_out.across_scales(curves, fit_kwargs=kwargs, fractions=fractions, schemes=["leave-one-TPP-out"],
                                   extrapolate=False)
    table = held_out.decision_error_table(loo, cross)
    assert table.source == "leave-one-out" and table.rel_error == pytest.approx(tuple(loo.rms()))
    assert table.cross_scale == pytest.approx(tuple(cross[0].rms()))
    assert table.cross_scale_source == "leave-one-TPP-out (3 groups)"
    assert all(c > e for c, e in zip(table.cross_scale, table.rel_error))


def test_coverage_counts_truths_inside_the_stated_interval():
    # Coverage by hand: σ = pred·sqrt(r² + e²); errors of 1%, 3%, 5% against e = 2% (r = 0).
    h = held_out.HeldOutPredictions("x", (0.1,), np.array([[1.01, 1.03, 1.05]]), np.zeros((1, 3)),
                                    np.ones(3), 3)
    assert h.coverage([0.02], 1.0) == [pytest.approx(1 / 3)]
    assert h.coverage([0.02], 2.0) == [pytest.approx(2 / 3)]
    assert h.coverage([0.06], 1.0) == [1.0]
    table = held_out.coverage_table(h, {"e": [0.02]})
    assert table == {"e": {"0.1": {"1σ": pytest.approx(1 / 3), "2σ": pytest.approx(2 / 3)}}}


def test_the_band_off_the_calibrated_sizes_is_the_methods_own_held_out_error():
    # Two size methods held out alike (the same folds), one 10x more accurate at every fold and
    # in-scale: each states the error its own folds measured, so its band is ~10x narrower.
    from predictors.distance import off_scale_error
    from predictors.ranking import Position

    fractions = (0.1, 0.3)
    sizes = (1e4, 1e5, 1e6)

    def held(scale: float):
        truth = np.ones(2 * len(sizes))
        groups = []
        for k, n in enumerate(sizes):
            seen = [m for m in sizes if m != n]
            err = scale * np.array([[0.04, -0.05], [0.02, -0.03]]) * (1 + k)
            predicted = 1.0 + err
            groups.append(held_out.GroupPredictions("leave-one-size-out", n, Position.of(n, seen, "n_params"),
                                                    (2 * k, 2 * k + 1), predicted, np.zeros_like(predicted),
                                                    truth[:2], tuple(seen)))
        loo_pred = 1.0 + scale * np.tile([[0.01, -0.01]], (2, len(sizes)))
        loo = held_out.HeldOutPredictions("leave-one-out", fractions, loo_pred, np.zeros_like(loo_pred), truth, 6)
        cross = held_out.HeldOutPredictions("leave-one-size-out", fractions, loo_pred, np.zeros_like(loo_pred),
                                            truth, len(sizes), tuple(groups))
        return held_out.decision_error_table(loo, [cross])

    coarse, fine = held(1.0), held(0.1)
    beyond = Position("n_params", False, 1.0, "above")
    for s in fractions:
        e_coarse, _, _ = off_scale_error(coarse.groups, coarse.stop_fractions, s, coarse.at(s), [beyond],
                                         {"n_params": "above"})
        e_fine, _, _ = off_scale_error(fine.groups, fine.stop_fractions, s, fine.at(s), [beyond],
                                       {"n_params": "above"})
        assert e_fine == pytest.approx(e_coarse / 10, rel=1e-6) and e_fine > fine.at(s)


def test_in_scale_error_leaves_out_runs_that_would_be_extrapolated():
    # One run per width: held out alone, the smallest and the largest are predicted beyond every
    # other size (extrapolations, measured across sizes), so the in-scale error is measured on
    # the interior widths only; a width with a second run is at the calibrated scale held out.
    kwargs = {"t_min": 0.05, "fit_m": True}
    ladder = _curves(tpps=(20.0,), taus=(0.2,), sizes=(1e4, 3e4, 1e5, 3e5))
    loo = held_out.leave_one_out(ladder, fit_kwargs=kwargs, fractions=(0.2,))
    assert [bool(np.isfinite(v)) for v in loo.predicted[0]] == [False, True, True, False]
    assert held_out.decision_error_table(loo).n_curves == 2
    replicated = ladder + _curves(tpps=(20.0,), taus=(0.2,), sizes=(1e4, 3e5))
    loo = held_out.leave_one_out(replicated, fit_kwargs=kwargs, fractions=(0.2,))
    assert np.isfinite(loo.predicted).all() and held_out.decision_error_table(loo).n_curves == 6
