"""Every rule of the keep-rule seam replayed on finished sweeps, and scored: the one replay engine.

``hpo replay`` (``hpo.service.replay``), ``benchmarks/decisions.py`` (banks of the project's
own runs) and ``benchmarks/public_sweeps.py`` (the public 124M logs) all replay and score with
what is here, so a number one prints is the number the others print for the same settings.

* :func:`settings`: every method's settings, each a fresh scheduler per sweep (the keep rules
  of ``hpo.decisions.keep`` in ``CollapseScheduler``, and Ray's median stopping rule);
* :func:`simulate` and :func:`score`: one setting replayed on one sweep in simulated time
  (``hpo.trials.simulator``) and scored → :class:`Row`; :func:`replay_sweeps` does it for every
  setting on every sweep of imported curves;
* :func:`aggregate` (→ :class:`Point`, one per setting) and :func:`frontier`;
* :func:`stop_at_s`: predicted-best against current-best when every trial stops at s.

Definitions (the same for every method, so they compare): **compute** = Σ t̂ trained / n
(1 = every trial to the end); **pick** = the finished trial with the lowest final; **regret** =
its final − the sweep's best final; **within noise** = regret ≤ the noise yardstick (the
seed-to-seed or re-run spread of the final); **kept** = the true best trained to the end.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from predictors import Predictor
from predictors.curves import compute_fraction, is_finished

#: The stop fractions s at which predicted-best and current-best are compared.
FRACTIONS = (0.1, 0.2, 0.3, 0.5)
#: The schedule families a sweep is held out by (``benchmarks/public_sweeps.py``).
FAMILIES = ("cosine", "constant", "wsd-short", "wsd-long", "sqrt")


def schedule_family(curve: Any) -> str:
    """The schedule family of a curve: cosine, constant, WSD with a short (≤ 25%) or long
    linear cooldown, sqrt cooldown; any other schedule is a family of its own."""
    s = curve.controls.schedule
    if s.name == "wsd":
        if getattr(s, "decay_shape", "linear") == "sqrt":
            return "sqrt"
        return "wsd-short" if s.decay_fraction <= 0.25 + 1e-9 else "wsd-long"
    return s.name


@dataclass(frozen=True)
class Setting:
    """One method with one choice of its knobs."""

    method: str
    label: str
    make: Callable[[], Any]  # a fresh scheduler
    default: bool = False


@dataclass
class Row:
    """One setting on one sweep (a replicate: a sweep of one seed)."""

    family: str
    seed: int
    method: str
    setting: str
    default: bool
    compute: float
    regret: Optional[float]
    pick: Optional[str]
    best: str
    within_noise: Optional[bool]
    picked_best: bool
    best_kept: Optional[bool] = None  # the true best trained to the end (survived every rung)
    note: str = ""
    bank: str = ""
    n_trials: int = 0


def _rung_label(rungs: Sequence[float]) -> str:
    return "/".join(f"{r:g}" for r in rungs)


def settings(predictor: Predictor, quick: bool = False) -> list[Setting]:
    """Every method's settings, each a fresh scheduler per replicate. The keep rules
    (``hpo.decisions.keep``: collapse, ASHA, current-best, top-k, the paired test) all run in
    ``CollapseScheduler`` (sync), so one harness replays them the same way; median stopping is
    Ray's own ``MedianStoppingRule`` (it is not a rung rule). ``quick``: a few settings per method,
    the shipped default among them."""
    from ray.tune.schedulers import MedianStoppingRule

    from hpo.decisions.keep import AshaRule, CollapseRule, CurrentBestRule, PairedTestRule, TopKRule
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.trials.sweep_config import SchedulerSettings

    default = SchedulerSettings()

    def scheduler(rule: Any, rungs: Sequence[float], rf: float = 2.0) -> Callable[[], Any]:
        return lambda: CollapseScheduler(predictor=predictor, settings=SchedulerSettings(
            rungs=list(rungs), reduction_factor=rf, margin="calibrated", mode="sync"), rule=rule)

    out: list[Setting] = []
    rung_sets = [(0.1,), (0.2,), (0.3,), (0.05, 0.1, 0.2), (0.1, 0.2), (0.1, 0.2, 0.3), (0.1, 0.3, 0.5),
                 (0.2, 0.3, 0.5)]
    zs, rfs, reads = (0.0, 0.25, 0.5, 1.0, 2.0), (2.0,), (True, False)
    if quick:
        rung_sets, zs, rfs = [tuple(default.rungs)], (0.0, default.rule['margin_z']), (default.reduction_factor,)
    for rungs in rung_sets:
        for z in zs:
            for rf in rfs:
                for read in reads:
                    if (len(rungs) == 1 and rf != rfs[0]) or (z == 0 and not read):
                        continue  # rf only matters with an intermediate rung; z 0 reads nothing
                    is_default = (list(rungs) == list(default.rungs) and z == default.rule['margin_z'] and read
                                  and rf == default.reduction_factor and default.margin == "calibrated")
                    out.append(Setting("collapse", f"rungs {_rung_label(rungs)}, z {z:g}, rf {rf:g}"
                                       + ("" if read else ", calibrated σ only"),
                                       scheduler(CollapseRule(z, read_sweep=read), rungs, rf), default=is_default))
    for grace in ((0.1,) if quick else (0.05, 0.1, 0.2, 0.3)):
        for rf in ((2,) if quick else (2, 3, 4)):
            rungs = [grace * rf ** k for k in range(8) if grace * rf ** k < 0.99]
            out.append(Setting("asha", f"rungs {_rung_label(rungs)} (grace {grace:g}, rf {rf})",
                               scheduler(AshaRule(), rungs, rf)))
    for grace in ((0.1,) if quick else (0.1, 0.2, 0.3)):
        out.append(Setting("median", f"grace {grace:g}", lambda g=grace: MedianStoppingRule(
            metric="loss", mode="min", time_attr="train_fraction", grace_period=g, min_samples_required=3)))
    for s in ((0.1, 0.2) if quick else (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)):
        out.append(Setting("current-best", f"s {s:g}", scheduler(CurrentBestRule(), (s,))))
    for rungs in ([tuple(default.rungs)] if quick else [(0.1,), (0.2,), (0.3,), (0.1, 0.3)]):
        for k in ((1, 2) if quick else (1, 2, 3)):
            out.append(Setting("top-k", f"rungs {_rung_label(rungs)}, k {k}", scheduler(TopKRule(k), rungs)))
    for rungs in ([(0.1, 0.2)] if quick else [(0.1,), (0.2,), (0.1, 0.2), (0.1, 0.2, 0.3), (0.2, 0.3, 0.5)]):
        for z in (2.0,):
            out.append(Setting("paired-test", f"rungs {_rung_label(rungs)}, z {z:g}",
                               scheduler(PairedTestRule(z), rungs)))
    return out


def simulate(setting: Setting, points: Mapping[str, list[dict[str, Any]]]) -> tuple[dict[str, float], Any]:
    """``setting`` replayed on the runs of ``points`` (run id → its results, ``hpo.trials.replay``)
    on 2 workers in simulated time: (run id → the t̂ it reached, the scheduler after the sweep;
    a ``CollapseScheduler``'s ``state.early_answer`` is its early answer)."""
    from hpo.trials.simulator import SimulatedSweep

    scheduler = setting.make()
    return SimulatedSweep(scheduler, dict(points), n_workers=2).run().reached, scheduler


def score(family: str, seed: int, setting: Setting, frame: Any, runs: Sequence[str],
          points: Mapping[str, list[dict[str, Any]]], finals: Mapping[str, float], sigma: Optional[float]) -> Row:
    """One setting replayed on one replicate, scored: compute, pick, regret, within σ_seed, and
    whether the true best trained to the end (kept at every rung: the same test for every method).
    ``frame`` is unused (kept for callers that replay a bank)."""
    best = min(runs, key=lambda r: (finals[r], r))
    try:
        reached, _ = simulate(setting, {r: points[r] for r in runs})
    except Exception as exc:  # noqa: BLE001 - a scheduler that cannot run here is reported, not fatal
        return Row(family, seed, setting.method, setting.label, setting.default, math.nan, None, None, best,
                   None, False, note=f"{type(exc).__name__}: {exc}")
    done = [r for r in runs if is_finished(reached.get(r, 0.0))]
    pick = min(done, key=lambda r: (finals[r], r)) if done else None
    regret = None if pick is None else finals[pick] - finals[best]
    return Row(family, seed, setting.method, setting.label, setting.default, compute_fraction(reached),
               regret, pick, best, None if regret is None or sigma is None else regret <= sigma + 1e-12,
               pick == best, best in done)


@dataclass
class Point:
    """A setting on one family, over its replicates."""

    method: str
    setting: str
    default: bool
    compute: float
    regret: float
    regret_sd: float
    within: int
    n: int
    best_kept: Optional[int] = None


def aggregate(rows: Sequence[Row]) -> dict[str, list[Point]]:
    """family → one Point per setting (settings with a failed replicate are left out)."""
    out: dict[str, list[Point]] = {}
    keys = dict.fromkeys((r.family, r.method, r.setting) for r in rows)
    for family, method, label in keys:
        mine = [r for r in rows if (r.family, r.method, r.setting) == (family, method, label)]
        if any(r.regret is None or not math.isfinite(r.compute) for r in mine):
            continue
        regrets = np.array([r.regret for r in mine], dtype=float)
        kept = [r.best_kept for r in mine if r.best_kept is not None]
        out.setdefault(family, []).append(Point(
            method, label, mine[0].default, float(np.mean([r.compute for r in mine])), float(regrets.mean()),
            float(regrets.std(ddof=1)) if len(mine) > 1 else 0.0, sum(bool(r.within_noise) for r in mine), len(mine),
            sum(kept) if kept else None))
    return out


def frontier(points: Sequence[Point], method: str, budget: float) -> Optional[Point]:
    """The lowest mean regret among ``method``'s settings with mean compute ≤ ``budget``
    (ties: less compute)."""
    mine = [p for p in points if p.method == method and p.compute <= budget + 1e-9]
    return min(mine, key=lambda p: (p.regret, p.compute)) if mine else None


def sweep_points(members: Sequence[Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """(run name → its replayed results, run name → its final loss) of a sweep of imported curves."""
    from hpo.trials.replay import curve_points

    return ({c.meta["name"]: curve_points(c) for c in members}, {c.meta["name"]: c.final_loss for c in members})


def replay_sweeps(predictor: Predictor, sweeps: Mapping[str, Sequence[Any]], noise: Optional[float], *,
                  quick: bool = False, every: Optional[Sequence[Setting]] = None,
                  progress: Optional[Callable[[str, int, int], None]] = None) -> list[Row]:
    """Every setting (``every``, default :func:`settings`) replayed on every sweep of imported
    curves (sweep name → its curves, ``hpo.trials.replay.curve_sweeps``); one :class:`Row` a sweep ×
    setting, ``bank`` its schedule family and ``n_trials`` its runs. ``progress(sweep, i, n)``
    after each sweep."""
    every = list(every) if every is not None else settings(predictor, quick=quick)
    rows = []
    for i, (name, members) in enumerate(sweeps.items()):
        points, finals = sweep_points(members)
        for setting in every:
            row = score(name, 0, setting, None, sorted(points), points, finals, noise)
            row.bank, row.n_trials = schedule_family(members[0]), len(members)
            rows.append(row)
        if progress is not None:
            progress(name, i + 1, len(sweeps))
    return rows


def stop_at_s(predictor: Predictor, sweeps: Mapping[str, Sequence[Any]], noise: Optional[float],
              fractions: Sequence[float] = FRACTIONS) -> list[dict[str, Any]]:
    """Per sweep and s: every trial stopped at s, then predicted-best (the lowest predicted final,
    ``predictors.prediction.predict_at_rung``) and current-best (the lowest loss at s) scored
    against the true finals: regret, the MAE of the predicted finals, and the pairs of arms each
    orders unlike the true finals. A sweep with a run that cannot be predicted at s is left out at s."""
    from predictors.prediction import predict_at_rung

    rows = []
    for name, members in sweeps.items():
        points, finals = sweep_points(members)
        best = min(finals, key=finals.get)
        for s in fractions:
            seen = {}
            for run, pts in points.items():
                pred = predict_at_rung(predictor, [p["train_fraction"] for p in pts],
                                       [p["loss"] for p in pts], pts[0], s)
                seen[run] = (pred.final_loss, pred.loss)
            if any(v[0] is None or v[1] is None for v in seen.values()):
                continue
            pick_pred = min(seen, key=lambda r: seen[r][0])
            pick_loss = min(seen, key=lambda r: seen[r][1])
            pairs = list(itertools.combinations(finals, 2))
            wrong = {k: sum(np.sign(seen[a][i] - seen[b][i]) != np.sign(finals[a] - finals[b]) for a, b in pairs)
                     for i, k in enumerate(("pred", "loss"))}
            rows.append({
                "sweep": name, "family": schedule_family(members[0]), "s": s, "arms": len(members),
                "predicted_best": pick_pred, "current_best": pick_loss, "best": best,
                "regret_predicted": finals[pick_pred] - finals[best], "regret_current": finals[pick_loss] - finals[best],
                "mae_predicted": float(np.mean([abs(seen[r][0] - finals[r]) / finals[r] for r in finals])),
                "pairs": len(pairs), "pairs_misordered_predicted": int(wrong["pred"]),
                "pairs_misordered_loss": int(wrong["loss"]), "noise": noise})
    return rows


def stop_at_s_counts(rows: Sequence[Mapping[str, Any]], s: float, noise: float) -> tuple[int, int, int]:
    """(predicted-best within noise, current-best within noise, sweeps) among the rows at ``s``."""
    mine = [r for r in rows if r["s"] == s]
    return (sum(r["regret_predicted"] <= noise + 1e-12 for r in mine),
            sum(r["regret_current"] <= noise + 1e-12 for r in mine), len(mine))
