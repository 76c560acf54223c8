"""Fitting the surrogate (predictors/fit.py): recovery, oracle floor, five-parameter mode, errors."""

import numpy as np
import pytest

from predictors import Controls, Curve, FitResult, SurrogateParams, fit, normalized_surrogate
from predictors.schedules import Schedule

TRUE = SurrogateParams(0.3, -0.3, 2.0, -0.2)
TAUS = np.geomspace(0.02, 1.0, 6)
TPPS = (20.0, 80.0, 320.0)


def make_curves(params, *, noise=0.0, seed=0, n_points=500, taus=TAUS, tpps=TPPS, schedule="linear"):
    rng = np.random.default_rng(seed)
    t = np.linspace(0.002, 1.0, n_points)
    curves = []
    for tpp in tpps:
        for tau in taus:
            c = Controls(float(tau), float(tpp), Schedule(schedule))
            y = 2.5 * normalized_surrogate(t, c, params) * (1.0 + rng.normal(0.0, noise, t.size))
            curves.append(Curve(t, y, c, {"n_params": 1e5, "corpus_hash": "abc"}))
    return curves


def grid_mae(curves, params, t_min=0.2, grid_points=200):
    """Macro MAE of the true parameters on the fit's grid (the noise floor of the objective)."""
    grid = np.linspace(t_min, 1.0, grid_points)
    maes = [
        np.mean(np.abs(np.interp(grid, c.t_hat, c.normalized) - normalized_surrogate(grid, c.controls, params)))
        for c in curves
    ]
    return float(np.mean(maes))


def test_fit_recovers_parameters_from_noiseless_curves():
    # On noiseless surrogate curves the fit returns the generating parameters and ~0 MAE.
    r = fit(make_curves(TRUE))
    p = r.predictor.params
    np.testing.assert_allclose([p.b_const, p.b_exp, p.q_const, p.q_exp], [0.3, -0.3, 2.0, -0.2], rtol=1e-3, atol=1e-4)
    assert r.fit_mae < 1e-5
    assert isinstance(r, FitResult) and not r.predictor.m_fitted


def test_fit_on_noisy_curves_reaches_the_noise_floor():
    # With 0.5% noise the fit MAE is no worse than the true parameters' MAE, and parameters are close.
    curves = make_curves(TRUE, noise=0.005, seed=1)
    r = fit(curves)
    floor = grid_mae(curves, TRUE)
    assert r.fit_mae <= floor + 1e-5
    p = r.predictor.params
    np.testing.assert_allclose([p.b_const, p.q_const], [0.3, 2.0], rtol=0.15)
    np.testing.assert_allclose([p.b_exp, p.q_exp], [-0.3, -0.2], atol=0.05)


def test_oracle_never_exceeds_fit_per_curve():
    # The per-curve oracle MAE is ≤ the fit MAE for every curve, even when the model is misspecified.
    truth = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.15)
    curves = make_curves(truth, noise=0.003, seed=2, n_points=300)
    curves += make_curves(TRUE, noise=0.003, seed=3, n_points=300, schedule="cosine")
    r = fit(curves)
    assert np.all(r.oracle_curve_mae <= r.curve_mae)
    assert r.oracle_mae <= r.fit_mae
    assert r.oracle_b.shape == r.oracle_q.shape == (len(curves),)
    assert np.all(r.oracle_b > 0) and np.all(r.oracle_q > 0)


def test_five_parameter_mode_recovers_m():
    # fit_m=True fits the exponent m of the power-law term (true m = 0.15) and flags it.
    truth = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.15)
    r = fit(make_curves(truth, noise=0.002, seed=4), fit_m=True)
    assert r.predictor.m_fitted
    assert r.predictor.params.m == pytest.approx(0.15, rel=0.05)
    fixed = fit(make_curves(truth, noise=0.002, seed=4))
    assert fixed.predictor.params.m == 0.05 and r.fit_mae < fixed.fit_mae


def test_unidentifiable_exponents_are_fixed_to_zero():
    # With one τ (one TPP) b_exp (q_exp) is fixed to 0 and recorded in the provenance.
    r = fit(make_curves(TRUE, taus=[0.2], tpps=[20.0, 80.0]))
    assert r.predictor.params.b_exp == 0.0
    assert r.predictor.provenance["b_exp_fixed"] and not r.predictor.provenance["q_exp_fixed"]
    r = fit(make_curves(TRUE, tpps=[20.0]))
    assert r.predictor.params.q_exp == 0.0


