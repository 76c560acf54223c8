"""The early answer: the predicted-best config, announced the moment the last rung is decided.

What it says is composed here (:func:`compose_early_answer`, :func:`revise`) from the last
rung's record and the rules (:mod:`hpo.decisions.rules`); ``CollapseScheduler`` only decides when. It is
printed to the terminal, written to ``<output>/predicted_best.json`` and published on the
MLflow parent run (tags and a JSON artifact, ``hpo.tracking.runs.SweepTracker.publish_early_answer``),
while the surviving trial keeps training.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rich.console import Console

from hpo.decisions import rules
from hpo.decisions.scheduler_records import RungRecord, TrialRecord
from predictors.io import atomic_write_json, json_safe


def compose_early_answer(
    rung: RungRecord, trials: Mapping[str, TrialRecord], *, margin_for: Callable[[Sequence[str]], rules.Margin],
    margin_text: str, predictor: Any, decision_mode: str, compute_fraction: float, decided_at: str,
) -> Optional[dict[str, Any]]:
    """The early answer from the last rung's record: the best survivor by the rung's order,
    its P(best) among the trials ranked there, the predictor's value error for it, and what
    the rung was decided with. None when no survivor has a prediction. ``margin_for(ids)`` is
    the rung's margin for those trials (``hpo.decisions.rules.rung_margin``)."""
    kept = [rung.entries[t] for t in rung.survivors if rung.entries[t].predicted_final_loss is not None]
    if not kept:
        return None
    weight = rung.order_weight
    best = min(kept, key=lambda e: rules._rank_key(e.candidate(), weight))
    # P(best) among the trials ranked at this rung, by the rung's order: each score
    # normal with the order's ranking scale / √2 (a pair's difference has the scale).
    ranked = [e for e in rung.entries.values() if e.predicted_final_loss is not None]
    m = margin_for([e.trial_id for e in ranked])
    sigma = max(m.sigma, 1e-6) / math.sqrt(2)
    p_best = rules.probability_best([rules.score(e.candidate(), weight) for e in ranked], [sigma] * len(ranked))
    probability = dict(zip([e.trial_id for e in ranked], p_best)).get(best.trial_id) if m.sigma else None
    value_error = getattr(predictor, "relative_error", None)
    rec = trials[best.trial_id]
    try:
        e_value = value_error(rung.fraction, rec.controls)[0] if value_error and rec.controls else None
    except (KeyError, ValueError, TypeError):
        e_value = None
    return json_safe({
        "trial_id": best.trial_id, "config": rec.config, "predicted_final_loss": best.predicted_final_loss,
        "uncertainty": best.uncertainty, "value_error": e_value,
        "probability_best": probability, "n_candidates": len(ranked),
        "margin": rung.margin, "margin_text": margin_text, "kind": rung.kind,
        "order": m.order, "order_weight": weight, "order_words": rung.margin_source,
        "kept_all": bool(rung.kept_all), "compute_fraction": compute_fraction,
        "rung": rung.fraction, "kept": list(rung.survivors), "current_best": rung.current_best,
        "decision_mode": decision_mode, "decided_at": decided_at,
    })


def revise(previous: dict[str, Any], new: Optional[dict[str, Any]], why: str, at: str) -> Optional[dict[str, Any]]:
    """The answer that replaces ``previous`` after the last rung changed (a trial kept there
    after it was decided), with ``revised``: the trial it replaces, why, when and how many
    revisions so far; None when nothing is to be announced again (no answer can be made, or
    it names the same trial: ``previous`` stands)."""
    if new is None or previous.get("trial_id") == new["trial_id"]:
        return None
    new["revised"] = json_safe({
        "from": previous.get("trial_id"), "why": why, "at": at, "to": new["trial_id"],
        "previous_predicted_final_loss": previous.get("predicted_final_loss"),
        "revisions": int((previous.get("revised") or {}).get("revisions", 0)) + 1})
    return new


class EarlyAnswer:
    """Callable handed to ``CollapseScheduler(on_early_answer=...)``; picklable for restore."""

    def __init__(self, output_dir: Path, tracker: Optional[Any] = None) -> None:
        self.output_dir = Path(output_dir)
        self.tracker = tracker

    def __call__(self, answer: dict[str, Any]) -> None:
        atomic_write_json(self.output_dir / "predicted_best.json", answer)
        Console(stderr=False).print(format_early_answer(answer))
        if self.tracker is not None:
            try:
                self.tracker.publish_early_answer(answer)
            except Exception as exc:  # noqa: BLE001 - tracking must not kill the sweep
                Console(stderr=True).print(f"[yellow]MLflow publish failed: {exc}[/yellow]")


def format_early_answer(answer: dict[str, Any]) -> str:
    """The early answer as printed: short lines (readable at 80 columns), each number with what
    it means."""
    config = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in (answer.get("config") or {}).items())
    margin = answer.get("margin")
    p_best = answer.get("probability_best")
    value_error = answer.get("value_error")
    lines = [
        "",
        f"[bold green]Early answer at t̂ = {answer.get('rung')}[/bold green]: predicted best is "
        f"trial {answer.get('trial_id')}",
        f"  config: {config}",
        *([f"  ranked by {answer['order']} (of the predicted finals and the losses at the",
           "    rung, the order with the smaller measured error for this kind of sweep)"]
          if answer.get("order") else []),
        *([f"  P(it is the best of the {answer.get('n_candidates')} trials ranked at this rung): {100 * p_best:.0f}%",
           "    (under the order's measured ranking error)"] if p_best is not None else
          ["  P(best): not stated (no ranking error was measured for this order)"]),
        f"  predicted final loss {answer.get('predicted_final_loss'):.4f} ± {answer.get('uncertainty'):.4f} (1σ)",
        "    the predictor is calibrated for the order of the trials (the keep-margin",
        "    covers it), not for the value"
        + (f"; the value is uncertain by ~{100 * value_error:.1f}%" if value_error else ""),
        f"  keep-margin {answer['margin_text']}" if answer.get("margin_text")
        else f"  kept within margin {margin}" if margin not in (None, 0, 0.0) else "  keep-margin 0",
        *([f"  the margin exceeded the spread of the predicted finals: kept all "
           f"{len(answer.get('kept') or [])} trials"] if answer.get("kept_all") else []),
        f"  compute spent so far: {100 * float(answer.get('compute_fraction', 0.0)):.1f}% "
        "of the full sweep",
        "",
    ]
    # Long parts (the margin's provenance) are wrapped here, between words and indented, so a
    # log or an 80-column terminal never breaks them at the left margin.
    wrapped = [textwrap.fill(line, width=80, subsequent_indent="    ", break_long_words=False,
                             break_on_hyphens=False) if len(line) > 80 and "[" not in line else line
               for line in lines]
    return "\n".join(wrapped)
