"""The early answer: what the user reads the moment the last rung is decided."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from hpo.decisions.early_answer import EarlyAnswer, early_answer_text, format_early_answer

ANSWER = {
    "trial_id": "t3", "config": {"lr": 0.005}, "predicted_final_loss": 1.6954, "uncertainty": 0.041,
    "margin": 0.0249, "margin_kind": "relative",
    "margin_text": "2.49% of the predicted best at t̂ = 0.3 (calibrated decision error ...)",
    "kept_all": False, "compute_fraction": 0.187, "rung": 0.3, "kept": ["t3", "t1"],
    "probability_best": 0.73, "n_candidates": 6, "order": "losses at the rung", "order_weight": 0.0,
    "kind": "eta_fixed_tau", "value_error": 0.0224,
}


def _printed(answer: dict) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(format_early_answer(answer))
    return [line for line in out.getvalue().splitlines() if line.strip()]


def test_early_answer_names_pick_prediction_chance_and_compute(tmp_path: Path) -> None:
    # The printed answer names the pick and its config, its predicted final ± error, P(best)
    # and the compute spent; the JSON file holds the whole answer, margin included.
    text = format_early_answer(ANSWER)
    assert "trial t3, lr=0.005" in text and "1.6954 ± 0.0410" in text
    assert "P(best): 73% among the 6 trials" in text and "18.7% of the full sweep" in text
    EarlyAnswer(tmp_path)(ANSWER)
    assert json.loads((tmp_path / "predicted_best.json").read_text())["margin_text"].startswith("2.49%")


def test_early_answer_is_six_short_lines_without_the_evidence() -> None:
    # At most six lines within 80 columns; the keep-margin's provenance and the value error
    # are not printed (they are in report.md), so the answer reads in plain words.
    lines = _printed(ANSWER)
    assert 1 <= len(lines) <= 6 and max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "2.49%" not in text and "keep-margin" not in text and "~2.2%" not in text
    assert "[bold" not in early_answer_text(ANSWER) and early_answer_text(ANSWER).count("\n") <= 5


def test_early_answer_says_which_order_decided_and_why() -> None:
    # One line says which order ranked the last rung (predicted finals, the losses so far, or
    # a mix) and on which kind of sweep that order was measured the better one.
    text = early_answer_text(ANSWER)
    assert re.search(r"ranked by the losses so far: measured the better order on η at fixed τ sweeps$", text)
    text = early_answer_text({**ANSWER, "order": "predicted finals", "order_weight": 1.0, "kind": "lambda"})
    assert "ranked by the predicted finals: measured the better order on λ at fixed B and η sweeps" in text
    text = early_answer_text({**ANSWER, "order": "blend", "order_weight": 0.5})
    assert "ranked by a blend of predicted finals and losses so far" in text
    text = early_answer_text({**ANSWER, "order": "predicted finals", "probability_best": None, "kind": "mixed"})
    assert "this kind of sweep" in text and "P(best): not stated" in text
    text = early_answer_text({**ANSWER, "order_words": "ASHA: the top 1/rf by the loss at the rung"})
    assert "ranked by the sweep's keep rule (ASHA: the top 1/rf by the loss at the rung)" in text


def test_a_revised_answer_says_which_pick_it_replaces() -> None:
    text = early_answer_text({**ANSWER, "revised": {"from": "t1", "why": "late arrival", "revisions": 1}})
    assert text.splitlines()[0].endswith("(revised: replaces t1)")


def test_hpo_sweep_with_asha_announces_the_rungs_pick_in_asha_order(tmp_path: Path) -> None:
    # End to end through `hpo sweep` (run_sweep): with scheduler.rule asha and one rung, the early
    # answer names the trial the rung recorded as its pick and the order ASHA ranked by (the
    # losses at the rung), not the calibrated order's pick among the survivors.
    import ray

    from hpo.service.sweep import run_sweep
    from hpo.trials.sweep_config import load_sweep_config
    from sweep_fixtures import tiny_sweep

    output = tmp_path / "out"
    try:
        # Two trials are enough for one rung to rank and keep one (half the tiny sweep's training).
        data = tiny_sweep(output, rule="asha", rungs=[0.3])
        data["search_space"] = {"lr": {"grid": [0.0025, 0.04]}}
        outcome = run_sweep(load_sweep_config(data=data))
    finally:
        ray.shutdown()
    assert outcome["errors"] == []
    answer = json.loads((output / "predicted_best.json").read_text())
    rung = json.loads((output / "scheduler_state.json").read_text())["rungs"][-1]
    assert answer["trial_id"] == rung["predicted_best"] == rung["current_best"]
    assert answer["order"] == "losses at the rung" and rung["order_weight"] == 0.0
    assert "ranked by the sweep's keep rule (ASHA" in early_answer_text(answer)
