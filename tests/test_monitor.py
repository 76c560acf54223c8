"""The collapse-residual monitor (predictors.monitor, paper §4): residual, band, detector."""

import dataclasses

import numpy as np
import pytest

from predictors import Controls, Curve, Predictor, SurrogateParams
from predictors.monitor import (
    BAND_GRID,
    MONITOR_WINDOW,
    DetectorRule,
    NoiseBand,
    alignment_window,
    calibrate_band,
    monitor_curve,
)
from predictors.schedules import Schedule

PRED = Predictor(SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.1))
C = Controls(0.2, 20.0, Schedule("linear", 0.1))
T = np.linspace(0.002, 1.0, 500)


def clean(seed: int, final: float = 2.0, noise: float = 0.002) -> np.ndarray:
    """A run on the predictor's shape with smooth multiplicative noise (a 2% trailing mean of
    per-point noise), like a smoothed training loss."""
    rng = np.random.default_rng(seed)
    raw = rng.normal(0.0, noise * np.sqrt(10), T.size)
    smooth = np.convolve(raw, np.ones(10) / 10, mode="same")
    return final * PRED.normalized_curve(T, C) * (1.0 + smooth)


BAND = calibrate_band([Curve(T, clean(s, final=1.5 + 0.1 * s), C) for s in range(20)], PRED, source="test")


def drift(y: np.ndarray, start: float, amount: float) -> np.ndarray:
    """+amount by the end of training, growing linearly from ``start``."""
    return y * (1.0 + amount * np.clip((T - start) / (1.0 - start), 0.0, 1.0))


def test_window_ends_before_the_faults_it_is_meant_to_catch():
    # The stated window: 0.15-0.30 after the trainer's 10% warmup; a longer warmup moves it later.
    assert MONITOR_WINDOW == (0.15, 0.30)
    assert alignment_window(0.1) == pytest.approx((0.15, 0.30))
    assert alignment_window(0.0) == (0.15, 0.30)
    assert alignment_window(0.25) == pytest.approx((0.30, 0.45))
    # A drift that starts where the window ends leaves L̂(T) untouched: the divisor is the run's
    # true final loss before the drift, and the residual at the drift start is ~0.
    y = clean(100)
    r = monitor_curve(T, drift(y, 0.30, 0.05), PRED, C, band=BAND)
    assert r.final_loss == pytest.approx(2.0, rel=0.005)
    assert abs(np.interp(0.3, r.t_hat, r.residual)) < 0.01


def test_clean_curves_do_not_alarm():
    for seed in range(100, 110):
        r = monitor_curve(T, clean(seed, final=1.7), PRED, C, band=BAND)
        assert r.status == "ok" and r.first_alarm is None, seed


@pytest.mark.parametrize("start", [0.3, 0.45, 0.6])
def test_a_drifted_copy_alarms_after_its_start(start):
    y = clean(200)
    r = monitor_curve(T, drift(y, start, 0.03), PRED, C, band=BAND)
    assert r.status == "alarm" and r.direction == "above"
    assert start < r.first_alarm < 1.0 and r.window[1] <= r.exceed_since < r.first_alarm
    # The raw loss still falls where the alarm is raised: the residual sees what the loss does not.
    i = int(np.searchsorted(T, r.first_alarm))
    drifted = drift(y, start, 0.03)
    assert drifted[i] < drifted[int(np.searchsorted(T, start))]


def test_a_loss_below_its_shape_is_not_a_fault():
    # One-sided: every fault the monitor is for makes the loss worse.
    r = monitor_curve(T, drift(clean(201), 0.5, -0.03), PRED, C, band=BAND)
    assert r.status == "ok" and r.z[-1] < -3


def test_a_level_reached_in_the_window_is_not_judged_a_residual_that_grows_is():
    # A seed whose loss sits 1.5% above the shape from t̂ 0.22 on: the divisor splits the offset
    # across the window, so r is ~+0.8% after it, far outside the band of r (σ ~0.1%), but its
    # change after the window is ~0. The same 1.5% appearing after the window is a step: alarmed.
    assert monitor_curve(T, clean(202) * np.where(T > 0.22, 1.015, 1.0), PRED, C, band=BAND).status == "ok"
    late = monitor_curve(T, clean(202) * np.where(T > 0.5, 1.015, 1.0), PRED, C, band=BAND)
    assert late.alarm and 0.5 < late.first_alarm < 0.6