def test_fit_fills_decision_error_and_provenance():
    # fit() measures the final-loss error at s = 0.1…0.5 and merges user provenance under computed metrics.
    curves = make_curves(TRUE, noise=0.003, seed=5)
    r = fit(curves, provenance={"corpus_hash": "override", "fit_mae": -1, "note": "x"})
    de = r.predictor.decision_error
    assert de is not None and de.stop_fractions == (0.1, 0.2, 0.3, 0.5)
    assert all(0 <= e < 0.05 for e in de.rel_error) and de.n_curves == len(curves)
    prov = r.predictor.provenance
    assert prov["corpus_hash"] == "override" and prov["note"] == "x"
    assert prov["fit_mae"] == r.fit_mae and prov["oracle_mae"] == r.oracle_mae
    assert prov["n_curves"] == len(curves) and prov["tokens_per_param"] == list(TPPS)
    assert prov["tau_range"] == [pytest.approx(0.02), pytest.approx(1.0)]
    assert prov["schedules"] == ["linear"] and prov["model_sizes"] == [1e5]
    assert set(r.decision_rel_errors) == {0.1, 0.2, 0.3, 0.5}


def test_curves_ending_just_before_one_are_normalised_at_their_last_point():
    # A log that ends at t̂ = 0.995 is compared with ℓ̂/ℓ̂(0.995), so the parameters are still recovered.
    t = np.linspace(0.002, 0.995, 400)
    curves = [
        Curve(t, 2.0 * normalized_surrogate(t, Controls(float(tau), tpp), TRUE), Controls(float(tau), tpp))
        for tau in TAUS
        for tpp in TPPS
    ]
    p = fit(curves).predictor.params
    np.testing.assert_allclose([p.b_const, p.b_exp, p.q_const, p.q_exp], [0.3, -0.3, 2.0, -0.2], rtol=1e-3, atol=1e-4)


def test_fit_rejects_bad_input():
    # Empty input, curves not covering the window or not ending at t̂ ≈ 1, and bad windows are ValueErrors.
    with pytest.raises(ValueError, match="no curves"):
        fit([])
    short = Curve(np.linspace(0.0, 0.8, 50), np.linspace(3, 2, 50), Controls(0.2, 20.0))
    with pytest.raises(ValueError, match="fit window|t̂ ≥"):
        fit([short])
    late = Curve(np.linspace(0.5, 1.0, 50), np.linspace(3, 2, 50), Controls(0.2, 20.0))
    with pytest.raises(ValueError, match="fit window"):
        fit([late])
    with pytest.raises(ValueError, match="t_min"):
        fit(make_curves(TRUE, taus=[0.2], tpps=[20.0]), t_min=0.9, t_max=0.5)
    with pytest.raises(ValueError, match="Curve"):
        fit([(np.array([0.0, 1.0]), np.array([2.0, 1.0]))])  # type: ignore[list-item]


