"""The early answer: the predicted-best config, announced the moment the last rung is decided.

Printed to the terminal, written to ``<output>/predicted_best.json`` and published on the
MLflow parent run (tags and a JSON artifact, ``hpo.tracking.SweepTracker.publish_early_answer``),
while the surviving trial keeps training.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from predictors.io import atomic_write_json


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