def test_warmup_is_never_judged():
    # A warmup far from the reference shape (+30% up to t̂ = 0.1) neither alarms nor moves L̂(T).
    y = clean(300) * np.where(T < 0.1, 1.3, 1.0)
    r = monitor_curve(T, y, PRED, C, band=BAND)
    assert r.status == "ok" and not r.judged[T[: r.t_hat.size] <= 0.3].any()
    # A live run still inside its window is "aligning", never alarmed.
    n = int(np.searchsorted(T, 0.25))
    assert monitor_curve(T[:n], y[:n] * 1.5, PRED, C, band=BAND).status == "aligning"


def test_a_marked_restart_does_not_alarm_and_an_unmarked_one_does():
    # After a restart at t̂ = 0.6 the smoothed loss jumps 5% and recovers over 0.04 of training.
    y = clean(400)
    bump = 0.05 * np.clip(1.0 - (T - 0.6) / 0.04, 0.0, 1.0) * (T >= 0.6)
    y = y * (1.0 + bump)
    assert monitor_curve(T, y, PRED, C, band=BAND, restarts=[0.6]).status == "ok"
    assert monitor_curve(T, y, PRED, C, band=BAND).status == "alarm"
    # A drift that continues past the grace still alarms.
    r = monitor_curve(T, drift(y, 0.6, 0.05), PRED, C, band=BAND, restarts=[0.6])
    assert r.alarm and r.first_alarm > 0.6 + BAND.rule.restart_grace


def test_reference_curve_of_matching_controls():
    # The paper's way: a smaller run of the same τ, TPP and schedule as the reference.
    ref = Curve(T, clean(500, final=3.0), C)
    assert monitor_curve(T, clean(501), ref, band=BAND).status == "ok"
    assert monitor_curve(T, drift(clean(501), 0.4, 0.04), ref, band=BAND).alarm


def test_band_round_trip_and_bad_fields():
    doc = BAND.to_dict()
    assert NoiseBand.from_dict(doc) == BAND
    assert BAND.n_curves == 20 and max(BAND.scale) < 0.01
    with pytest.raises(ValueError, match="scale"):
        NoiseBand.from_dict({**doc, "scale": doc["scale"][:-1]})
    with pytest.raises(ValueError, match="unknown field"):
        NoiseBand.from_dict({**doc, "extra": 1})
    with pytest.raises(ValueError, match="false_alarm_rate"):
        NoiseBand.from_dict({**doc, "rule": {"false_alarm_rate": 0.0}})
    with pytest.raises(ValueError, match="rerun hpo calibrate"):
        NoiseBand.from_dict({**doc, "schema": "collapse-hpo/monitor-band"})
    with pytest.raises(ValueError, match="at least 3"):
        calibrate_band([Curve(T, clean(1), C)], PRED)
    with pytest.raises(ValueError, match="non-finite"):
        monitor_curve(T, np.where(T > 0.5, np.nan, 2.0), PRED, C)


def test_the_band_is_saved_in_the_predictor_and_measured_by_calibrate(tmp_path):
    from hpo.calibration.fit import monitor_band

    curves = [Curve(T, clean(s), C, {"name": f"run{s}"}) for s in range(5)]
    band = monitor_band(curves, PRED)
    assert band.n_curves == 5 and "in-sample" in band.source
    assert monitor_band(curves[:2], PRED) is None  # too few runs for a spread
    pred = dataclasses.replace(PRED, monitor=band)
    back = Predictor.load(pred.save(tmp_path / "p.json"))
    assert back.monitor == band and back.monitor_band == band
    assert PRED.monitor_band.n_curves == 0 and "uncalibrated" in PRED.monitor_band.source


def test_calibrate_measures_the_band_on_leave_one_out_refits():
    # Reference curves built from the calibration runs hold each run's own curve: judged
    # in-sample the band would shrink to the noise of an average containing the run, and clean
    # runs of a user would alarm. With the calibration's refits each run is judged by the refit
    # that did not see it (the one the leave-one-out decision error used).
    from hpo.calibration.fit import monitor_band
    from hpo.calibration.held_out import Method, Refits

    sized = dataclasses.replace(C, n_params=1e5)
    curves = [Curve(T, clean(s, noise=0.01), sized, {"name": f"run{s}"}) for s in range(6)]
    refits = Refits(curves)
    method = Method.of("reference curves", {}, references="hold")
    band = monitor_band(curves, refits.predictor(range(6), method), refits, method)
    in_sample = monitor_band(curves, refits.predictor(range(6), method))
    assert band.n_curves == 6 and "leave-one-out refit" in band.source and "in-sample" in in_sample.source
    # Out of sample a run's residual is about the mean of the other five: x − mean₋ = (6/5)(x − mean),
    # so the spread is about 6/5 of the in-sample one (1.0 would mean the run judged itself).
    ratio = np.median(np.asarray(band.scale) / np.asarray(in_sample.scale))
    assert 1.1 < ratio < 1.5, ratio


