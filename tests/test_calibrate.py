"""`hpo calibrate`: config validation, held-out decision error, and a tiny end-to-end calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hpo.calibration.calibrate import calibrate, load_calibration_config
from hpo.trials.curve_bank import load_bank, run_id_of
from hpo.common.overrides import ConfigError
from predictors import Controls, Curve, Predictor
from predictors.io import loads_strict
from predictors.surrogate import SurrogateParams
from predictors.schedules import Schedule

TINY = {
    "name": "t",
    "trainer": {
        "model": {"d_model": 32, "n_layers": 1, "d_head": 16, "seq_len": 32,
                  "base_d_model": 32, "base_n_layers": 1},
        "tokens_per_param": 3, "batch_size": 1024, "lr": 0.01, "tau": 0.3,
        "log_every": 2, "eval_every": 1000, "eval_tokens": 2048, "threads": 1,
    },
    "grid": {"tau": [0.1, 0.3, 1.0]},
    "seeds": [0],
    "fit": {"t_min": 0.1, "compare_fixed_m": False},
    "num_cpus": 2,
}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_grid_value_errors_name_the_field(tmp_path: Path) -> None:
    # A grid value that makes a run invalid is reported, naming the field, before anything runs.
    data = {**TINY, "grid": {"lr": [0.01, -1.0]}}
    with pytest.raises(ConfigError, match="lr"):
        load_calibration_config(str(_write(tmp_path, data)))


def test_unknown_key_named(tmp_path: Path) -> None:
    # A misspelt top-level key is refused by name.
    with pytest.raises(ConfigError, match="seed"):
        load_calibration_config(str(_write(tmp_path, {**TINY, "seed": [0]})))


def test_tiny_calibration_end_to_end(tmp_path: Path) -> None:
    # Runs land in the bank, a valid predictor is written, and a re-run trains nothing new.
    data = {**TINY, "bank": str(tmp_path / "bank.parquet"),
            "predictor_out": str(tmp_path / "pred.json"), "output_dir": str(tmp_path / "out")}
    path = _write(tmp_path, data)
    import ray

    try:
        summary = calibrate(str(path))
    finally:
        ray.shutdown()
    frame = load_bank(tmp_path / "bank.parquet")
    assert frame["run_id"].nunique() == 3 and set(frame["status"]) == {"completed"}
    assert summary["n_curves"] == 3
    predictor = Predictor.load(tmp_path / "pred.json")
    assert predictor.provenance["n_curves"] == 3
    assert (tmp_path / "out" / "calibration.md").exists()
    mtime = (tmp_path / "bank.parquet").stat().st_mtime
    calibrate(str(path))
    assert (tmp_path / "bank.parquet").stat().st_mtime == mtime


def test_named_sweeps_share_runs_and_replicates_vary_the_data_stream(tmp_path: Path) -> None:
    # Named sweeps are pooled (a run two sweeps share is trained once); with
    # data_seed_from_seed each replicate seed has its own data order, shared inside it.
    data = {**TINY, "grid": {}, "seeds": [3, 4], "data_seed_from_seed": True,
            "sweeps": {"lr": {"lr": [0.005, 0.01]}, "batch": {"batch_size": [1024, 2048]}}}
    config = load_calibration_config(str(_write(tmp_path, data)))
    runs = config.runs()
    assert len(runs) == 2 * (2 + 2 - 1)  # lr=0.01/B=1024 is in both sweeps
    assert {(r["seed"], r["data"]["data_seed"]) for r in runs} == {(3, 3), (4, 4)}
    assert len(config.runs([config.sweeps["lr"]])) == 4
    # Each sweep lists its own runs per seed, with the run_ids the bank will hold.
    sweep_runs = config.sweep_runs()
    assert len(sweep_runs) == 8 and {r.label for r in sweep_runs if r.sweep == "lr"} == {"lr=0.005", "lr=0.01"}
    assert {r.run_id for r in sweep_runs} == {run_id_of(r) for r in runs}


def test_extra_banks_are_read_for_the_calibrations_runs(tmp_path: Path, monkeypatch) -> None:
    # configs/calibration/default_sizes.yaml pools the default bank with the width ladder's:
    # every one of its runs is found in one bank or the other, at the ladder's six sizes.
    from hpo.calibration.calibrate import _banked_runs, _resolve

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    config = load_calibration_config("configs/calibration/default_sizes.yaml")
    frame = _banked_runs(config, _resolve(config.bank))
    assert frame["run_id"].nunique() == len(config.runs())
    assert sorted(frame["n_params"].unique()) == [23712, 100672, 221664, 389760, 885696, 1198176]
    # Without the extra bank the ladder's runs are missing; a missing extra bank is named.
    alone = config.model_copy(update={"extra_banks": []})
    assert _banked_runs(alone, _resolve(alone.bank))["run_id"].nunique() < len(config.runs())
    with pytest.raises(ConfigError, match="extra_banks: .*nope.parquet: no such bank"):
        _banked_runs(config.model_copy(update={"extra_banks": [str(tmp_path / "nope.parquet")]}),
                     _resolve(config.bank))


def test_bank_only_calibration_writes_no_predictor(tmp_path: Path) -> None:
    # predictor_out: null banks curves (here none are missing) and fits nothing.
    data = {**TINY, "predictor_out": None, "bank": str(tmp_path / "bank.parquet")}
    config = load_calibration_config(str(_write(tmp_path, data)))
    assert config.predictor_out is None
    summary = calibrate(str(_write(tmp_path, data)), fit_only=True)
    assert summary["predictor"] is None and summary["n_banked"] == 0
    assert not list(tmp_path.glob("*.json"))


def test_fit_and_report_leaves_out_incomplete_curves_and_reports_coverage(tmp_path: Path) -> None:
    # A curve cut short (a NaN tail dropped by the bank) is left out with a note; the report
    # holds the cross-scale error and the coverage of the stated intervals; the predictor file
    # carries the cross-scale table. Too few complete curves is one error naming the source.
    from hpo.calibration.fit import FitSettings, fit_and_report

    truth = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1, m=0.15))
    t = np.linspace(0.01, 1.0, 150)
    curves = []
    for tpp in (20.0, 80.0):
        for tau in (0.05, 0.2, 0.8):
            controls = Controls(tau, tpp, Schedule("linear"))
            curves.append(Curve(t, 1.7 * truth.normalized_curve(t, controls), controls, {"name": f"r{tpp:g}-{tau:g}"}))
    cut = Curve(t[:100], curves[0].loss[:100], curves[0].controls, {"name": "nan-tail"})
    settings = FitSettings(t_min=0.05, compare_fixed_m=False)
    summary = fit_and_report(curves + [cut], settings, tmp_path / "p.json", tmp_path / "out",
                             provenance={}, source="test-bank")
    assert summary["n_curves"] == 6 and any("nan-tail" in n and "left out" in n for n in summary["notes"])
    mode = summary["modes"]["five-parameter"]
    assert set(mode["coverage"]) == {"leave-one-out", "leave-one-TPP-out", "leave-one-τ-out"}
    assert set(mode["coverage"]["leave-one-TPP-out"]) == {"in-scale e(s)", "cross-scale e(s)"}
    text = (tmp_path / "out" / "calibration.md").read_text()
    assert "Coverage of the stated intervals" in text and "nan-tail" in text
    # calibration.json is strict JSON (no bare NaN) and holds what the summary holds.
    assert loads_strict((tmp_path / "out" / "calibration.json").read_text())["n_curves"] == 6
    assert Predictor.load(tmp_path / "p.json").decision_error.cross_scale is not None
    with pytest.raises(ConfigError, match="test-bank: only 2 complete curves"):
        fit_and_report(curves[:2] + [cut], settings, tmp_path / "q.json", tmp_path / "out2",
                       provenance={}, source="test-bank")


def test_provenance_paths_carry_no_machine_prefix(tmp_path, monkeypatch):
    # A bank inside the working directory is recorded relative to it (a shipped predictor
    # names configs/calibration/..., not /home/someone/...); one outside stays as given.
    from hpo.calibration.calibrate import portable_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    assert portable_path(tmp_path / "configs" / "bank.parquet") == "configs/bank.parquet"
    outside = tmp_path.parent / "elsewhere.parquet"
    assert portable_path(outside) == str(outside)


def test_a_three_width_calibration_chooses_how_size_enters(tmp_path: Path) -> None:
    # One run at each of three widths: too few for the held-out decision error (four), enough for
    # the leave-one-size-out comparison (refits of two), which decides the shipped size method
    # and is reported, instead of the size term shipped unexamined.
    from hpo.calibration.fit import FitSettings, fit_and_report

    truth = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1, m=0.15))
    t = np.linspace(0.01, 1.0, 150)
    curves = []
    for n in (1e4, 4e4, 1.6e5):
        controls = Controls(0.2, 20.0, Schedule("linear"), n_params=n)
        shape = truth.normalized_curve(t, controls) * (1 + 0.03 * np.log10(n) * (1 - t) ** 2)
        curves.append(Curve(t, 1.7 * (n / 1e4) ** -0.1 * shape, controls, {"name": f"d{n:g}", "n_params": n}))
    summary = fit_and_report(curves, FitSettings(t_min=0.05, compare_fixed_m=False), tmp_path / "p.json",
                             tmp_path / "out", provenance={}, source="three widths")
    mode = summary["modes"]["five-parameter"]
    assert mode["size_choice_rule"] and mode["size_comparison"]
    assert mode["size_choice_rule"].startswith(Predictor.load(tmp_path / "p.json").provenance["size_method"] + ":")


def test_the_metric_a_predictor_is_fitted_on_is_read_from_the_bank_and_recorded(tmp_path: Path) -> None:
    # `metric: val_loss` fits the banked validation-loss curves (dense in this bank: evaluated at
    # every report) and records it in predictor.json; the default is the smoothed training loss.
    # A calibration whose runs would not be evaluated at every report is refused before anything.
    common = ["grid=[{tokens_per_param: [10], tau: [0.05, 0.4, 1.6]}]", "fit.held_out_error=false",
              "fit.cross_scale_error=false", "fit.ranking_error=false", "fit.extrapolation_error=false",
              "fit.size_method=surrogate"]
    fitted = {}
    for metric in ("loss", "val_loss"):
        out = tmp_path / metric
        summary = calibrate("configs/calibration/val_loss.yaml", (*common, f"metric={metric}", f"output_dir={out}",
                                                                  f"predictor_out={out}/p.json"), fit_only=True)
        assert summary["n_curves"] == 3
        fitted[metric] = Predictor.load(out / "p.json")
        assert fitted[metric].metric == metric and fitted[metric].provenance["metric"] == metric
    assert fitted["loss"].params != fitted["val_loss"].params  # two curves, two fits
    assert Predictor.load("hpo/data/predictors/default.json").metric == "loss"  # recorded before: the train loss
    with pytest.raises(ConfigError, match=r"metric: val_loss needs .* trainer.eval_every to at most trainer.log_every \(5\)"):
        load_calibration_config("configs/calibration/val_loss.yaml", ("trainer.eval_every=200",))
