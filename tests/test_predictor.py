"""Predictor persistence (JSON, never pickle): round trip, schema, and clear errors on bad files."""

import dataclasses
import math
import json

import numpy as np
import pytest

from predictors import AlignSettings, Controls, Curve, DecisionError, Predictor, SurrogateParams, fit
from predictors.curves import compute_fraction
from predictors.prediction import predict_at_rung
from predictors.predictor import SCHEMA_VERSION
from predictors.schedules import Schedule

PRED = Predictor(
    SurrogateParams(0.31, -0.27, 1.9, -0.21, m=0.14),
    m_fitted=True,
    align=AlignSettings("l2", 0.6, 0.01, 4),
    decision_error=DecisionError((0.1, 0.2, 0.3, 0.5), (0.03, 0.012, 0.008, 0.004), bias=(0.01, 0, 0, 0)),
    provenance={"n_curves": 3, "tau_range": [0.05, 0.8], "corpus_hash": "deadbeef", "arr": np.arange(2)},
)
CTRL = Controls(0.11, 40.0, Schedule("wsd", warmup_fraction=0.05, decay_fraction=0.3))
T = np.linspace(0.001, 0.3, 300)
Y = 2.2 * PRED.normalized_curve(T, CTRL) * (1 + 0.003 * np.sin(40 * T))


def test_round_trip_predicts_identically(tmp_path):
    # load(save(p)) has the same parameters, settings and table, and gives bit-identical predictions.
    path = PRED.save(tmp_path / "sub" / "p.json")
    back = Predictor.load(path)
    assert back.params == PRED.params and back.align == PRED.align and back.m_fitted
    assert back.decision_error == PRED.decision_error
    assert back.predict_final(T, Y, CTRL) == PRED.predict_final(T, Y, CTRL)
    np.testing.assert_array_equal(back.normalized_curve(T, CTRL), PRED.normalized_curve(T, CTRL))
    assert back.provenance["arr"] == [0, 1] and back.provenance["corpus_hash"] == "deadbeef"


def test_file_is_plain_json_with_schema_fields(tmp_path):
    # The file is JSON (no pickle) carrying the schema version, parameters, m-flag, alignment and table.
    path = PRED.save(tmp_path / "p.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "collapse-hpo/predictor" and doc["schema_version"] == SCHEMA_VERSION
    assert set(doc["params"]) == {"b_const", "b_exp", "q_const", "q_exp", "m", "eps1", "eps2", "irreducible_loss",
                                 "m_size_exp", "size_ref", "m_fitted"}
    assert doc["params"]["m_fitted"] is True
    assert doc["alignment"] == {"objective": "l2", "start_ratio": 0.6, "min_start": 0.01, "min_points": 4}
    assert doc["decision_error"]["rel_error"] == [0.03, 0.012, 0.008, 0.004]


def test_fitted_predictor_saves_provenance(tmp_path):
    # A fitted predictor's file records the curves, controls, corpus hash, MAEs, date and version.
    t = np.linspace(0.0, 1.0, 200)
    curves = [
        Curve(t, 2.0 * PRED.normalized_curve(t, Controls(tau, 20.0)), Controls(tau, 20.0),
              {"n_params": 98_000, "corpus_hash": "h1"})
        for tau in (0.05, 0.2, 0.8)
    ]
    r = fit(curves, provenance={"model_family": "tiny"})
    back = Predictor.load(r.predictor.save(tmp_path / "fitted.json"))
    prov = back.provenance
    for key in ("n_curves", "model_sizes", "tokens_per_param", "tau_range", "schedules", "corpus_hash",
                "fit_mae", "oracle_mae", "date", "package_version"):
        assert key in prov, key
    assert prov["model_family"] == "tiny" and prov["corpus_hash"] == "h1" and prov["model_sizes"] == [98_000]
    assert back.decision_error is not None and back.decision_error.n_curves == 3


def _mutate(tmp_path, fn):
    doc = PRED.to_dict()
    fn(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["params"].pop("b_exp"), "params.b_exp"),
        (lambda d: d["params"].update(q_const="2.0"), "params.q_const"),
        (lambda d: d["params"].update(eps1=-1e-3), "params.eps1"),
        (lambda d: d["params"].update(m_fitted="yes"), "params.m_fitted"),
        (lambda d: d["alignment"].update(objective="l3"), "alignment.objective"),
        (lambda d: d["alignment"].update(min_points=0), "alignment.min_points"),
        (lambda d: d.update(schema_version=5), "schema_version"),
        (lambda d: d.update(schema="other"), "schema"),
        (lambda d: d.pop("alignment"), "alignment"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["decision_error"].update(rel_error=[0.1, -0.1, 0.1, 0.1]), "decision_error.rel_error"),
        (lambda d: d["decision_error"].update(stop_fractions=[0.3, 0.2, 0.1, 0.5]), "decision_error.stop_fractions"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path, mutate, field):
    # A missing field, wrong type, out-of-range value or unknown schema gives a ValueError naming both.
    path = _mutate(tmp_path, mutate)
    with pytest.raises(ValueError) as err:
        Predictor.load(path)
    assert str(path) in str(err.value) and f"'{field}'" in str(err.value)


def test_nan_in_file_is_rejected(tmp_path):
    # NaN/Infinity literals in the JSON are rejected with the file name.
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(PRED.to_dict()).replace('"b_exp": -0.27', '"b_exp": NaN'))
    with pytest.raises(ValueError, match="NaN") as err:
        Predictor.load(path)
    assert str(path) in str(err.value)


