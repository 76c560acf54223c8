"""Live progress of a sweep: trials, each one's t̂, rung decisions, current predicted-best.

On a terminal this is a rich live table refreshed at most twice a second; when output is
redirected (CI, logs) it prints a plain line per rung decision and a short status line
every ``log_interval_s`` seconds instead of redrawing.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any, Optional

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table

from hpo.decisions.scheduler_records import TrialStatus


def _fmt(value: Optional[float], digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in config.items() if not str(k).startswith("_"))


def render_table(summary: dict[str, Any]) -> Table:
    """A rich table of the scheduler summary (see ``CollapseScheduler.summary``)."""
    rungs = summary.get("rung_status", [])
    decided = ", ".join(f"{r['fraction']:g}{'✓' if r['decided'] else '…'}" for r in rungs)
    best = summary.get("predicted_best") or {}
    title = (f"collapse-hpo · {summary.get('decision_mode')} · rungs {decided} · compute "
             f"{100 * (summary.get('compute_fraction') or 0):.0f}% of full sweep")
    caption = ""
    if best:
        caption = (f"predicted best: {best['trial_id']} → {_fmt(best['predicted_final_loss'])} "
                   f"± {_fmt(best['uncertainty'])} (t̂ {best['rung']:g})")
    table = Table(title=title, caption=caption, expand=False)
    # The loss column is the metric the scheduler decides on (loss or val_loss).
    for column in ("trial", "config", "t̂", str(summary.get("metric") or "loss"), "pred. final ± σ", "status"):
        table.add_column(column)
    for trial_id, trial in summary.get("trials", {}).items():
        predicted = trial.get("predicted_final_loss")
        pred_text = "–" if predicted is None else f"{predicted:.4f} ± {_fmt(trial.get('uncertainty'))}"
        table.add_row(trial_id, _config_text(trial.get("config") or {}),
                      f"{trial.get('train_fraction') or 0:.2f}", _fmt(trial.get("loss")),
                      pred_text, str(trial.get("verdict")))
    return table


def rung_line(fraction: float, kept: list[str], n_judged: int, predicted_best: Any, current_best: Any) -> str:
    """The announcement of one rung decision, in lines of at most 80 columns (broken between
    trial ids, never inside one)."""
    same = predicted_best == current_best
    lines = [f"rung t̂={fraction:g} decided: kept {len(kept)} of {n_judged}",
             f"  predicted best {predicted_best}" + (" (also the current best)" if same
                                                     else f", current best {current_best}"),
             textwrap.fill("kept: " + ", ".join(kept), width=80, initial_indent="  ", subsequent_indent="    ",
                           break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


class RungAnnouncer:
    """``CollapseScheduler(on_decision=...)``: prints each rung decision the moment it is made,
    so the line comes before the early answer that follows from it. Picklable (Ray Tune
    checkpoints the scheduler with it)."""

    def __init__(self, publish: Optional[Any] = None) -> None:
        self.announced: set[float] = set()
        # Called next with the same decision (the sweep's MLflow publisher, ``hpo.tracking.runs``).
        self.publish = publish

    def __call__(self, decision: dict[str, Any]) -> None:
        fraction = float(decision["fraction"])
        self.announced.add(fraction)
        kept = [str(t) for t in decision.get("kept") or []]
        judged = len(kept) + len(decision.get("stopped") or [])
        Console(soft_wrap=True).print(rung_line(fraction, kept, judged, decision.get("predicted_best"),
                                                decision.get("current_best")), highlight=False)
        if self.publish is not None:
            self.publish(decision)


class SlotUse(tune.Callback):
    """How busy the sweep kept its trial slots: the training seconds its trials reported
    (``time_this_iter_s``, summed over every result of this driver) against wall time × slots.

    Sync rungs can leave slots idle (every survivor waits for the slowest trial of its rung);
    the terminal summary states the measured share so a user sees what the rung waits cost.
    """

    def __init__(self, slots: int) -> None:
        self.slots = max(1, int(slots))
        self.busy_s = 0.0
        self._started = time.monotonic()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.busy_s += float(result.get("time_this_iter_s") or 0.0)

    def utilisation(self) -> dict[str, float]:
        """``{"slots", "wall_s", "busy_s", "share"}``; share = busy / (wall × slots)."""
        wall = max(time.monotonic() - self._started, 1e-9)
        return {"slots": self.slots, "wall_s": wall, "busy_s": self.busy_s,
                "share": min(1.0, self.busy_s / (wall * self.slots))}


class SweepProgress(tune.Callback):
    """Tune callback that shows the scheduler's view of the sweep while it runs."""

    def __init__(self, scheduler: Any, log_interval_s: float = 30.0,
                 announcer: Optional[RungAnnouncer] = None, slots: Optional[int] = None) -> None:
        self.scheduler = scheduler
        # The cluster's trial slots; the line then says how many are busy (trials RUNNING), so
        # a user sees that the slots a rung frees are taken by the next trials at once.
        self.slots = slots
        self._busy = 0
        self.log_interval_s = log_interval_s
        # Rungs the scheduler's on_decision callback already printed (sync/audit, as decided);
        # this callback prints the others (async rungs, rungs decided before a resume).
        self.announcer = announcer
        self._live: Optional[Live] = None
        self._console: Optional[Console] = None
        self._last_draw = 0.0
        self._last_log = 0.0
        self._announced: set[float] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_live"] = None
        state["_console"] = None
        return state

    def _ensure_console(self) -> Console:
        if self._console is None:
            self._console = Console()
            if self._console.is_terminal:
                self._live = Live(console=self._console, refresh_per_second=2, transient=False)
                self._live.start()
        return self._console

    def _update(self, force: bool = False) -> None:
        console = self._ensure_console()
        now = time.time()
        summary = self.scheduler.summary()
        for rung in summary.get("rung_status", []):
            announced = self._announced | (self.announcer.announced if self.announcer else set())
            if rung["decided"] and rung["fraction"] not in announced:
                self._announced.add(rung["fraction"])
                line = rung_line(rung["fraction"], list(rung["survivors"]), rung["n_participants"],
                                 rung["predicted_best"], rung["current_best"])
                (self._live.console if self._live else console).print(line, soft_wrap=True, highlight=False)
        if self._live is not None:
            if force or now - self._last_draw > 0.5:
                self._live.update(render_table(summary))
                self._last_draw = now
        elif force or now - self._last_log > self.log_interval_s:
            self._last_log = now
            trials = summary.get("trials", {})
            running = sum(1 for t in trials.values() if TrialStatus(t["status"]).alive)
            best = summary.get("predicted_best") or {}
            busy = f", {self._busy}/{self.slots} slots busy" if self.slots else ""
            console.print(f"[progress] {len(trials)} trials, {running} in the race{busy}, compute "
                          f"{100 * (summary.get('compute_fraction') or 0):.0f}%, predicted best "
                          f"{best.get('trial_id', '–')}", markup=False, highlight=False,
                          soft_wrap=True)  # one log line each, never wrapped (a wrapped id reads as output)

    def _count_busy(self, trials: list, ending: Any = None) -> None:
        # Ray calls on_trial_complete before it marks the trial TERMINATED: it is no longer busy.
        self._busy = sum(1 for t in trials if t.status == "RUNNING" and t is not ending)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._count_busy(trials)
        self._update()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._count_busy(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._count_busy(trials, ending=trial)
        self._update(force=True)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._update(force=True)
        if self._live is not None:
            self._live.stop()
            self._live = None