def test_score_curves_reproduces_the_fit_and_scores_held_out_curves():
    # Scoring a fitted predictor on its own curves gives the fit's per-curve and oracle MAEs;
    # on held-out curves from another family the MAE grows and the oracle stays below it.
    from predictors import score_curves

    curves = make_curves(TRUE, noise=0.003, seed=4, n_points=300)
    r = fit(curves)
    scores = score_curves(r.predictor, curves)
    np.testing.assert_allclose(scores.curve_mae, r.curve_mae, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(scores.oracle_curve_mae, r.oracle_curve_mae, rtol=1e-9, atol=1e-12)
    other = make_curves(SurrogateParams(0.5, -0.1, 1.0, -0.1), seed=5, n_points=300)
    held_out = score_curves(r.predictor, other)
    assert held_out.curve_mae.mean() > 5 * scores.curve_mae.mean()
    assert np.all(held_out.oracle_curve_mae <= held_out.curve_mae + 1e-12)
    with pytest.raises(ValueError, match="no curves"):
        score_curves(r.predictor, [])


def test_score_curves_scores_the_reference_curves_a_predictor_draws():
    # In reference-curve mode the predictor draws the calibrated runs' own normalised curves,
    # so curves of a family the surrogate misses score near zero there, not the surrogate's MAE;
    # the oracle (the surrogate shape, b and q free per curve) is the same yardstick in both modes.
    import dataclasses

    from predictors import score_curves
    from predictors.references import ReferenceCurves

    r = fit(make_curves(TRUE, noise=0.003, seed=4, n_points=300))
    other = make_curves(SurrogateParams(0.5, -0.1, 1.0, -0.1), seed=5, n_points=300)
    surrogate = score_curves(r.predictor, other)
    with_refs = dataclasses.replace(r.predictor, references=ReferenceCurves.from_curves(other))
    drawn = score_curves(with_refs, other)
    assert drawn.curve_mae.mean() < 0.05 * surrogate.curve_mae.mean()
    np.testing.assert_allclose(drawn.oracle_curve_mae, surrogate.oracle_curve_mae)


# ----------------------------------------------------------------- degenerate banks (issue 10)


def _finite_predictor(r) -> None:
    """Every parameter finite and inside the fit's box, and predictions finite at wild controls."""
    from predictors.fit import FitBounds

    p, bounds = r.predictor.params, FitBounds()
    assert all(np.isfinite([p.b_const, p.b_exp, p.q_const, p.q_exp, p.m, p.irreducible_loss]))
    assert bounds.b_const[0] <= p.b_const <= bounds.b_const[1] and bounds.b_exp[0] <= p.b_exp <= bounds.b_exp[1]
    assert bounds.q_const[0] <= p.q_const <= bounds.q_const[1] and bounds.q_exp[0] <= p.q_exp <= bounds.q_exp[1]
    assert bounds.m[0] <= p.m <= bounds.m[1]
    assert np.isfinite(r.fit_mae) and np.isfinite(r.oracle_mae)
    t = np.linspace(0.01, 0.3, 40)
    for tau, tpp in ((0.2, 20.0), (1e-4, 1e6), (1e3, 0.5)):
        c = Controls(tau, tpp)
        ell = r.predictor.normalized_curve(t, c)
        assert np.all(np.isfinite(ell)) and np.all(ell > 0)
        pred = r.predictor.predict_final(t, 2.0 * ell, c)
        assert np.isfinite(pred.final_loss) and np.isfinite(pred.uncertainty)


@pytest.mark.parametrize("fit_m", [False, True])
def test_one_tpp_bank_fixes_q_exp_and_says_so(fit_m):
    # A bank of one TPP cannot identify q_exp: it is fixed at 0, noted in the fit log and in the
    # predictor's provenance, and the fit (m free or not) stays finite.
    truth = SurrogateParams(0.3, -0.3, 2.0, 0.0, m=0.15)
    r = fit(make_curves(truth, noise=0.004, seed=7, tpps=[20.0]), fit_m=fit_m, t_min=0.05)
    _finite_predictor(r)
    assert r.predictor.params.q_exp == 0.0
    assert "q_exp" in r.predictor.provenance["fixed_parameters"]
    assert any("q_exp not identifiable" in n for n in r.notes)
    assert r.predictor.provenance["fit_notes"] == list(r.notes)


def test_two_nearly_equal_tpps_do_not_blow_up_q_exp():
    # TPP 20 and 20.5 (a 2.5% lever arm): q_exp is not fitted (it used to run to ~1e2 and
    # overflow), the predictor is finite and its JSON round-trips.
    curves = make_curves(TRUE, noise=0.004, seed=8, tpps=[20.0, 20.5])
    r = fit(curves, fit_m=True, t_min=0.05)
    _finite_predictor(r)
    assert r.predictor.params.q_exp == 0.0 and "q_exp" in r.predictor.provenance["fixed_parameters"]
    from predictors import Predictor

    assert Predictor.from_dict(r.predictor.to_dict()).params == r.predictor.params


def test_two_curves_give_a_finite_predictor():
    # The smallest bank: two curves at one TPP and two τ.
    r = fit(make_curves(TRUE, noise=0.003, seed=9, taus=[0.1, 0.4], tpps=[80.0]), fit_m=True)
    _finite_predictor(r)
    assert r.predictor.decision_error is not None


def test_constant_lr_bank_fixes_q_and_says_why():
    # With a constant LR over the fit window only b·(1+ε2)^q is seen: q is fixed at 1
    # (q_const = 1, q_exp = 0) and the note names the constant schedule.
    r = fit(make_curves(TRUE, noise=0.003, seed=10, schedule="constant"), fit_m=True, t_min=0.2)
    _finite_predictor(r)
    p = r.predictor.params
    assert (p.q_const, p.q_exp) == (1.0, 0.0)
    assert "constant" in r.predictor.provenance["fixed_parameters"]["q_const"]
    assert any("q_const not identifiable" in n for n in r.notes)


def test_parameters_stay_inside_their_bounds_when_the_data_want_more():
    # Curves whose early phase is far steeper than the surrogate can follow drive q_const to
    # its upper bound and (with a narrow m box) m to its lower one: both stop there, finitely,
    # and the fit log names each bound that was hit.
    from predictors.fit import FitBounds

    t = np.linspace(0.002, 1.0, 300)
    curves = [Curve(t, 1.0 + 5.0 * (1.0 - t) ** 8 + 0.01 * np.sin(40 * t) ** 2, Controls(tau, tpp))
              for tau in (0.1, 0.4) for tpp in (20.0, 80.0)]
    r = fit(curves, fit_m=True, t_min=0.05, bounds=FitBounds(m=(0.005, 0.05)))
    p = r.predictor.params
    assert np.isfinite(r.fit_mae) and 0.005 <= p.m <= 0.05 and p.q_const <= 10.0
    assert any(n.startswith("m = ") and "on its bound" in n for n in r.notes)


# ---------------------------------------------------------------- irreducible loss (issue 10)


def _offset_curves(params, l0: float, finals=(1.6, 1.9), noise=0.0, seed=0):
    """Curves whose reducible loss follows the surrogate: L = L̂ + (L(1) − L̂)·ℓ̂."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.002, 1.0, 400)
    out = []
    for k, tpp in enumerate(TPPS):
        for tau in TAUS:
            c = Controls(float(tau), float(tpp))
            final = finals[k % len(finals)]
            y = l0 + (final - l0) * normalized_surrogate(t, c, params)
            out.append(Curve(t, y * (1 + rng.normal(0, noise, t.size)), c))
    return out


def test_irreducible_loss_is_recovered_and_used_in_predictions():
    # Curves built with L̂ = 1.0: fitting L̂ recovers it and beats L̂ = 0; the predictor then
    # predicts the final loss of such a curve from its first 30% to within 0.5%, and refuses
    # a run whose loss is below L̂ with a named error.
    curves = _offset_curves(TRUE, 1.0)
    with_l0 = fit(curves, fit_irreducible=True, t_min=0.05)
    without = fit(curves, t_min=0.05)
    assert with_l0.predictor.params.irreducible_loss == pytest.approx(1.0, rel=0.02)
    assert with_l0.fit_mae < 0.5 * without.fit_mae
    assert with_l0.predictor.provenance["irreducible_loss_fitted"]
    c = curves[4]
    t, y = c.head(0.3)
    pred = with_l0.predictor.predict_final(t, y, c.controls)
    assert pred.final_loss == pytest.approx(c.final_loss, rel=0.005)
    curve = with_l0.predictor.predict_curve(t, y, c.controls, t_out=c.t_hat)
    np.testing.assert_allclose(curve, c.loss, rtol=0.01)
    with pytest.raises(ValueError, match="irreducible loss"):
        with_l0.predictor.predict_final(t, y - 0.9, c.controls)


def test_irreducible_loss_stays_zero_when_the_curves_have_none():
    # On curves with no offset the fitted L̂ stays near 0 and the fit is as good as without it.
    curves = make_curves(TRUE, noise=0.002, seed=11)
    r = fit(curves, fit_irreducible=True)
    assert r.predictor.params.irreducible_loss < 0.05
    assert r.fit_mae <= fit(curves).fit_mae + 1e-4
    with pytest.raises(ValueError, match="irreducible_loss"):
        fit(curves, irreducible_loss=10.0)
