"""The `hpo` command line: bad input gives one clear error naming the field and writes nothing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from hpo.service.cli import main
from hpo.data import default_predictor_path

TINY_TRAIN = {
    "model": {"d_model": 32, "n_layers": 1, "d_head": 16, "seq_len": 32,
              "base_d_model": 32, "base_n_layers": 1},
    "tokens_per_param": 2, "batch_size": 1024, "lr": 0.01, "tau": 0.3,
    "log_every": 5, "threads": 1,
}


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("lr=-0.1", "lr"),
        ("tau=0", "tau"),
        ("tokens_per_param=0", "tokens_per_param"),
        ("batch_size=1000", "batch_size"),
        ("warmup_fraction=1.5", "warmup_fraction"),
        ("weight_decay=0.1", "tau"),
        ("colour=blue", "colour"),
    ],
)
def test_train_config_errors_name_the_field_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, field: str
) -> None:
    # Each invalid setting exits 2 with a message naming the field; no output directory appears.
    config = _write(tmp_path / "c.yaml", TINY_TRAIN)
    output = tmp_path / "out"
    code = main(["train", "--config", str(config), "--set", override, "--output", str(output), "--quiet"])
    assert code == 2
    assert field in capsys.readouterr().err
    assert not output.exists()


def test_train_writes_curve_and_controls(tmp_path: Path) -> None:
    # `hpo train` writes the curve and every control the run was defined by.
    config = _write(tmp_path / "c.yaml", TINY_TRAIN)
    output = tmp_path / "out"
    assert main(["train", "--config", str(config), "--output", str(output), "--quiet"]) == 0
    controls = json.loads((output / "controls.json").read_text())
    for key in ("tau", "weight_decay", "tokens_per_param", "n_params", "total_tokens",
                "batch_size", "lr", "schedule", "seed", "corpus_hash"):
        assert key in json.dumps(controls), key
    with open(output / "curve.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and float(rows[-1]["train_fraction"]) == pytest.approx(1.0)


def test_sweep_config_error_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A bad sweep config exits 2 naming the field, and creates no output directory.
    output = tmp_path / "sweep_out"
    config = _write(tmp_path / "s.yaml", {
        "name": "bad", "output_dir": str(output), "trainer": TINY_TRAIN,
        "search_space": {"lr": {"grid": [0.01]}}, "scheduler": {"reduction_factor": 1},
    })
    assert main(["sweep", str(config)]) == 2
    assert "scheduler.reduction_factor" in capsys.readouterr().err
    assert not output.exists()


def test_sweep_with_missing_predictor_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A predictor path that does not exist is named, before any output is written.
    output = tmp_path / "sweep_out"
    config = _write(tmp_path / "s.yaml", {
        "name": "bad", "output_dir": str(output), "trainer": TINY_TRAIN,
        "search_space": {"lr": {"grid": [0.01]}}, "predictor": str(tmp_path / "missing.json"), "limits": {"min_steps": 1},
    })
    assert main(["sweep", str(config)]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert not output.exists()


def test_report_on_non_sweep_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `hpo report` on a folder that is not a sweep says so.
    assert main(["report", str(tmp_path)]) == 2
    assert "scheduler_state.json" in capsys.readouterr().err


def test_sweep_with_malformed_predictor_names_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A predictor JSON with a bad field is refused with its path, before any output is written.
    bad = json.loads(default_predictor_path().read_text())
    bad["params"]["eps2"] = -1.0
    predictor = tmp_path / "bad.json"
    predictor.write_text(json.dumps(bad))
    output = tmp_path / "sweep_out"
    config = _write(tmp_path / "s.yaml", {
        "name": "bad", "output_dir": str(output), "trainer": TINY_TRAIN,
        "search_space": {"lr": {"grid": [0.01]}}, "predictor": str(predictor), "limits": {"min_steps": 1},
    })
    assert main(["sweep", str(config)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "eps2" in err
    assert not output.exists()


def test_report_on_malformed_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A corrupt scheduler_state.json gives one error naming the file, not a traceback.
    (tmp_path / "scheduler_state.json").write_text("{not json")
    assert main(["report", str(tmp_path)]) == 2
    assert "scheduler_state.json" in capsys.readouterr().err


EXAMPLE_CURVES = Path(__file__).resolve().parents[1] / "configs/curves/example_curves.csv"


def test_calibrate_from_curves_writes_a_predictor_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `hpo calibrate --from-curves FILE` fits the user's curves like banked runs: predictor JSON
    # (with its provenance naming the file), report, and coverage lines on the terminal.
    from predictors import Predictor

    pred, out = tmp_path / "mine.json", tmp_path / "out"
    code = main(["calibrate", "--from-curves", str(EXAMPLE_CURVES), "--predictor-out", str(pred),
                 "--output-dir", str(out), "--set", "fit.compare_fixed_m=false"])
    assert code == 0
    predictor = Predictor.load(pred)
    assert predictor.provenance["n_curves"] == 6 and "example_curves.csv" in predictor.provenance["curves"]
    assert predictor.decision_error.cross_scale is not None
    assert (out / "calibration.md").exists()
    assert "±2σ coverage, leave-one-TPP-out" in capsys.readouterr().out


def test_calibrate_output_dir_holds_the_predictor_unless_predictor_out_says_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The predictor belongs with its report: `--output-dir D` alone puts it in D (it went to
    # runs/calibration/<name>/ before); --predictor-out still wins.
    monkeypatch.chdir(tmp_path)  # anything written to the old default would land under here
    fast = ["--set", "fit.compare_fixed_m=false", "--set", "fit.held_out_error=false",
            "--set", "fit.ranking_error=false"]
    out = tmp_path / "mine"
    assert main(["calibrate", "--from-curves", str(EXAMPLE_CURVES), "--output-dir", str(out), *fast]) == 0
    assert (out / "predictor.json").exists() and (out / "calibration.md").exists()
    assert not (tmp_path / "runs").exists()
    assert str(out / "predictor.json") in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere.json"
    assert main(["calibrate", "--from-curves", str(EXAMPLE_CURVES), "--output-dir", str(tmp_path / "two"),
                 "--predictor-out", str(elsewhere), *fast]) == 0
    assert elsewhere.exists() and not (tmp_path / "two" / "predictor.json").exists()


def test_calibrate_from_curves_missing_column_exits_2_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    bad = tmp_path / "bad.csv"
    pd.read_csv(EXAMPLE_CURVES).drop(columns="n_params").to_csv(bad, index=False)
    code = main(["calibrate", "--from-curves", str(bad), "--predictor-out", str(tmp_path / "p.json"),
                 "--output-dir", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "'n_params'" in err
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "out").exists()
    assert main(["calibrate"]) == 2 and "--from-curves" in capsys.readouterr().err


def test_calibrate_from_curves_without_weight_decay_writes_its_report(tmp_path: Path) -> None:
    # Every run at λ = 0 (τ = ∞; the importer takes weight_decay 0 with eta and batch_size): the
    # calibration runs to the end, with b_exp fixed and said so, and no τ bins (was: predictor
    # written, then a crash binning an empty set of finite τ; exit 1, no report).
    import pandas as pd
    from predictors import Predictor

    curves = tmp_path / "no_decay.csv"
    pd.read_csv(EXAMPLE_CURVES).assign(weight_decay=0.0).to_csv(curves, index=False)
    pred, out = tmp_path / "p.json", tmp_path / "out"
    assert main(["calibrate", "--from-curves", str(curves), "--predictor-out", str(pred),
                 "--output-dir", str(out), "--set", "fit.compare_fixed_m=false"]) == 0
    report = (out / "calibration.md").read_text()
    assert "b_exp = 0" in report and "No run with a finite τ" in report
    assert (out / "normalized.png").stat().st_size > 0
    assert Predictor.load(pred).params.b_exp == 0.0


def test_calibration_that_fails_after_fitting_leaves_no_predictor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The predictor is written only once its report and figure are ready: a failure drawing the
    # figure leaves no predictor.json a user could take for a finished calibration.
    from hpo.calibration import report as calibration_report

    def broken(*args, **kwargs):
        raise RuntimeError("figure failed")

    monkeypatch.setattr(calibration_report, "render_normalized", broken)
    pred, out = tmp_path / "p.json", tmp_path / "out"
    code = main(["calibrate", "--from-curves", str(EXAMPLE_CURVES), "--predictor-out", str(pred),
                 "--output-dir", str(out), "--set", "fit.compare_fixed_m=false", "--set", "fit.held_out_error=false"])
    assert code == 1 and "figure failed" in capsys.readouterr().err
    assert not pred.exists()
    assert not [p.name for p in out.rglob("*") if p.name in ("calibration.json", "calibration.md", "normalized.png")]


NO_RAY_NO_TORCH = r"""
import sys
from hpo.service.cli import main