def test_calibrate_band_takes_in_the_runs_of_other_corpora():
    # A corpus whose curves bend away from the predictor's shape after the window: a band of the
    # calibration corpus alone alarms on its clean runs; with that corpus's runs (corpus_banks)
    # in the band they stay inside it. Reference-mode pairs never cross corpora.
    from hpo.calibration.fit import monitor_band
    from predictors.monitor import pair_changes

    sized = dataclasses.replace(C, n_params=1e5)
    bend = 1.0 + 0.02 * np.clip((T - 0.4) / 0.6, 0.0, 1.0)

    def runs(corpus, seeds, shape=1.0):
        return [Curve(T, clean(s, noise=0.004) * shape, sized, {"name": f"{corpus}{s}", "seed": s % 3,
                                                                  "corpus_hash": corpus}) for s in seeds]

    home, other = runs("a", range(6)), runs("b", range(6, 12), bend)
    alone = monitor_band(home, PRED)
    pooled = monitor_band(home, PRED, corpus_curves=other)
    assert pooled.n_curves == 12 and "6 clean runs of other corpora" in pooled.source
    fresh = [clean(s, noise=0.004) * bend for s in range(40, 46)]
    assert sum(monitor_curve(T, y, PRED, sized, band=alone).alarm for y in fresh) >= 5
    assert sum(monitor_curve(T, y, PRED, sized, band=pooled).alarm for y in fresh) <= 1
    # 6 runs per corpus, 2 per seed: each run has 4 partners of another seed in its own corpus (3 kept).
    assert pair_changes(home + other).shape[0] == 12 * 3
    assert pair_changes(home + other, max_partners=10).shape[0] == 12 * 4


def test_the_threshold_holds_its_stated_false_alarm_rate_on_gaussian_runs():
    # h is the (1 − rate) quantile of the GLR's maximum over Gaussian z paths with the band's
    # correlation; fresh paths (another seed) of that correlation alarm at about that rate.
    from predictors.monitor import (DEFAULT_THRESHOLD, _computed_default_threshold, ar1_correlation,
                                    glr_threshold, ramp_glr, shrunk)

    assert DEFAULT_THRESHOLD == _computed_default_threshold(0.005, 0.3)
    grid = np.asarray([g for g in BAND_GRID if g > 0.3])
    corr = ar1_correlation(grid, 0.3)
    h = glr_threshold(0.05, grid, np.ones(grid.size), corr, 0.3, 0.3, paths=4000)
    band = NoiseBand(tuple(grid), tuple(np.zeros(grid.size)), tuple(np.full(grid.size, 0.01)), 10,
                     rule=DetectorRule(false_alarm_rate=0.05, h=h), correlation=tuple(map(tuple, corr)))
    z = np.random.default_rng(7).multivariate_normal(np.zeros(grid.size), corr, size=600)
    rate = np.mean([ramp_glr(grid, row, band, 0.3)[0] is not None for row in z])
    assert 0.025 < rate < 0.08, rate
    # A stricter rate means a higher threshold.
    assert glr_threshold(0.005, grid, np.ones(grid.size), corr, 0.3, 0.3, paths=4000) > h


def test_reference_mode_band_from_pairs_of_seeds():
    # Pairs of runs that share controls but not seeds give the reference-mode band; runs of one
    # seed (one data order) are never paired, and a band needs 3 pairs.
    from predictors.monitor import calibrate_reference_band, pair_changes

    sized = dataclasses.replace(C, n_params=1e5)
    runs = [Curve(T, clean(s, noise=0.004), sized, {"name": f"r{s}", "seed": s % 3}) for s in range(6)]
    assert pair_changes(runs, max_partners=5).shape == (6 * 4, len(BAND_GRID))  # 2 runs share each seed
    band = calibrate_reference_band(runs)
    assert band is not None and set(band.center) == {0.0} and band.n_curves == 18
    assert calibrate_reference_band(runs[:2]) is None
    # Stored with the predictor-mode band and read back.
    full = calibrate_band(runs, PRED, reference_band=band)
    assert NoiseBand.from_dict(full.to_dict()) == full and full.for_reference == band