def test_not_json_and_missing_file(tmp_path):
    # Garbage is a ValueError naming the file; a missing file is FileNotFoundError.
    path = tmp_path / "garbage.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Predictor.load(path)
    with pytest.raises(FileNotFoundError):
        Predictor.load(tmp_path / "absent.json")


def test_save_refuses_nan_parameters():
    # A predictor cannot even be built with NaN parameters, so a NaN never reaches the file.
    with pytest.raises(ValueError, match="b_exp"):
        SurrogateParams(0.3, float("nan"), 2.0, -0.2)


# ------------------------------------------------------- scale-dependent uncertainty (issue 10)

CROSS = Predictor(
    SurrogateParams(0.31, -0.27, 1.9, -0.21, m=0.14),
    decision_error=DecisionError((0.1, 0.3), (0.02, 0.01), source="leave-one-out",
                                 cross_scale=(0.07, 0.05), cross_scale_source="leave-one-TPP-out (3 groups)"),
    provenance={"tokens_per_param": [20.0, 80.0], "model_sizes": [100672]},
)


@pytest.mark.parametrize(
    "controls, expected, words",
    [
        (Controls(0.3, 20.0, n_params=100672), 0.02, "leave-one-out"),
        (Controls(0.3, 84.0), 0.02, "N not reported"),  # within 10% of TPP 80; N unknown
        (Controls(0.3, 40.0, n_params=100672), 0.07, "TPP 40 is not a calibrated TPP"),
        (Controls(0.3, 20.0, n_params=620320), 0.07, "not a calibrated model size"),
    ],
)
def test_relative_error_uses_the_cross_scale_error_away_from_the_calibrated_scale(controls, expected, words):
    # A run at a calibrated TPP and size gets the in-scale e(s); another TPP or model size gets
    # the (larger) cross-scale error, and the prediction's uncertainty and source follow it.
    error, source = CROSS.relative_error(0.1, controls)
    assert error == pytest.approx(expected) and words in source
    pred = CROSS.predict_final(T[:100], Y[:100], controls)
    assert pred.uncertainty >= pred.final_loss * expected
    assert words in pred.error_source


def test_off_scale_run_without_a_cross_scale_table_keeps_the_in_scale_error_and_says_so():
    error, source = PRED.relative_error(0.1, Controls(0.3, 40.0))
    assert error == pytest.approx(0.03)
    assert Predictor(PRED.params).relative_error(0.1, CTRL) == (0.0, "uncalibrated")
    off = Predictor(PRED.params, decision_error=PRED.decision_error, provenance={"tokens_per_param": [20.0]})
    assert "no cross-scale error was measured" in off.relative_error(0.1, Controls(0.3, 40.0))[1]


