"""The early answer: what the user reads the moment the last rung is decided."""

from __future__ import annotations

import json
from pathlib import Path

from hpo.decisions.early_answer import EarlyAnswer, format_early_answer

ANSWER = {
    "trial_id": "t3", "config": {"lr": 0.005}, "predicted_final_loss": 1.6954, "uncertainty": 0.041,
    "margin": 0.0249, "margin_kind": "relative",
    "margin_text": "2.49% of the predicted best at t̂ = 0.3 (calibrated decision error ...)",
    "kept_all": False, "compute_fraction": 0.187, "rung": 0.3, "kept": ["t3", "t1"],
    "probability_best": 0.73, "n_candidates": 6,
}


def test_early_answer_states_the_margin_and_compute(tmp_path: Path) -> None:
    # The printed answer names the config, the margin it used and the compute spent; the JSON
    # file holds the whole answer.
    text = format_early_answer(ANSWER)
    assert "lr=0.005" in text and "keep-margin 2.49%" in text and "18.7%" in text
    assert "P(it is the best of the 6 trials ranked at this rung): 73%" in text
    assert "kept all" not in text
    EarlyAnswer(tmp_path)(ANSWER)
    assert json.loads((tmp_path / "predicted_best.json").read_text())["margin_text"].startswith("2.49%")


def test_early_answer_says_when_everyone_was_kept() -> None:
    # A rung whose calibrated error exceeded the spread of predictions says it kept everyone.
    text = format_early_answer({**ANSWER, "kept_all": True, "kept": ["a", "b", "c"]})
    assert "kept all 3 trials" in text


def test_early_answer_reads_at_80_columns() -> None:
    # In a log or CI (80 columns, no TTY) every line of the answer fits: rich never has to
    # break a phrase, and the value is labelled as calibrated for ranking, not as a value.
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(
        format_early_answer({**ANSWER, "margin_text": "1.0% (0.25 × the ranking error 4.1%, η sweep)",
                             "value_error": 0.0224}))
    lines = out.getvalue().splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "calibrated for the order of the trials" in text and "~2.2%" in text


def test_early_answer_says_which_order_it_used() -> None:
    # Issue 25: the answer names the order the rung ranked by (predicted finals, the losses at
    # the rung, or a blend) and why; without a measured ranking error it states no P(best).
    text = format_early_answer({**ANSWER, "order": "losses at the rung", "order_weight": 0.0})
    assert "ranked by losses at the rung" in text and "smaller measured error" in text
    text = format_early_answer({**ANSWER, "order": "predicted finals", "probability_best": None})
    assert "ranked by predicted finals" in text and "P(best): not stated" in text