def test_a_spread_measured_on_few_reference_runs_raises_h():
    # σ scaled to one pair of reference runs is a few degrees of freedom: a pair that happens to
    # sit close together would set a narrow band, and every run judged with it would alarm. h
    # rises with the doubt (one pair most) and falls back to the shape's h as pairs add up.
    from predictors.monitor import pair_changes, pair_contrasts, scaled_band

    sized = dataclasses.replace(C, n_params=1e5)
    runs = [Curve(T, clean(s, noise=0.004), sized, {"name": f"r{s}", "seed": s}) for s in range(6)]
    changes = pair_changes(runs)
    assert pair_contrasts(runs) == 5 and pair_contrasts(runs[:2]) == 1
    h = {k: scaled_band(BAND, changes, contrasts=k).rule.threshold for k in (1, 5, 1000)}
    assert h[1] > 1.15 * BAND.rule.threshold and h[1] > h[5] > h[1000] >= BAND.rule.threshold
    assert h[1000] < 1.1 * BAND.rule.threshold
    # The scale itself is the pairs' spread, whatever the doubt.
    assert scaled_band(BAND, changes, contrasts=1).scale == scaled_band(BAND, changes, contrasts=5).scale
    # Re-runs of one seed (identical settings) pair only when asked: their spread is nondeterminism.
    same = [dataclasses.replace(c, meta={**c.meta, "seed": 0}) for c in runs[:2]]
    assert pair_changes(same).shape[0] == 0 and pair_changes(same, same_seed=True).shape[0] == 2
    assert pair_contrasts(same) == 0 and pair_contrasts(same, same_seed=True) == 1


def _wiggly(seed: int, amp: float = 0.006) -> np.ndarray:
    """A clean run whose seed bends its shape slowly (a few smooth modes of ~0.6%), far more than
    BAND's runs do: what another seed of a reference run brings."""
    rng = np.random.default_rng(1000 + seed)
    k = np.arange(1, 6)
    phase, a = rng.uniform(0, 2 * np.pi, k.size), rng.normal(0, 1, k.size) / k
    return clean(seed, final=1.8) * (1 + amp * (a[:, None] * np.sin(np.pi * k[:, None] * T + phase[:, None])).sum(0))