def test_version_1_files_still_load(tmp_path):
    # A predictor written before schema 2 (no irreducible_loss, no cross_scale) loads unchanged.
    doc = CROSS.to_dict()
    doc["schema_version"] = 1
    del doc["params"]["irreducible_loss"]
    del doc["decision_error"]["cross_scale"], doc["decision_error"]["cross_scale_source"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    back = Predictor.load(path)
    assert back.params.irreducible_loss == 0.0 and back.decision_error.cross_scale is None
    assert Predictor.load(CROSS.save(tmp_path / "v2.json")).decision_error == CROSS.decision_error


def test_shipped_predictor_states_a_larger_error_off_its_scale():
    # The shipped default carries a measured cross-scale error, larger than the in-scale one.
    shipped = Predictor.load("hpo/data/predictors/default.json")
    table = shipped.decision_error
    assert table.cross_scale is not None and "TPP" in table.cross_scale_source
    assert all(c > e for c, e in zip(table.cross_scale, table.rel_error))
    # Off its TPPs (40 lies between 20 and 80) the error of the held-out TPP groups applies,
    # larger than the in-scale one; the shipped file also carries its ranking orders and seed noise.
    error, words = shipped.relative_error(0.1, Controls(0.3, 40.0, n_params=100672))
    assert error > table.at(0.1) and "tokens_per_param" in words
    assert shipped.seed_noise is not None and 0 < shipped.seed_noise < 0.05
    assert all(k.weight is not None for k in shipped.ranking_error.kinds.values())


def test_ranking_error_round_trips_and_sets_the_ranking_scale(tmp_path):
    # A predictor carrying a ranking error saves it (schema 3) and states, per kind of sweep,
    # the measured scale; an unmeasured kind falls back to the largest measured one, a
    # predictor without one to √2·e(s), an uncalibrated one to 0.
    from predictors.ranking import KindError, RankingError

    table = RankingError({"lambda": KindError((0.1, 0.3), (0.04, 0.02), (0.05, 0.03), (30, 30), (5, 5)),
                          "eta_fixed_tau": KindError((0.1, 0.3), (0.01, 0.005), (0.02, 0.01), (9, 9), (3, 3))})
    pred = dataclasses.replace(PRED, ranking_error=table)
    back = Predictor.load(pred.save(tmp_path / "p.json"))
    assert back.ranking_error.kinds["lambda"] == table.kinds["lambda"]
    assert back.ranking_scale(0.3, "eta_fixed_tau")[0] == pytest.approx(0.005)
    sigma, words = back.ranking_scale(0.3, "batch_fixed_tau")
    assert sigma == pytest.approx(0.02) and "no batch_fixed_tau sweeps" in words
    assert back.ranking_scale(0.3, "fixed_tau")[0] == pytest.approx(0.005)  # its only measured member
    assert back.ranking_scale(0.3, "mixed")[0] == pytest.approx(0.02)  # the largest of all kinds
    assert PRED.ranking_scale(0.1, "lambda")[0] == pytest.approx(math.sqrt(2) * PRED.decision_error.at(0.1))
    assert Predictor(PRED.params).ranking_scale(0.1, "lambda")[0] == 0.0


def test_repeated_predictions_equal_a_fresh_predictors_and_still_warn():
    # predict_final memoises ℓ̂, η and the calibrated error (issue 30): a sweep's second,
    # third … prediction for the same controls and grid gives exactly what a fresh predictor
    # computes, the returned curves stay the caller's to change, and the missing-N warning
    # still fires on a predictor that has only ever answered from its memo.
    shipped = Predictor.load("hpo/data/predictors/default.json")
    ctrl = Controls(0.3, 40.0)
    with pytest.warns(UserWarning, match="n_params"):
        first = [shipped.predict_final(T[:k], Y[:k], ctrl) for k in (100, 200, 100, 200)]
    fresh = Predictor.load("hpo/data/predictors/default.json")
    with pytest.warns(UserWarning, match="n_params"):
        again = [fresh.predict_final(T[:k], Y[:k], ctrl) for k in (100, 200)]
    assert first[:2] == again and first[2:] == again
    assert shipped.relative_error(0.2, ctrl) == fresh.relative_error(0.2, ctrl)
    curve = shipped.normalized_curve(T[:100], ctrl)
    curve[0] = -1.0  # the caller's copy, not the memo's
    assert shipped.predict_final(T[:100], Y[:100], ctrl) == again[0]
    copied = dataclasses.replace(shipped)  # a fresh memo per predictor object
    with pytest.warns(UserWarning, match="n_params"):
        assert copied.predict_final(T[:200], Y[:200], ctrl) == again[1]


# Asserts: a rung's trials predicted in one batched call get, each, what the single-run
# alignment on the same segment gives (an independent code path: the explicit segment), curves
# of different lengths and controls mixed; a bad run gets predict_final's own error and does not
# fail the others.
@pytest.mark.filterwarnings("ignore:predictor. a run reports no n_params")
def test_predict_finals_of_a_batch_match_each_run_predicted_alone():
    shipped = Predictor.load(_shipped_path())
    rng = np.random.default_rng(3)
    ts, ys, cs = [], [], []
    for n, tau, n_params in [(12, 0.2, None), (40, 0.9, 1e5), (5, 0.05, 3e5), (25, 0.4, None), (3, 0.7, 1e5),
                             (30, 1.6, 2.4e4), (8, 0.3, 1e5), (17, 0.1, None), (60, 0.45, 6e5)]:
        t = np.sort(rng.uniform(0.02, 0.35, n))
        c = Controls(tau, 20.0, n_params=n_params)
        ts.append(t)
        ys.append(1.8 * shipped.normalized_curve(t, c) * (1 + 0.01 * rng.standard_normal(n)))
        cs.append(c)
    ts.append(ts[0])
    ys.append(np.r_[ys[0][:-1], np.nan])  # a diverged run in the same batch
    cs.append(cs[0])
    batch = shipped.predict_finals(ts, ys, cs)
    assert isinstance(batch[-1], ValueError) and "non-finite" in str(batch[-1])
    settings = shipped.align
    for t, y, c, got in zip(ts[:-1], ys[:-1], cs[:-1], batch[:-1]):
        start = max(settings.min_start, settings.start_ratio * t[-1])
        if np.sum(t >= start) < settings.min_points:
            start = t[-settings.min_points]  # the segment reaches back to min_points points
        alone = shipped.predict_final(t, y, c, segment=(start, float(t[-1])))
        assert got.final_loss == pytest.approx(alone.final_loss, rel=1e-12)
        assert got.uncertainty == pytest.approx(alone.uncertainty, rel=1e-12)
        assert (got.n_points, got.error_source, got.curve_source) == (alone.n_points, alone.error_source,
                                                                      alone.curve_source)
    # Without the calibrated error: the same finals, the residual alone as uncertainty, said so;
    # and so for a batch too small to pad (run by run).
    for rows in (slice(0, -1), slice(0, 3)):
        bare = shipped.predict_finals(ts[rows], ys[rows], cs[rows], calibrated_error=False)
        assert [b.final_loss for b in bare] == pytest.approx([g.final_loss for g in batch[rows]], rel=1e-12)
        assert all(b.uncertainty == pytest.approx(b.final_loss * b.residual) and "not computed" in b.error_source
                   for b in bare)


def _shipped_path():
    from hpo.data import default_predictor_path

    return default_predictor_path()


def test_compute_fraction_is_token_weighted_and_counts_redone_work() -> None:
    assert compute_fraction({"a": 1.0, "b": 0.1}) == pytest.approx(0.55)
    assert compute_fraction({"a": 1.0, "b": 0.1}, {"a": 3.0, "b": 1.0}) == pytest.approx(3.1 / 4)
    # A trial restarted from scratch after 0.3 (no checkpoint) trained 0.3 twice.
    assert compute_fraction({"a": 1.0}, extra={"a": 0.3}) == pytest.approx(1.3)
    assert compute_fraction({"a": 1.2, "b": -0.1}) == pytest.approx(0.5)  # clipped to [0, 1]


def test_the_cut_is_the_same_in_the_fit_error_and_at_the_rung() -> None:
    # fit() measures e(s) on Curve.head(s); the scheduler predicts from rung_cut: both keep the
    # points up to and including the first at or past s.
    from predictors import Controls, Curve
    from predictors.curves import rung_cut

    t = np.array([0.05, 0.08, 0.11, 0.14, 0.2, 0.31, 1.0])
    curve = Curve(t, 2.0 + (1 - t), Controls(0.3, 20.0))
    for s in (0.1, 0.2, 0.3):
        head_t, _ = curve.head(s)
        pred = predict_at_rung(None, t, curve.loss, None, s)
        assert head_t.size == rung_cut(t, s) == pred.n_points
        assert head_t[-1] >= s - 1e-9 and (head_t.size == 1 or head_t[-2] < s)
