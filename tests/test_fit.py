"""Fitting the surrogate (predictors/fit.py): recovery, oracle floor, five-parameter mode, errors."""

import numpy as np
import pytest

from predictors import Controls, Curve, FitResult, SurrogateParams, fit, normalized_surrogate
from trainers.schedules import Schedule

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