def test_hpo_monitor_reference_band_from_the_reference_runs(tmp_path, capsys):
    # With >= 2 reference runs of a run's controls, --reference judges it with their own spread:
    # clean runs of other seeds stay inside it, while the stored band (BAND: runs far less
    # bent) alarms on most of them; a drift from t̂ 0.5 is still caught after it starts. A
    # spread of two runs (one pair) is uncertain, so h is raised: the drift is caught late; four
    # reference runs (three independent pairs) catch it by t̂ 0.8.
    import json

    import pandas as pd

    from hpo.service.cli import main

    predictor = dataclasses.replace(PRED, monitor=BAND).save(tmp_path / "p.json")
    runs = [row for s in range(8) for row in _curve_rows(f"clean{s}", T, _wiggly(s), seed=s)]
    runs += _curve_rows("drift", T, drift(_wiggly(9), 0.5, 0.08), seed=9)
    pd.DataFrame(runs).to_csv(tmp_path / "runs.csv", index=False)
    refs = [row for s in (100, 101, 102, 103) for row in _curve_rows(f"ref{s}", T, _wiggly(s), seed=s)]
    caught = {}
    for k in (2, 4):
        pd.DataFrame(refs[: k * len(T)]).to_csv(tmp_path / "refs.csv", index=False)
        assert main(["monitor", str(tmp_path / "runs.csv"), "--predictor", str(predictor),
                     "--reference", str(tmp_path / "refs.csv"), "--json"]) == 0
        rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
        assert all(f"spread of the reference runs ({k}" in r["band"] for r in rows.values())
        assert sum(rows[f"clean{s}"]["alarm"] for s in range(8)) <= 1
        assert rows["drift"]["alarm"] and rows["drift"]["first_alarm_train_fraction"] > 0.5
        caught[k] = rows["drift"]["first_alarm_train_fraction"]
    assert caught[4] < 0.8 and caught[2] > caught[4]
    # One reference run: no spread to measure, the stored band judges (and is too narrow here).
    pd.DataFrame(refs[: len(T)]).to_csv(tmp_path / "one_ref.csv", index=False)
    assert main(["monitor", str(tmp_path / "runs.csv"), "--predictor", str(predictor),
                 "--reference", str(tmp_path / "one_ref.csv"), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert all(r["band"].startswith("stored reference-mode band") for r in rows.values())
    assert sum(rows[f"clean{s}"]["alarm"] for s in range(8)) >= 4


def test_the_shipped_predictor_carries_a_band():
    from hpo.data import default_predictor_path

    pred = Predictor.load(default_predictor_path())
    band = pred.monitor_band
    assert band.n_curves >= 50 and band.window == MONITOR_WINDOW
    assert 0.002 < min(band.scale) <= max(band.scale) < 0.05
    # Reference mode: pairs of calibration runs of the same controls and another seed.
    ref = band.for_reference
    assert ref is not band and ref.n_curves >= 20 and set(ref.center) == {0.0}


def _curve_rows(run_id, t, y, **extra):
    return [{"run_id": run_id, "train_fraction": float(a), "loss": float(b), "tau": C.tau,
             "tokens_per_param": C.tokens_per_param, "n_params": 100_000, "schedule": "linear",
             "warmup_fraction": 0.1, **extra} for a, b in zip(t, y)]


def test_hpo_monitor_cli_json_plots_and_bad_input(tmp_path, capsys):
    import json

    import pandas as pd

    from hpo.service.cli import main

    predictor = dataclasses.replace(PRED, monitor=BAND).save(tmp_path / "p.json")
    n_live = int(np.searchsorted(T, 0.25))
    rows = (_curve_rows("clean", T, clean(600)) + _curve_rows("drift", T, drift(clean(601), 0.4, 0.04))
            + _curve_rows("live", T[:n_live], clean(602)[:n_live]))
    curves = tmp_path / "curves.csv"
    pd.DataFrame(rows).to_csv(curves, index=False)
    assert main(["monitor", str(curves), "--predictor", str(predictor), "--json", "--output", str(tmp_path / "out")]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_id = {r["run_id"]: r for r in doc["runs"]}
    for row in doc["runs"]:
        assert {"run_id", "alarm", "first_alarm_train_fraction"} <= set(row)
    assert by_id["clean"]["alarm"] is False and by_id["clean"]["first_alarm_train_fraction"] is None
    assert by_id["drift"]["alarm"] is True and 0.4 < by_id["drift"]["first_alarm_train_fraction"] < 1.0
    assert by_id["live"]["status"] == "aligning" and by_id["live"]["alarm"] is False
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["residual_clean.png", "residual_drift.png"]
    # Text: one status line per run.
    assert main(["monitor", str(curves), "--predictor", str(predictor)]) == 0
    text = capsys.readouterr().out
    assert "drift" in text and "ALARM since t̂ = " in text and "aligning" in text
    # A marked restart (column `restart`) is carried with the curve and not judged.
    bump = 1.0 + 0.05 * np.clip(1.0 - (T - 0.6) / 0.04, 0.0, 1.0) * (T >= 0.6)
    marked = pd.DataFrame(_curve_rows("restarted", T, clean(603) * bump))
    marked["restart"] = (np.abs(T - T[T >= 0.6][0]) < 1e-12).astype(int)
    marked.to_csv(tmp_path / "restart.csv", index=False)
    assert main(["monitor", str(tmp_path / "restart.csv"), "--predictor", str(predictor), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert row["restarts"] == [pytest.approx(0.6, abs=0.002)] and row["status"] == "ok"
    # Bad input: one line naming the file or field, exit 2, nothing written.
    for argv, words in ((["monitor", str(tmp_path / "missing.csv")], "no such curve file"),
                        (["monitor", str(curves), "--predictor", str(tmp_path / "nope.json")], "--predictor"),
                        (["monitor"], "give CURVES")):
        assert main(argv + ["--output", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()


def test_a_predictor_with_an_irreducible_loss_is_followed():
    # Its ℓ̂ is the shape of L − L̂: a clean run L = L̂ + D·ℓ̂ has r ~ 0 and stays quiet (aligning
    # L itself on ℓ̂ bent r by several %), and the final loss it states is L̂ + D.
    floored = Predictor(dataclasses.replace(PRED.params, irreducible_loss=1.5))
    y = 1.5 + 0.8 * floored.normalized_curve(T, C)
    result = monitor_curve(T, y, floored, C, band=BAND)
    assert result.status == "ok" and np.nanmax(np.abs(result.residual[T > 0.3])) < 1e-3
    assert result.final_loss == pytest.approx(2.3, rel=1e-3)
    assert monitor_curve(T, drift(y, 0.5, 0.05), floored, C, band=BAND).alarm
    with pytest.raises(ValueError, match="irreducible loss"):
        monitor_curve(T, y - 1.0, floored, C, band=BAND)
