"""The early answer: the predicted-best config, announced the moment the last rung is decided.

What it says is composed here (:func:`compose_early_answer`, :func:`revise`) from the last
rung's record: the decision the configured rule made there (``RungRecord.record``); ``CollapseScheduler`` only decides when. It is
printed to the terminal, written to ``<output>/predicted_best.json`` and published on the
MLflow parent run (tags and a JSON artifact, ``hpo.tracking.runs.SweepTracker.publish_early_answer``),
while the surviving trial keeps training.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, Mapping, Optional

from rich.console import Console

from hpo.decisions.keep.evidence import rank_key, score
from predictors.ranking import Order, probability_best
from hpo.decisions.scheduler_records import RungRecord, TrialRecord
from predictors.kinds import SWEEP_KINDS
from predictors.io import atomic_write_json, json_safe


def compose_early_answer(
    rung: RungRecord, trials: Mapping[str, TrialRecord], *, margin_text: str, predictor: Any, decision_mode: str,
    compute_fraction: float, decided_at: str, metric: str = "loss",
) -> Optional[dict[str, Any]]:
    """The early answer from the last rung's record, whatever rule decided it: its pick (the
    trial the rule ranked best, while it survives; else the best survivor in the rule's order),
    P(best) among the trials ranked there in that order with the σ the rule used (None: that
    order's error is unknown), the predictor's value error for the pick, and what the rung was
    decided with (``metric``: the loss ranked, ``scheduler.metric``). None when no survivor has
    a prediction."""
    kept = [rung.entries[t] for t in rung.survivors if rung.entries[t].predicted_final_loss is not None]
    if not kept:
        return None
    weight = rung.order_weight
    best = next((e for e in kept if e.trial_id == rung.predicted_best), None) or \
        min(kept, key=lambda e: rank_key(e.candidate(), weight))
    # P(best) among the trials ranked at this rung, by the rule's order: each score normal with
    # the order's σ / √2 (a pair's difference has σ).
    ranked = [e for e in rung.entries.values() if e.predicted_final_loss is not None]
    probability = None
    if rung.sigma:
        p_best = probability_best([score(e.candidate(), weight) for e in ranked],
                                  [rung.sigma / math.sqrt(2)] * len(ranked))
        probability = dict(zip([e.trial_id for e in ranked], p_best)).get(best.trial_id)
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
        "order": Order(weight, None, "").name, "order_weight": weight, "order_words": rung.margin_source,
        "kept_all": bool(rung.kept_all), "compute_fraction": compute_fraction,
        "rung": rung.fraction, "kept": list(rung.survivors), "current_best": rung.current_best,
        "decision_mode": decision_mode, "decided_at": decided_at, "metric": metric,
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


def config_words(config: Optional[Mapping[str, Any]]) -> str:
    """A trial's config as the user wrote it in the sweep: ``lr=0.005, batch_size=2048``."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (config or {}).items())


def order_line(answer: Mapping[str, Any]) -> Optional[str]:
    """Which order decided the last rung and why, in one plain sentence (None for an answer
    that does not record its order). The evidence behind it (pairs ordered right, the ranking
    scale, the folds) is in ``margin_text``, which goes to report.md and the decision log."""
    order = answer.get("order")
    if not order:
        return None
    if "fixed margin" in str(answer.get("margin_text") or ""):
        return "ranked by the predicted finals (a fixed keep-margin was set)"
    words = str(answer.get("order_words") or "")
    if words and not words.startswith("order:"):  # another keep rule (scheduler.rule) decided
        return f"ranked by the sweep's keep rule ({words})"
    label = SWEEP_KINDS.get(str(answer.get("kind")))
    kind = f"{label.split(' (')[0]} sweeps" if label else "this kind of sweep"
    weight = float(answer.get("order_weight") if answer.get("order_weight") is not None else 1.0)
    # Calibration chose the order (the predicted finals, the losses so far or a blend) that
    # ordered held-out sweeps of this kind best: that measurement is the "why".
    order_words = ("the predicted finals" if weight >= 1.0 else "the losses so far" if weight <= 0.0
                   else "a blend of predicted finals and losses so far")
    return f"ranked by {order_words}: measured the better order on {kind}"


def early_answer_lines(answer: Mapping[str, Any]) -> list[str]:
    """The early answer in plain words, at most six short lines: the pick and its config, its
    predicted final ± error, P(best), compute so far, which order decided and why. Every number
    behind them is in report.md and the rung's decision log, not here."""
    rung = answer.get("rung")
    header = (f"Early answer (at {100 * float(rung):.0f}% of training): " if rung is not None else "Early answer: ") \
        + f"trial {answer.get('trial_id')}, {config_words(answer.get('config'))}"
    revised = answer.get("revised")
    if isinstance(revised, dict):
        header += f" (revised: replaces {revised.get('from')})"
    unc = answer.get("uncertainty")
    predicted = answer.get("predicted_final_loss")
    # Which loss decided: the training loss (an answer without the key: written before it was
    # recorded, always the training loss) or the validation loss.
    loss = "validation loss" if answer.get("metric") == "val_loss" else "loss"
    lines = [header,
             f"  predicted final {loss} {predicted:.4f}" + (f" ± {unc:.4f}" if unc is not None else "")
             if predicted is not None else f"  predicted final {loss}: none"]
    p_best = answer.get("probability_best")
    lines.append(f"  P(best): {100 * p_best:.0f}% among the {answer.get('n_candidates')} trials compared last"
                 if p_best is not None else "  P(best): not stated (this order's error was never measured)")
    lines.append(f"  compute so far: {100 * float(answer.get('compute_fraction') or 0.0):.1f}% of the full sweep")
    if (why := order_line(answer)) is not None:
        lines.append("  " + why)
    return lines


def format_early_answer(answer: dict[str, Any]) -> str:
    """The early answer as printed (rich markup on the first line; every line within 80
    columns, a long one wrapped between words and indented)."""
    lines = early_answer_lines(answer)
    wrapped = [textwrap.fill(line, width=80, subsequent_indent="    ", break_long_words=False,
                             break_on_hyphens=False) for line in lines]
    first, _, rest = wrapped[0].partition(":")
    wrapped[0] = f"[bold green]{first}[/bold green]:{rest}"
    return "\n".join(["", *wrapped, ""])


def early_answer_text(answer: dict[str, Any]) -> str:
    """The early answer as plain text (no markup): MLflow tags and descriptions, ``hpo status``."""
    return "\n".join(early_answer_lines(answer))
