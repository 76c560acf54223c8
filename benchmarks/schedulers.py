"""Compare early-stopping methods on real curves: replay every sweep of a curve bank through Ray Tune.

For each sweep (group of runs) in the bank, each method picks a run; the bank knows every
run's final loss, so the pick's regret is exact. Methods:

* ``collapse``: ``hpo.scheduler.CollapseScheduler`` (sync, rungs ``--rungs``, reduction
  factor 2, margin 0) with the predictor ``--predictor``;
* ``collapse-calibrated``: the same with the default keep-margin (``margin="calibrated"``:
  every trial within the predictor's calibrated decision error of the predicted best is kept);
* ``collapse-margin``: the same with a margin of ``--margin`` combined σ at every rung;
* ``asha``: Ray's ``ASHAScheduler(time_attr="train_fraction", max_t=1.0, grace_period=0.1,
  reduction_factor=2)``. In Ray 2.60 its milestones are grace·rf^k for
  k < int(log(max_t/grace)/log(rf) + 1), i.e. t̂ = 0.1, 0.2, 0.4, 0.8 (floats work: a trial
  is judged at its first result with t̂ ≥ milestone, against the median of the losses recorded
  there so far; the first arrival at a rung always continues). ASHA is asynchronous, so with
  2 trials running at once its result depends on arrival order and can change between runs;
* ``median``: Ray's ``MedianStoppingRule(time_attr="train_fraction", grace_period=0.1,
  min_samples_required=3)`` (with too few peers and trials waiting it PAUSEs, so the replay
  trainable checkpoints);
* ``current-best@f`` for f in ``--fractions`` (no Ray): the lowest smoothed loss at f, then
  only that run is finished.

Every Ray method runs with ``ReplayTrainable`` (``hpo.replay``), 2 concurrent trials (1 CPU
each on a 2-CPU Ray instance), ``reuse_actors=True``, one ``ray.init`` for the whole benchmark.

Printed per sweep: the runs (τ, final loss), then per method: compute (Σ t̂ reached / n; 1 =
the full sweep), pick, regret (final loss of the pick − best final loss of the sweep), whether
it picked the best, and (where the bank has repeated seeds of a configuration) whether the
regret is within 1 seed-noise std ("tie"). Then an aggregate table. Written to ``--out``:
``schedulers.csv`` (one row per sweep × method), ``trials.csv`` (t̂ reached per run) and
``schedulers.md``.

Sweeps come from the bank's ``sweep`` column split by ``--group-by`` columns, or from a
calibration config's named ``sweeps`` (``--config``): one sweep per name and replicate seed.

Usage:
    python benchmarks/schedulers.py --bank configs/calibration/default_bank.parquet --group-by tokens_per_param
    python benchmarks/schedulers.py --config configs/calibration/audit.yaml   # held-out audit sweeps
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.curve_bank import load_bank  # noqa: E402
from hpo.replay import (  # noqa: E402
    MethodOutcome,
    bank_sweeps,
    current_best_at,
    outcome_from_reached,
    replay_sweep,
    seed_noise,
    true_finals,
)

RAY_METHODS = ("collapse", "collapse-calibrated", "collapse-margin", "asha", "median")
#: Per sweep, the CollapseScheduler's predictions table (filled by a run, for the markdown).
collapse_tables: dict[str, str] = {}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bank", default=None, help="curve bank parquet (default: the --config's bank)")
    p.add_argument("--config", default=None,
                   help="calibration YAML whose named `sweeps` × seeds define the sweeps (instead of --group-by)")
    p.add_argument("--group-by", nargs="*", default=[],
                   help="columns that split a bank sweep into sweeps (e.g. tokens_per_param seed)")
    p.add_argument("--predictor", default="configs/predictors/default.json", help="predictor JSON")
    p.add_argument("--rungs", nargs="+", type=float, default=[0.1, 0.2, 0.3],
                   help="CollapseScheduler decision fractions")
    p.add_argument("--fractions", nargs="+", type=float, default=[0.1, 0.2, 0.3],
                   help="stop fractions of the current-best rule")
    p.add_argument("--sweeps", nargs="*", default=[],
                   help="run only the sweeps whose name contains one of these strings")
    p.add_argument("--methods", nargs="+", default=[*RAY_METHODS, "current-best"],
                   choices=[*RAY_METHODS, "current-best"], help="methods to run")
    p.add_argument("--loss-column", default="smoothed_loss",
                   help="bank column replayed as `loss` (smoothed_loss; train_loss only for old banks)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="keep-margin of `collapse-margin`, in combined standard deviations")
    p.add_argument("--out", default="runs/benchmarks/schedulers", help="output directory")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance (1 per trial)")
    return p.parse_args(argv)


def make_scheduler(method: str, args: argparse.Namespace, predictor: Any, state_path: Path) -> Any:
    from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule

    from hpo.scheduler import CollapseScheduler

    if method == "collapse":
        state_path.unlink(missing_ok=True)  # an old state would be restored, not rerun
        return CollapseScheduler(predictor=predictor, metric="loss", mode="min", rungs=tuple(args.rungs),
                                 reduction_factor=2, margin=0.0, decision_mode="sync",
                                 state_path=state_path)
    if method == "collapse-calibrated":
        state_path.unlink(missing_ok=True)
        return CollapseScheduler(predictor=predictor, metric="loss", mode="min", rungs=tuple(args.rungs),
                                 reduction_factor=2, margin="calibrated", decision_mode="sync",
                                 state_path=state_path)
    if method == "collapse-margin":
        # Keep every trial whose predicted final is within `--margin` combined standard
        # deviations (alignment residual + calibrated decision error) at every rung.
        state_path.unlink(missing_ok=True)
        return CollapseScheduler(predictor=predictor, metric="loss", mode="min", rungs=tuple(args.rungs),
                                 reduction_factor=2, margin={r: args.margin for r in args.rungs},
                                 decision_mode="sync", state_path=state_path)
    if method == "asha":
        return ASHAScheduler(time_attr="train_fraction", max_t=1.0, grace_period=0.1, reduction_factor=2)
    if method == "median":
        return MedianStoppingRule(time_attr="train_fraction", grace_period=0.1, min_samples_required=3)
    raise ValueError(method)


def asha_milestones() -> list[float]:
    from ray.tune.schedulers import ASHAScheduler

    sched = ASHAScheduler(time_attr="train_fraction", max_t=1.0, grace_period=0.1, reduction_factor=2)
    try:  # private attributes, read for the printed header only
        return sorted(round(m, 12) for m, _ in sched._brackets[0]._rungs)
    except Exception:  # noqa: BLE001
        return []


# ---------------------------------------------------------------------- tables


def _f(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (also readable as plain text)."""
    cells = [[str(h) for h in headers]] + [[_f(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def runs_table(frame: Any, run_ids: Sequence[str], finals: dict[str, float], fractions: Sequence[float],
               loss_column: str) -> str:
    from hpo.replay import loss_at

    info = frame.drop_duplicates("run_id").set_index("run_id")
    order = sorted(run_ids, key=lambda r: finals[r])
    rows = []
    for rank, r in enumerate(order, 1):
        at = [loss_at(frame, r, f, loss_column)[1] for f in fractions]
        rows.append([rank, r, f"{float(info.loc[r, 'tau']):g}", f"{float(info.loc[r, 'weight_decay']):.4g}",
                     int(info.loc[r, "seed"]), *at, finals[r]])
    return table(["rank", "run", "tau", "λ", "seed", *[f"loss@{f:g}" for f in fractions], "final"], rows)


def predictions_table(state_path: Path, finals: dict[str, float], taus: dict[str, float]) -> str:
    """The CollapseScheduler's predicted final loss of every trial at every rung it reached,
    against the true final loss, with the rung decision (from its state file)."""
    from hpo.scheduler_state import SchedulerState

    state = SchedulerState.load(state_path)
    run_of = {tid: str(rec.config.get("run_id")) for tid, rec in state.trials.items()}
    rows = []
    for tid in sorted(run_of, key=lambda t: finals[run_of[t]]):
        run = run_of[tid]
        cells: list[Any] = [run, f"{taus[run]:g}", finals[run]]
        for rung in state.rungs:
            e = rung.entries.get(tid)
            if e is None or e.predicted_final_loss is None:
                cells.append("")
                continue
            err = e.predicted_final_loss / finals[run] - 1.0
            cells.append(f"{e.predicted_final_loss:.4f}±{(e.uncertainty or 0):.4f} ({err:+.1%}) {e.decision}")
        rows.append(cells)
    return table(["run", "tau", "final", *[f"predicted @{r.fraction:g} (error) decision" for r in state.rungs]], rows)


def _reached(o: MethodOutcome) -> str:
    """The t̂ each trial reached, sorted, e.g. ``0.10 0.10 0.20 0.31 1.00``."""
    return " ".join(f"{t:.2f}" for t in sorted(o.reached.values()))


def outcome_rows(outcomes: Sequence[MethodOutcome]) -> list[list[Any]]:
    return [[o.method, o.compute, o.pick, o.regret, o.picked_best, o.tie, f"{o.wall_s:.1f}"] for o in outcomes]


OUTCOME_HEADERS = ["method", "compute", "pick", "regret", "picked best", "tie (≤1σ seed)", "wall s"]


def aggregate(outcomes: Sequence[MethodOutcome]) -> list[list[Any]]:
    methods: list[str] = []
    for o in outcomes:
        if o.method not in methods:
            methods.append(o.method)
    rows = []
    for m in methods:
        mine = [o for o in outcomes if o.method == m]
        regrets = [o.regret for o in mine if o.regret is not None]
        ties = [o.tie or o.picked_best for o in mine if o.tie is not None]
        rows.append([
            m, len(mine),
            sum(regrets) / len(regrets) if regrets else None,
            max(regrets) if regrets else None,
            sum(o.compute for o in mine) / len(mine),
            sum(o.picked_best for o in mine) / len(mine),
            (sum(ties) / len(ties)) if ties else None,
        ])
    return rows


AGG_HEADERS = ["method", "sweeps", "mean regret", "max regret", "mean compute", "frac picked best",
               "frac best-or-tie"]


# ---------------------------------------------------------------------- main


def config_sweeps(config: Any, frame: Any) -> dict[str, list[str]]:
    """A calibration config's named sweeps, one per replicate seed: {name[seed=k]: run ids}."""
    if not config.sweeps:
        raise SystemExit(f"calibration {config.name!r}: no named `sweeps` to replay")
    banked = set(frame["run_id"]) if len(frame) else set()
    wanted: dict[str, list[str]] = {}
    for run in config.sweep_runs():
        wanted.setdefault(f"{run.sweep}[seed={run.seed}]", []).append(run.run_id)
    out: dict[str, list[str]] = {}
    for key, run_ids in wanted.items():
        missing = [r for r in run_ids if r not in banked]
        if missing:
            # A sweep with runs missing is a different sweep: replaying it would flatter or
            # punish methods arbitrarily, so it is left out until the bank is complete.
            print(f"[{key}] skipped: {len(missing)} of {len(run_ids)} runs not in the bank (yet)")
        else:
            out[key] = run_ids
    return out


def run(args: argparse.Namespace) -> list[MethodOutcome]:
    calibration = None
    if args.config:
        from hpo.calibrate import load_calibration_config

        calibration = load_calibration_config(args.config)
        args.bank = args.bank or calibration.bank
    if not args.bank:
        raise SystemExit("give --bank or --config")
    bank = Path(args.bank)
    frame = load_bank(bank)
    if not len(frame):
        raise SystemExit(f"{bank}: empty or missing curve bank")
    if frame[args.loss_column].notna().sum() == 0:
        raise SystemExit(f"{bank}: column {args.loss_column!r} is all NaN (old bank? try --loss-column train_loss)")
    out = Path(args.out)
    (out / "states").mkdir(parents=True, exist_ok=True)
    finals = true_finals(frame, args.loss_column)
    sweeps = config_sweeps(calibration, frame) if calibration is not None else bank_sweeps(frame, args.group_by)
    if args.sweeps:
        sweeps = {k: v for k, v in sweeps.items() if any(s in k for s in args.sweeps)}
    ray_methods = [m for m in args.methods if m in RAY_METHODS]

    predictor = None
    if any(m.startswith("collapse") for m in ray_methods):
        from predictors import Predictor

        predictor = Predictor.load(args.predictor)
    print(f"bank {bank}: {len(finals)} completed runs in {len(sweeps)} sweep(s); loss = {args.loss_column}")
    if predictor is not None:
        print(f"predictor {args.predictor}: {predictor!r}")
    print(f"collapse rungs {args.rungs} (sync, rf 2, margin 0); ASHA milestones {asha_milestones()}; "
          f"median stopping grace 0.1, min samples 3; current-best at {args.fractions}")

    own_ray = False
    if ray_methods:
        import ray

        if not ray.is_initialized():
            started = time.monotonic()
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
            own_ray = True
            print(f"ray.init: {time.monotonic() - started:.1f} s")
    storage = tempfile.TemporaryDirectory(prefix="bench-schedulers-")  # Ray trial dirs, checkpoints
    try:
        outcomes, trial_rows = _run_sweeps(args, bank, frame, finals, sweeps, ray_methods, predictor,
                                           out, Path(storage.name))
    finally:
        storage.cleanup()
        if own_ray:
            import ray

            ray.shutdown()
    if not outcomes:
        raise SystemExit("no sweep with at least 2 completed runs")
    print("\naggregate over sweeps:")
    agg = aggregate(outcomes)
    print(table(AGG_HEADERS, agg))
    write_outputs(out, args, outcomes, trial_rows, agg, frame, finals, sweeps)
    print(f"\nwrote {out / 'schedulers.csv'}, {out / 'trials.csv'}, {out / 'schedulers.md'}")
    return outcomes


def _run_sweeps(args: argparse.Namespace, bank: Path, frame: Any, finals: dict[str, float],
                sweeps: dict[str, list[str]], ray_methods: list[str], predictor: Any, out: Path,
                storage: Path) -> tuple[list[MethodOutcome], list[dict[str, Any]]]:
    taus = {str(r): float(t) for r, t in frame.drop_duplicates("run_id")[["run_id", "tau"]].itertuples(index=False)}
    outcomes: list[MethodOutcome] = []
    trial_rows: list[dict[str, Any]] = []
    collapse_tables.clear()
    for sweep, run_ids in sweeps.items():
        run_ids = [r for r in run_ids if r in finals]
        if len(run_ids) < 2:
            print(f"[{sweep}] skipped: {len(run_ids)} run(s) with a final loss")
            continue
        noise = seed_noise(frame, run_ids, args.loss_column, finals)
        sweep_out: list[MethodOutcome] = []
        print(f"\n=== sweep {sweep}: {len(run_ids)} runs; seed noise "
              + (f"{noise.std:.4f} (std over {noise.n_configs} config(s), {noise.n_runs} runs)"
                 if noise.std is not None else "n/a (no repeated seeds)"))
        print(runs_table(frame, run_ids, finals, sorted(set(args.fractions) | set(args.rungs)), args.loss_column))
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", sweep)
        for method in ray_methods:
            started = time.monotonic()
            scheduler = make_scheduler(method, args, predictor, out / "states" / f"{safe}.{method}.json")
            reached, errors = replay_sweep(bank, run_ids, scheduler, name=f"{safe}-{method}",
                                           storage_path=storage, loss_column=args.loss_column)
            o = outcome_from_reached(sweep, method, reached, finals, noise.std,
                                     note="; ".join(errors))
            o.wall_s = time.monotonic() - started
            sweep_out.append(o)
            print(f"  [{sweep}] {method:<18} {o.wall_s:6.1f} s  compute {o.compute:.3f}  pick {o.pick}  "
                  f"regret {_f(o.regret)}  t̂ reached {_reached(o)}" + (f"  ERRORS: {o.note}" if errors else ""),
                  flush=True)
            if method == "collapse":
                state_path = out / "states" / f"{safe}.collapse.json"
                if state_path.exists():
                    collapse_tables[sweep] = predictions_table(state_path, finals, taus)
                    print(collapse_tables[sweep])
        if "current-best" in args.methods:
            for f in args.fractions:
                started = time.monotonic()
                o = current_best_at(frame, run_ids, f, loss_column=args.loss_column, sweep=sweep,
                                    noise=noise.std, finals=finals)
                o.wall_s = time.monotonic() - started
                sweep_out.append(o)
                print(f"  [{sweep}] {o.method:<18} {o.wall_s:6.1f} s  compute {o.compute:.3f}  pick {o.pick}  "
                      f"regret {_f(o.regret)}", flush=True)
        print(f"\nsweep {sweep} (best {sweep_out[0].best}, final {sweep_out[0].best_final:.4f}):")
        print(table(OUTCOME_HEADERS, outcome_rows(sweep_out)))
        for o in sweep_out:
            for r, t in sorted(o.reached.items()):
                trial_rows.append({"sweep": sweep, "method": o.method, "run_id": r, "tau": taus[r],
                                   "train_fraction_reached": t, "final": finals[r], "picked": r == o.pick})
        outcomes.extend(sweep_out)
    return outcomes, trial_rows


def write_outputs(out: Path, args: argparse.Namespace, outcomes: Sequence[MethodOutcome],
                  trial_rows: list[dict[str, Any]], agg: list[list[Any]], frame: Any,
                  finals: dict[str, float], sweeps: dict[str, list[str]]) -> None:
    rows = [o.row() for o in outcomes]
    with open(out / "schedulers.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "trials.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["sweep", "method", "run_id", "tau", "train_fraction_reached",
                                                "final", "picked"])
        writer.writeheader()
        writer.writerows(trial_rows)
    lines = [
        "# Early-stopping methods on replayed curves",
        "",
        f"Bank `{args.bank}` (loss column `{args.loss_column}`), group-by {args.group_by or '(sweep only)'}, "
        f"predictor `{args.predictor}`, collapse rungs {args.rungs}.",
        "compute = Σ t̂ reached / n (1 = full sweep); regret = final loss of the pick − best final loss; "
        "tie = regret within 1 seed-noise std (n/a without repeated seeds).",
        "",
    ]
    for sweep in dict.fromkeys(o.sweep for o in outcomes):
        mine = [o for o in outcomes if o.sweep == sweep]
        run_ids = [r for r in sweeps[sweep] if r in finals]
        lines += [f"## {sweep}", "", runs_table(frame, run_ids, finals,
                                                 sorted(set(args.fractions) | set(args.rungs)), args.loss_column),
                  "", table(OUTCOME_HEADERS, outcome_rows(mine)), ""]
        if sweep in collapse_tables:
            lines += ["CollapseScheduler predictions:", "", collapse_tables[sweep], ""]
    lines += ["## Aggregate", "", table(AGG_HEADERS, agg), ""]
    (out / "schedulers.md").write_text("\n".join(lines))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
