"""The one replay engine (hpo/trials/rule_replay.py) and `hpo replay` (hpo/service/replay.py):
the command prints the numbers the public benchmark prints for the same settings, groups a user's
curves into sweeps and lists the runs that form none, reads an MLflow experiment, and refuses a
run that lacks a control with one line naming the run and the column (exit 2, nothing written)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpo.service.cli import main  # noqa: E402

EXAMPLE = REPO / "configs/curves/example_curves.csv"
PUBLIC_LM = str(REPO / "hpo/data/predictors/public_lm.json")


@pytest.fixture(scope="module")
def public_replay(tmp_path_factory):
    """`hpo replay public --quick` and `benchmarks/public_sweeps.py --quick` on the same predictor."""
    from benchmarks import public_sweeps

    out = tmp_path_factory.mktemp("replay")
    started = time.monotonic()
    assert main(["replay", "public", "--quick", "--output", str(out / "cli")]) == 0
    seconds = time.monotonic() - started
    assert public_sweeps.main(["--out", str(out / "bench"), "--predictor", PUBLIC_LM, "--quick"]) == 0
    return out, seconds


def test_hpo_replay_public_prints_the_benchmarks_numbers(public_replay, capsys) -> None:
    out, seconds = public_replay
    replay = json.loads((out / "cli" / "replay.json").read_text())
    bench = json.loads((out / "bench" / "sweeps.json").read_text())
    assert seconds < 30 and replay["predictor"] == "packaged public_lm.json"
    assert len(replay["sweeps"]) == 24 and replay["noise"] == pytest.approx(0.00238, abs=5e-5)
    key = ("sweep", "method", "setting", "compute", "regret", "pick", "within_noise", "best_kept")
    mine = sorted(tuple(r["family" if k == "sweep" else k] for k in key) for r in replay["rows"])
    theirs = sorted(tuple(r[k] for k in key) for r in bench)
    assert mine == theirs
    assert replay["stop_at_s"] == json.loads((out / "bench" / "stop_at_s.json").read_text())
    assert (out / "cli" / "replay.png").stat().st_size > 10_000
    assert replay["no_sweep"], "runs of the bench that form no sweep are listed"


def test_the_readme_states_the_public_figures_hpo_replay_prints(public_replay) -> None:
    out, _ = public_replay
    counts = json.loads((out / "cli" / "replay.json").read_text())["summary"]["stop_at_s"]
    readme = " ".join((REPO / "README.md").read_text().split("## When it pays")[0].split())
    assert "`hpo replay public`" in readme
    found = re.search(r"stopped at s = 0\.1 / 0\.2 / 0\.3\b.*? on (\d+) / (\d+) / (\d+) of (\d+) sweeps, "
                      r"the lowest loss so far \(current-best\) on (\d+) / (\d+) / (\d+)", readme)
    assert found, "the README's top states the public figures"
    numbers = list(map(int, found.groups()))
    assert numbers[3] == counts["0.3"]["sweeps"]
    assert numbers[:3] == [counts[s]["predicted_best_within"] for s in ("0.1", "0.2", "0.3")]
    assert numbers[4:] == [counts[s]["current_best_within"] for s in ("0.1", "0.2", "0.3")]


@pytest.mark.slow
def test_the_full_public_replay_takes_under_30_seconds(tmp_path) -> None:
    started = time.monotonic()
    assert main(["replay", "public", "--output", str(tmp_path)]) == 0
    assert time.monotonic() - started < 30


def _with_lonely_run(tmp_path: Path) -> Path:
    frame = pd.read_csv(EXAMPLE)
    lonely = frame[frame["run_id"] == "run_678c52"].assign(run_id="lonely", schedule="cosine")
    path = tmp_path / "curves.csv"
    pd.concat([frame, lonely]).to_csv(path, index=False)
    return path


def test_a_curve_file_is_grouped_into_sweeps_and_a_run_in_none_is_listed(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["replay", str(_with_lonely_run(tmp_path)), "--quick", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    replay = json.loads((out / "replay.json").read_text())
    # Two λ sweeps of three runs (TPP 20 and TPP 80); the cosine copy differs in its schedule.
    assert sorted(len(s["runs"]) for s in replay["sweeps"].values()) == [3, 3]
    assert any("lonely" in line for line in replay["no_sweep"]) and "no sweep: 1 run(s)" in printed
    assert "predictor's relative seed noise" in replay["noise_source"]
    assert "collapse (default)" in printed and "predicted-best at s = 0.3" in printed and "λ=" in printed
    rows = [r for r in replay["rows"] if r["default"]]
    assert len(rows) == 2 and all(0 < r["compute"] <= 1 and r["regret"] >= 0 for r in rows)


def test_a_run_without_a_control_exits_2_naming_the_run_and_column(tmp_path, capsys) -> None:
    frame = pd.read_csv(EXAMPLE)
    frame.loc[frame["run_id"] == "run_be577e", "tokens_per_param"] = None
    path = tmp_path / "curves.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["replay", str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "run_be577e" in err and "'tokens_per_param'" in err and err.count("\n") == 1
    assert not out.exists()
    assert main(["replay", str(EXAMPLE), "--swept", "nope", "--output", str(out)]) == 2
    assert "--swept: no run" in capsys.readouterr().err and not out.exists()


def test_an_mlflow_experiment_replays_like_its_curve_file(tmp_path, capsys) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("finished")
    frame = pd.read_csv(EXAMPLE)
    frame = frame[frame["tokens_per_param"] == 20]
    for run_id, rows in frame.groupby("run_id"):
        run = client.create_run(experiment, run_name=run_id)
        first = rows.iloc[0]
        params = [Param(k, str(first[k])) for k in ("eta", "batch_size", "weight_decay", "tokens_per_param",
                                                     "n_params", "schedule", "warmup_fraction", "total_tokens")]
        client.log_batch(run.info.run_id, params=params, metrics=[
            Metric("loss", float(v), 0, int(t // first["batch_size"])) for v, t in zip(rows["loss"], rows["tokens"])])
    file = tmp_path / "curves.csv"
    frame.to_csv(file, index=False)
    assert main(["replay", "--from-mlflow", experiment, "--tracking-uri", uri, "--quick",
                 "--output", str(tmp_path / "mlflow")]) == 0
    assert main(["replay", str(file), "--quick", "--output", str(tmp_path / "file")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / d / "replay.json").read_text()) for d in ("mlflow", "file"))
    assert len(a["sweeps"]) == len(b["sweeps"]) == 1
    assert [(r["method"], r["setting"], r["compute"], r["regret"]) for r in a["rows"]] == \
        [(r["method"], r["setting"], r["compute"], r["regret"]) for r in b["rows"]]
