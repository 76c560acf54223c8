"""Training logs as curves (hpo/calibration/log_import.py): W&B run exports, cooldowns joined onto
their parents, steps logged twice, and errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpo.calibration.log_import import LogImportError, load_log_dir, read_log, rerun_spread

T = 3000


def export(name: str, steps: list[int], lr, *, resume: str | None = None, loss=None, lr_peak: float = 1e-3,
           params: int = 1_000_000) -> dict:
    """A W&B-style run export: validation loss every 200 steps, the LR every 50."""
    loss = loss or (lambda s: 5.0 - 2.0 * s / T)
    lr_steps = [s for s in range(50, T + 1, 50) if s >= (steps[0] if resume else 0)]
    return {"name": name,
            "config": {"lr": lr_peak, "weight_decay": 0.1, "batch_size": 16, "acc_steps": 2, "world_size": 1,
                       "sequence_length": 256, "iterations": T, "n_layer": 2, "n_embd": 128, "vocab_size": 1000,
                       "dataset": "toy", "seed": 0, "warmup_steps": 150, "resume_from": resume},
            "summary": {"parameters": params},
            "history": {"val": {"iter": steps, "val_loss": [loss(s) for s in steps]},
                        "train": {"iter": lr_steps, "train_lr": [lr_peak * lr(s) for s in lr_steps],
                                  "train_loss": [loss(s) for s in lr_steps]}}}


def constant(s: int) -> float:
    return min(1.0, s / 150)


def cooldown_from(start: int):
    return lambda s: constant(s) * min(1.0, max(0.0, (T - s) / (T - start)))


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_a_cooldown_resumed_from_its_parent_is_one_curve_with_no_step_twice(tmp_path):
    # The parent logs every 200 steps to 2,800 (T - 200: complete); the cooldown resumes from its
    # checkpoint at 2,000 and logs 2,000-2,800 with a falling LR, starting with a point at 2,000.
    write(tmp_path, "stable", export("stable", list(range(200, T, 200)), constant))
    write(tmp_path, "ann0.3_stable", export("ann0.3_stable", list(range(2000, T, 200)), cooldown_from(2100),
                                            resume="/x/stable/ckpts/2000", loss=lambda s: 4.9 - 2.0 * s / T))
    logs = load_log_dir(tmp_path)
    curve = next(c for c in logs.curves if c.meta["name"] == "ann0.3_stable")
    steps = logs.frame.loc[logs.frame["run_id"] == "ann0.3_stable", "step"].to_numpy()
    assert len(steps) == len(set(steps)) == 14 and np.all(np.diff(steps) > 0)
    # Before the checkpoint the parent's losses, from it on the cooldown's own.
    parent_part = steps < 2000
    assert np.allclose(curve.loss[parent_part], 5.0 - 2.0 * steps[parent_part] / T)
    assert np.allclose(curve.loss[~parent_part], 4.9 - 2.0 * steps[~parent_part] / T)
    schedule = curve.controls.schedule
    assert (schedule.name, schedule.decay_fraction) == ("wsd", pytest.approx(0.3, abs=0.01))
    assert logs.notes == [] or all("ann0.3" not in n for n in logs.notes)


def test_steps_logged_twice_keep_the_value_logged_last(tmp_path):
    # A run resumed at 1,000 after logging to 1,400 re-logs 1,000-1,400: the later values stand.
    data = export("r", list(range(200, T, 200)), constant)
    val = data["history"]["val"]
    val["iter"] = [200, 400, 600, 800, 1000, 1200, 1400, 1000, 1200, 1400] + list(range(1600, T, 200))
    val["val_loss"] = [4.0] * 7 + [3.5, 3.4, 3.3] + [3.0] * len(range(1600, T, 200))
    run = read_log(write(tmp_path, "r", data))
    steps, values = run.curves["val_loss"]
    assert list(steps[:7]) == [200, 400, 600, 800, 1000, 1200, 1400]
    assert list(values[4:7]) == [3.5, 3.4, 3.3]


def test_a_cooldown_whose_parent_is_missing_is_left_out_with_a_note(tmp_path):
    write(tmp_path, "full", export("full", list(range(200, T, 200)), constant))
    write(tmp_path, "orphan", export("orphan", list(range(2000, T, 200)), cooldown_from(2100),
                                     resume="/x/gone/ckpts/2000"))
    logs = load_log_dir(tmp_path)
    assert [c.meta["name"] for c in logs.curves] == ["full"]
    assert any("orphan" in n and "gone" in n and "left out" in n for n in logs.notes)


def test_a_rerun_in_a_subfolder_measures_the_noise(tmp_path):
    write(tmp_path, "a", export("a", list(range(200, T, 200)), constant))
    write(tmp_path / "reruns", "a", export("a", list(range(200, T, 200)), constant,
                                           loss=lambda s: 5.003 - 2.0 * s / T))
    logs = load_log_dir(tmp_path)
    assert logs.reruns == {"reruns/a": "a"}
    spread = rerun_spread(logs)
    assert spread["rms_difference"] == pytest.approx(0.003, rel=1e-6)


def test_controls_follow_the_config(tmp_path):
    # B = 16 x 2 x 1 x 256 tokens a step, D = T x B, N = parameters - vocab x d_model; tau = B/(eta lambda D).
    write(tmp_path, "a", export("a", list(range(200, T, 200)), constant))
    curve = load_log_dir(tmp_path).curves[0]
    batch, n = 16 * 2 * 256, 1_000_000 - 1000 * 128
    assert curve.controls.n_params == n
    assert curve.controls.tokens_per_param == pytest.approx(T * batch / n)
    assert curve.controls.tau == pytest.approx(1.0 / (1e-3 * 0.1 * T))
    assert curve.controls.schedule.name == "constant" and curve.controls.schedule.warmup_fraction == pytest.approx(0.05)


@pytest.mark.parametrize("content, message", [
    ("not json", "not a JSON run export"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply|not a JSON run export"),
    ('{"config": {}}', "needs the objects 'config' and 'history'"),
])
def test_a_bad_file_is_one_error_naming_it(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(LogImportError, match=message) as caught:
        load_log_dir(tmp_path)
    assert "bad.json" in str(caught.value)


def test_a_folder_without_exports_is_one_error(tmp_path):
    with pytest.raises(LogImportError, match="no \\*.json run export"):
        load_log_dir(tmp_path)
    with pytest.raises(LogImportError, match="is not a folder"):
        load_log_dir(tmp_path / "missing")


def test_calibrate_from_logs_names_a_bad_export_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from hpo.service.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run.json").write_text('{"name": "run"}')
    assert main(["calibrate", "--from-logs", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert "run.json" in err and "'config' and 'history'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


def test_calibrate_from_logs_names_the_fit_window_a_short_run_starts_after(tmp_path, monkeypatch, capsys):
    # Runs evaluated every 200 of 3,000 steps start at t̂ 0.067: a fit from t̂ 0.05 is refused in one
    # line naming the setting and the value that works (exit 2, nothing written), not a traceback.
    from hpo.service.cli import main

    monkeypatch.chdir(tmp_path)
    for i, peak in enumerate((5e-4, 1e-3, 2e-3)):
        write(tmp_path / "logs", f"r{i}", export(f"r{i}", list(range(200, T, 200)), cooldown_from(150),
                                                 lr_peak=peak, loss=lambda s, i=i: 5.0 - 2.0 * s / T - 0.01 * i))
    code = main(["calibrate", "--from-logs", str(tmp_path / "logs"), "--set", "fit.t_min=0.05",
                 "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "fit.t_min: 0.05 is before the first point of 3 run(s)" in err and "fit.t_min=0.07" in err
    assert not (tmp_path / "out").exists()
