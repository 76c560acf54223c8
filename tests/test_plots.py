"""The report's figures (hpo/reporting/plots.py): readable at 100% zoom, and never an empty box."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from hpo.reporting.plots import plot_rung_predictions
from hpo.decisions.scheduler_state import RungEntry, RungRecord


def _entry(tid: str, final: float, decision: str) -> RungEntry:
    return RungEntry(trial_id=tid, train_fraction=0.1, smoothed_loss=final + 0.5, n_points=10,
                     predicted_final_loss=final, uncertainty=0.03, decision=decision)


def test_default_sweep_figure_shows_rung_predictions_and_decisions(tmp_path: Path) -> None:
    # Without audit the regret is unknowable; regret.png then shows each trial's predicted final
    # ±1σ at each rung, kept (filled) or stopped (hollow), and the true finals that exist. It
    # differs from the "nothing to draw" figure and fits a screen at 100% zoom.
    rungs = [RungRecord(index=0, fraction=0.1, decided=True,
                        entries={"a": _entry("a", 1.70, "keep"), "b": _entry("b", 1.80, "keep"),
                                 "c": _entry("c", 1.95, "stop")}),
             RungRecord(index=1, fraction=0.3, decided=True,
                        entries={"a": _entry("a", 1.68, "keep"), "b": _entry("b", 1.79, "stop")})]
    labels = {"a": "lr=0.005, τ=0.3", "b": "lr=0.01, τ=0.3", "c": "lr=0.04, τ=0.3"}
    drawn = plot_rung_predictions(rungs, labels, {"a": 1.71}, tmp_path / "regret.png")
    empty = plot_rung_predictions([RungRecord(index=0, fraction=0.1)], labels, {}, tmp_path / "empty.png")
    width, height = Image.open(drawn).size
    assert width <= 2000 and height <= 1200
    assert drawn.read_bytes() != empty.read_bytes()
    assert drawn.stat().st_size > 1.3 * empty.stat().st_size  # points, bars and labels, not one sentence


def test_a_large_sweep_is_coloured_by_its_searched_value_not_a_legend_per_trial(tmp_path: Path) -> None:
    # 30 trials would need 30 legend entries over the curves: they are coloured by the searched
    # value that spreads most (lr, in log; batch_size is fixed), with a colour bar; a small sweep
    # keeps one distinct colour and legend entry per trial.
    import numpy as np

    from hpo.reporting.plots import LEGEND_MAX, plot_curves, trial_palette
    from hpo.decisions.scheduler_state import TrialRecord

    lrs = np.geomspace(1e-3, 0.3, 30)
    configs = {f"t{i:02d}": {"lr": float(lr), "batch_size": 32, "schedule": "linear"} for i, lr in enumerate(lrs)}
    palette = trial_palette(configs)
    assert palette.by_value and palette.key == "lr" and palette.mappable is not None
    # Colour follows lr monotonically (viridis: the green channel rises with the value).
    greens = [palette.colors[f"t{i:02d}"][1] for i in range(30)]
    assert all(a < b for a, b in zip(greens, greens[1:]))
    small = trial_palette({k: configs[k] for k in list(configs)[:LEGEND_MAX]})
    assert not small.by_value and len({tuple(c) for c in small.colors.values()}) == LEGEND_MAX

    t = np.linspace(0.01, 1.0, 50)
    trials = [TrialRecord(trial_id=tid, order=i, config=cfg, status="completed" if i == 15 else "stopped",
                          stopped_at=None if i == 15 else 0.1, history=[[a, 2.0 + 1.0 / (a * 10 + 1)] for a in t])
              for i, (tid, cfg) in enumerate(configs.items())]
    drawn = plot_curves(trials, {tid: f"lr={c['lr']:.3g}" for tid, c in configs.items()}, [0.1], tmp_path / "c.png")
    width, height = Image.open(drawn).size
    assert width <= 2000 and height <= 1200