fast = ["--set", "fit.compare_fixed_m=false", "--set", "fit.held_out_error=false"]
out = sys.argv[1]
codes = [
    main(["calibrate", "--from-curves", sys.argv[2], "--predictor-out", f"{out}/curves.json",
          "--output-dir", f"{out}/curves", *fast]),
    main(["calibrate", "configs/calibration/constant_lr.yaml", "--fit-only", *fast,
          "--set", f"predictor_out={out}/bank.json", "--set", f"output_dir={out}/bank"]),
]
print("codes", codes)
print("heavy", sorted({m.split(".")[0] for m in sys.modules} & {"ray", "torch"}))
"""


def test_calibrate_from_curves_and_fit_only_never_import_ray_or_torch(tmp_path: Path) -> None:
    # Fitting curves needs neither the trainer nor Ray: `hpo calibrate --from-curves` and
    # `--fit-only` run in a fresh interpreter without importing ray or torch (so they start
    # fast and work where neither is installed).
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", NO_RAY_NO_TORCH, str(tmp_path), str(EXAMPLE_CURVES)],
                          cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "codes [0, 0]" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "heavy []" in done.stdout
    assert (tmp_path / "curves.json").exists() and (tmp_path / "bank.json").exists()


@pytest.mark.parametrize("stop", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_an_interrupted_sweep_says_so_and_how_to_resume(tmp_path: Path, stop: str) -> None:
    # Ctrl-C (SIGINT), or the SIGTERM that kill, timeout, systemd, Slurm and Kubernetes send,
    # during a real sweep: the driver stops Ray Tune, prints that the sweep was interrupted
    # before the partial report, gives the `hpo resume` command, exits 130, and leaves the
    # MLflow runs KILLED (the trials still going) or FINISHED, none FAILED nor RUNNING.
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from mlflow.tracking import MlflowClient

    from sweep_fixtures import tiny_sweep

    repo = Path(__file__).resolve().parents[1]
    output = tmp_path / "out"
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(tiny_sweep(output)))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-m", "hpo.service.cli", "sweep", str(config_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (output / "scheduler_state.history.jsonl").exists():
            assert driver.poll() is None, "sweep ended before any trial reported"
            time.sleep(0.2)
        driver.send_signal(getattr(signal, stop))  # the driver alone, as `kill PID` does
        out, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 130, (out[-2000:], err[-2000:])
    assert "sweep INTERRUPTED: the report below is partial" in out
    assert out.index("sweep INTERRUPTED") < out.index("Sweep report")
    assert f"hpo resume {output}" in out and f"hpo resume {output}" in err
    assert "Traceback" not in err, err[-3000:]
    runs = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}").search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}").search_experiments()])
    statuses = sorted(r.info.status for r in runs)
    assert len(runs) >= 2 and "KILLED" in statuses, statuses  # the parent and the trials started
    assert set(statuses) <= {"KILLED", "FINISHED"}, statuses


def test_readme_calibrate_commands_leave_the_checkout_unchanged(tmp_path: Path) -> None:
    # `hpo calibrate CONFIG --fit-only` and `--from-curves FILE`, run from the repository as the
    # README says, write under runs/ (ignored), never into a tracked file: git status is the
    # same before and after. (Cut down: no held-out refits, so it takes seconds.)
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    # The checkout as it is now, uncommitted changes and .git included (runs/ and caches left out).
    shutil.copytree(repo, clone, ignore=shutil.ignore_patterns("runs", "__pycache__", ".pytest_cache", "*.egg-info"))
    before = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    fast = ["--set", "fit.compare_fixed_m=false", "--set", "fit.held_out_error=false",
            "--set", "fit.ranking_error=false"]
    env = {"PYTHONPATH": str(clone), "PATH": __import__("os").environ["PATH"], "HOME": str(tmp_path)}
    for command in (["calibrate", "configs/calibration/constant_lr.yaml", "--fit-only", "--set",
                     "predictor_out=runs/calibration/{name}/predictor.json", *fast],
                    ["calibrate", "configs/calibration/default.yaml", "--fit-only", *fast],
                    ["calibrate", "--from-curves", "configs/curves/example_curves.csv", *fast]):
        done = subprocess.run([sys.executable, "-m", "hpo.service.cli", *command], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    after = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert after == before
    assert (clone / "runs/calibration/tiny/predictor.json").exists()  # default.yaml's calibration is "tiny"
    assert (clone / "runs/calibration/example_curves/predictor.json").exists()
