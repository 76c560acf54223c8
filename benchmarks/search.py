"""Search and stopping together, on replayed curves: a tabular benchmark of the sweep's searcher.

A bank whose runs form a grid (every configuration run to the end with several seeds) is a
table: a searcher picks a configuration among the grid's values, the replay returns that
configuration's banked curve (of the searcher seed's replicate), and the scheduler sees it
result by result in simulated time (``hpo.trials.simulator.SimulatedSweep``, 2 slots; a new
trial is suggested when a slot frees, as ``hpo sweep`` does with ``search.max_concurrent``).

Methods (searcher + scheduler):

* ``tpe+collapse (predicted)``: the sweep's searcher (``hpo.trials.search.build_search_alg``:
  Optuna TPE in ``PredictedFinalSearcher``) with the ``CollapseScheduler`` (async, the
  default rungs, margin and rule): a stopped trial is told to TPE with its predicted final.
* ``tpe+collapse (truncated)``: the same, TPE told the loss at the stop.
* ``random+collapse``, ``random+asha``, ``tpe+asha`` (Ray's ``ASHAScheduler``: grace 0.1,
  reduction factor 2, on t̂; a stopped trial tells its loss at the stop) and ``tpe (no stopping)``.

TPE: ``n_startup_trials`` 5 (random draws first), the space ``choice`` of the grid's values
per dimension (what a sweep's ``choice:`` gives Optuna: categorical).

Definitions. Compute: Σ t̂ reached over the trials, in full runs (1 = one configuration
trained to the end; the grid once = its number of configurations). A configuration's true
value: its final loss averaged over the bank's seeds; the grid's best is the lowest.
Recommendation at compute C: the finished trial with the lowest final loss seen when C had
been spent (a stopped trial is never recommended; none finished: no recommendation, regret
infinite). Regret: true value of the recommendation minus the grid's best. σ_seed: the pooled
seed std of the final loss (``hpo.trials.replay.seed_noise``). Compute to the target: the
smallest C at which ≥ 90% of searcher seeds have regret ≤ σ_seed (missed when the budget ends
first).

Banks (``--bank``, repeatable): by default the 50-configuration grid
(``configs/calibration/search_grid.yaml``: 5 η x 5 λ x 2 B, 24K parameters) then the
25-configuration one (``decisions_grid.yaml``: 5 η x 5 λ, 0.1M parameters), one section each.

Run: ``python benchmarks/search.py`` (writes benchmarks/search.md and one plot per bank,
benchmarks/search_grid.png and search_decisions_grid.png; ``--seeds 20 --budget-grids 1`` are the defaults; ``--quick`` for
4 seeds).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from ray.tune.experiment import Trial  # noqa: E402

from hpo.trials.replay import run_points, seed_noise, true_finals  # noqa: E402
from hpo.trials.simulator import SimulatedSweep  # noqa: E402

CALIBRATION = REPO_ROOT / "configs" / "calibration"
#: The benchmark's banks, the main one first: 50 configurations (η x λ x B), then 25 (η x λ).
DEFAULT_BANKS = (CALIBRATION / "search_grid_bank.parquet", CALIBRATION / "decisions_grid_bank.parquet")
DEFAULT_BANK = DEFAULT_BANKS[1]
GRID_COLUMNS = ("eta", "weight_decay", "batch_size")
#: The searcher's name for each grid column (the trainer keys a sweep's search_space uses).
SPACE_KEYS = {"eta": "lr", "weight_decay": "weight_decay", "batch_size": "batch_size"}
TARGET_SHARE = 0.9


@dataclass
class Grid:
    """The bank as a table: configuration → run id per seed, true values, seed noise."""

    values: dict[str, list[Any]]  # searcher key → the grid's values along it
    runs: dict[tuple, dict[int, str]]  # configuration (in SPACE order) → seed → run id
    points: dict[str, list[dict[str, Any]]]  # run id → replayed results
    true_value: dict[tuple, float]  # configuration → mean final over seeds
    seeds: list[int]
    sigma_seed: float
    scale: str = ""  # the runs' model size, TPP and batch sizes, in words


    @property
    def best(self) -> float:
        return min(self.true_value.values())

    def key(self, config: dict[str, Any]) -> tuple:
        return tuple(_snap(config[k], self.values[k]) for k in self.values)


def _snap(value: Any, values: Sequence[Any]) -> Any:
    return min(values, key=lambda v: abs(math.log(float(v)) - math.log(float(value))))


def load_grid(path: Path) -> Grid:
    from hpo.trials.curve_bank import load_bank

    frame = load_bank(path)  # a bank written before a column existed reads its default
    frame = frame[frame["status"] == "completed"]
    finals = true_finals(frame)
    runs_frame = frame.drop_duplicates("run_id").set_index("run_id")
    varying = [c for c in GRID_COLUMNS if runs_frame[c].round(9).nunique() > 1]
    values = {SPACE_KEYS[c]: sorted(float(v) if c != "batch_size" else int(v) for v in runs_frame[c].round(9).unique())
              for c in varying}
    runs: dict[tuple, dict[int, str]] = {}
    for run_id, row in runs_frame.iterrows():
        key = tuple(_snap(row[c], values[SPACE_KEYS[c]]) for c in varying)
        runs.setdefault(key, {})[int(row["seed"])] = str(run_id)
    seeds = sorted({s for by_seed in runs.values() for s in by_seed})
    complete = {k: v for k, v in runs.items() if set(v) == set(seeds) and all(r in finals for r in v.values())}
    true_value = {k: float(np.mean([finals[r] for r in v.values()])) for k, v in complete.items()}
    noise = seed_noise(frame, finals=finals)
    points = {r: run_points(frame, r) for v in complete.values() for r in v.values()}
    batches = sorted(int(b) for b in runs_frame["batch_size"].unique())
    sizes = sorted({int(n) for n in runs_frame["n_params"]})
    tpps = sorted({float(t) for t in runs_frame["tokens_per_param"]})
    scale = (f"{' / '.join(f'{n:,}' for n in sizes)} non-embedding parameters, TPP {' / '.join(f'{t:g}' for t in tpps)}, "
             f"B = {' / '.join(f'{b:,}' for b in batches)} tokens")
    return Grid(values, complete, points, true_value, seeds, float(noise.std), scale)


class RandomGridSearcher:
    """Uniform draws from the grid's values (what ``search.algorithm: random`` does with ``choice``)."""

    def __init__(self, values: dict[str, list[Any]], seed: int) -> None:
        self.values = values
        self.rng = np.random.default_rng(seed)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {k: v[int(self.rng.integers(len(v)))] for k, v in self.values.items()}

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        pass


@dataclass
class Trace:
    """One method on one searcher seed: after each trial ended, (compute, regret)."""

    compute: list[float] = field(default_factory=list)
    regret: list[float] = field(default_factory=list)
    n_trials: int = 0
    n_distinct: int = 0

    def regret_at(self, budget: float) -> float:
        i = int(np.searchsorted(self.compute, budget, side="right")) - 1
        return self.regret[i] if i >= 0 else math.inf


class SearchedSweep(SimulatedSweep):
    """``SimulatedSweep`` whose trials a searcher suggests one by one, when a slot frees, until
    ``budget`` compute has been spent; every trial that ends is told to the searcher
    (``on_trial_complete`` with its last result, as Ray Tune's controller does)."""

    def __init__(self, scheduler: Any, searcher: Any, grid: Grid, replicate: int, budget: float,
                 n_workers: int = 2, max_trials: int = 400) -> None:
        super().__init__(scheduler, {}, n_workers=n_workers)
        self.searcher, self.grid, self.replicate = searcher, grid, replicate
        self.budget, self.max_trials = budget, max_trials
        self._open: set[str] = set()
        self._best_final: Optional[tuple[float, tuple]] = None
        self._keys: dict[str, tuple] = {}
        self.trace = Trace()

    def spent(self) -> float:
        return float(sum(self.outcome.reached.values()))

    def _new_trial(self) -> Optional[Trial]:
        if self.spent() >= self.budget or len(self.trials) >= self.max_trials:
            return None
        trial_id = f"t{len(self.trials):04d}"
        key = self.grid.key(self.searcher.suggest(trial_id))
        run_id = self.grid.runs[key][self.replicate]
        config = dict(zip(self.grid.values, key))
        self.runs[trial_id] = self.grid.points[run_id]
        self.costs[trial_id] = 1.0
        trial = Trial("__fake", trial_id=trial_id, stub=True, config={"run_id": run_id, **config})
        self.trials.append(trial)
        self._by_id[trial_id] = trial
        self._next[trial_id] = 0
        self._order[trial_id] = len(self._order)
        self.outcome.reached[trial_id] = 0.0
        self._keys[trial_id] = key
        self.scheduler.on_trial_add(self, trial)
        self._open.add(trial_id)
        return trial

    def _fill(self) -> None:
        while self._n_running() < self.n_workers:
            chosen = self.scheduler.choose_trial_to_run(self)
            if chosen is None or chosen.status not in (Trial.PENDING, Trial.PAUSED):
                chosen = self._first_pending() or self._new_trial()
            if chosen is None:
                return
            self._start(chosen)

    def _tell_ended(self) -> None:
        for trial_id in sorted(self._open):
            trial = self._by_id[trial_id]
            if trial.status != Trial.TERMINATED:
                continue
            self._open.discard(trial_id)
            result = dict(self._last.get(trial_id) or {})
            self.searcher.on_trial_complete(trial_id, result=result or None)
            if result.get("done") and not result.get("diverged"):
                final = float(result["loss"])
                if self._best_final is None or final < self._best_final[0]:
                    self._best_final = (final, self._keys[trial_id])
            regret = (self.grid.true_value[self._best_final[1]] - self.grid.best
                      if self._best_final is not None else math.inf)
            self.trace.compute.append(self.spent())
            self.trace.regret.append(regret)

    def _deliver(self, trial: Trial) -> None:
        super()._deliver(trial)
        self._tell_ended()

    def stop_trial(self, trial: Trial) -> None:
        super().stop_trial(trial)
        self._tell_ended()

    def run(self) -> Any:
        outcome = super().run()
        self.trace.n_trials = len(self.trials)
        self.trace.n_distinct = len(set(self._keys.values()))
        return outcome


def _space(grid: Grid) -> dict[str, Any]:
    from ray import tune

    return {k: tune.choice(v) for k, v in grid.values.items()}


def methods(predictor: Any, grid: Grid) -> dict[str, Callable[[int], tuple[Any, Any]]]:
    """Method name → (searcher seed → (scheduler, searcher)), fresh for every seed."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.trials.search import build_search_alg, stopped_prediction
    from hpo.trials.sweep_config import SchedulerSettings, SearchSettings

    default = SchedulerSettings()

    def collapse() -> Any:
        return CollapseScheduler(predictor=predictor, settings=default.model_copy(update={"mode": "async"}))

    def asha() -> Any:
        return ASHAScheduler(metric="loss", mode="min", time_attr="train_fraction", max_t=1.0,
                             grace_period=0.1, reduction_factor=2)

    def fifo() -> Any:
        scheduler = FIFOScheduler()
        scheduler.set_search_properties("loss", "min")
        return scheduler

    def tpe(seed: int, scheduler: Any, predicted: bool) -> Any:
        settings = SearchSettings(algorithm="optuna", seed=seed, n_startup_trials=5)
        searcher = build_search_alg(settings, stopped_prediction(scheduler) if predicted else (lambda _: None))
        searcher.set_search_properties("loss", "min", _space(grid))
        return searcher

    def with_tpe(make: Callable[[], Any], predicted: bool) -> Callable[[int], tuple[Any, Any]]:
        def build(seed: int) -> tuple[Any, Any]:
            scheduler = make()
            return scheduler, tpe(seed, scheduler, predicted)
        return build

    def with_random(make: Callable[[], Any]) -> Callable[[int], tuple[Any, Any]]:
        return lambda seed: (make(), RandomGridSearcher(grid.values, seed))

    return {
        "tpe+collapse (predicted)": with_tpe(collapse, True),
        "tpe+collapse (truncated)": with_tpe(collapse, False),
        "random+collapse": with_random(collapse),
        "random+asha": with_random(asha),
        "tpe+asha": with_tpe(asha, False),
        "tpe (no stopping)": with_tpe(fifo, False),
    }


def compute_to_target(traces: Sequence[Trace], sigma: float, budget: float) -> Optional[float]:
    """The smallest compute at which ≥ 90% of the traces have regret ≤ sigma (None: missed)."""
    checkpoints = sorted({c for t in traces for c in t.compute if c <= budget})
    for c in checkpoints:
        if np.mean([t.regret_at(c) <= sigma + 1e-12 for t in traces]) >= TARGET_SHARE:
            return float(c)
    return None


def run(bank: Path, n_seeds: int, budget_grids: float) -> dict[str, Any]:
    import logging

    import optuna

    from hpo.data import default_predictor_path
    from predictors import Predictor

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("hpo").setLevel(logging.WARNING)
    grid = load_grid(bank)
    predictor = Predictor.load(default_predictor_path())
    budget = budget_grids * len(grid.true_value)
    traces: dict[str, list[Trace]] = {}
    started = time.time()
    for name, build in methods(predictor, grid).items():
        traces[name] = []
        for seed in range(n_seeds):
            scheduler, searcher = build(seed)
            sweep = SearchedSweep(scheduler, searcher, grid, grid.seeds[seed % len(grid.seeds)], budget)
            sweep.run()
            traces[name].append(sweep.trace)
        print(f"{name}: {time.time() - started:.0f}s", flush=True)
    return {"grid": grid, "traces": traces, "budget": budget, "n_seeds": n_seeds, "bank": bank}


def section(result: dict[str, Any], out_png: Path, title: str) -> tuple[list[str], dict[str, Optional[float]]]:
    """One bank's section of the report (its table, plot and targets) and each method's compute
    to the target (None: missed); the plot is written to ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid, traces, budget = result["grid"], result["traces"], result["budget"]
    sigma = grid.sigma_seed
    n_configs = len(grid.true_value)
    budgets = np.linspace(0.5, budget, 200)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = []
    for name, ts in traces.items():
        median = [np.median([t.regret_at(b) for t in ts]) for b in budgets]
        ax.plot(budgets, np.where(np.isfinite(median), median, np.nan), label=name)
        need = compute_to_target(ts, sigma, budget)
        at = {f: float(np.mean([t.regret_at(f * n_configs) <= sigma for t in ts])) for f in (0.25, 0.5, 1.0)}
        med = {f: float(np.median([t.regret_at(f * n_configs) for t in ts])) for f in (0.25, 0.5)}
        rows.append((name, need, at, med, float(np.mean([t.n_trials for t in ts])),
                     float(np.mean([t.n_distinct for t in ts]))))
    ax.axhline(sigma, color="grey", ls=":", label="σ_seed")
    ax.set_xlabel("compute (full runs; the grid once = %d)" % n_configs)
    ax.set_ylabel("median regret over searcher seeds (final loss)")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("Search + stopping on replayed curves (%d configs x %d seeds)" % (n_configs, len(grid.seeds)),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)

    need_of = {r[0]: r[1] for r in rows}
    near = sum(v - grid.best <= sigma for v in grid.true_value.values())
    bank = Path(result["bank"]).resolve()
    bank_text = bank.relative_to(REPO_ROOT) if bank.is_relative_to(REPO_ROOT) else bank
    lines = [
        f"## {title}",
        "",
        f"Bank: `{bank_text}`: **{n_configs} configurations** "
        f"({' x '.join(f'{len(v)} {k}' for k, v in grid.values.items())}) x {len(grid.seeds)} seeds, every run to "
        f"the end ({grid.scale}).",
        "",
        f"{result['n_seeds']} searcher seeds per method (replicate = seed mod {len(grid.seeds)}), 2 slots, "
        f"budget {budget:g} full runs (the grid once). σ_seed = {sigma:.4f} (pooled). "
        f"Grid best (mean over seeds) {grid.best:.4f}. "
        f"{near} of the {n_configs} configurations are within σ_seed of the best.",
        "",
        "| method | compute to within σ_seed on ≥ 90% of seeds | "
        "share within σ at 0.25 / 0.5 / 1 grid | median regret at 0.25 / 0.5 grid | trials (distinct configs) |",
        "|---|---|---|---|---|",
    ]
    for name, need, at, med, n_trials, n_distinct in rows:
        need_text = f"{need:.1f} ({need / n_configs:.2f} grid)" if need is not None else f"missed (> {budget:g})"
        lines.append(f"| {name} | {need_text} | "
                     f"{at[0.25]:.0%} / {at[0.5]:.0%} / {at[1.0]:.0%} | "
                     f"{_fmt(med[0.25])} / {_fmt(med[0.5])} | {n_trials:.0f} ({n_distinct:.1f}) |")
    lines += ["", f"![regret against compute]({out_png.name})", ""]
    ours, asha = need_of.get("tpe+collapse (predicted)"), need_of.get("random+asha")
    trunc = need_of.get("tpe+collapse (truncated)")
    lines.append("Targets:")
    if ours is not None and asha is not None:
        ratio = ours / asha
        lines.append(f"- TPE + collapse (predicted finals) needs {ratio:.2f}x the compute of random + ASHA "
                     f"({ours:.1f} vs {asha:.1f} full runs; target ≤ 0.6x): {'met' if ratio <= 0.6 else 'missed'}.")
    elif ours is not None:  # the baseline never got there within the budget: the ratio is a bound
        ratio = ours / budget
        lines.append(f"- TPE + collapse (predicted finals) needs {ours:.1f} full runs; random + ASHA does not reach "
                     f"the target within the budget ({budget:g} full runs): the ratio is < {ratio:.2f}x "
                     f"(target ≤ 0.6x): {'met' if ratio <= 0.6 else 'not shown'}.")
    else:
        lines.append(f"- TPE + collapse (predicted) {_need(ours, budget)}, random + ASHA {_need(asha, budget)}: "
                     "the ratio target (≤ 0.6x) cannot be stated as met.")
    if ours is not None and trunc is not None:
        verdict = "beats" if ours < trunc else "does not beat"
        lines.append(f"- Predicted finals {verdict} truncated losses: {ours:.1f} vs {trunc:.1f} full runs "
                     f"({(trunc - ours) / trunc:+.0%} compute saved).")
    else:
        lines.append(f"- Predicted finals {_need(ours, budget)}, truncated losses {_need(trunc, budget)}.")
    return lines, need_of


def report(results: Sequence[dict[str, Any]], out_md: Path) -> str:
    """benchmarks/search.md: a section per bank (the first is the main one), plots beside it."""
    lines = [
        "# Search benchmark: searcher + stopping on replayed curves",
        "",
        "Definitions and methods: the docstring of `benchmarks/search.py`. Reproduce: "
        "`python benchmarks/search.py` (both banks below).",
        "",
    ]
    for i, result in enumerate(results):
        n_configs = len(result["grid"].true_value)
        stem = Path(result["bank"]).stem.removesuffix("_bank")
        title = f"{n_configs} configurations{' (main)' if i == 0 else ''}: `{stem}`"
        png = stem if stem.startswith(out_md.stem) else f"{out_md.stem}_{stem}"  # search_grid, search_decisions_grid
        body, _ = section(result, out_md.with_name(f"{png}.png"), title)
        lines += body + [""]
    text = "\n".join(lines).rstrip() + "\n"
    out_md.write_text(text)
    return text


def _fmt(value: float) -> str:
    return "∞ (nothing finished)" if not math.isfinite(value) else f"{value:.4f}"


def _need(value: Optional[float], budget: float) -> str:
    return f"{value:.1f} full runs" if value is not None else f"missed (> {budget:g})"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bank", type=Path, action="append",
                        help="a grid bank (repeatable; default: the 50- then the 25-configuration grid)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget-grids", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="4 searcher seeds")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "search.md")
    args = parser.parse_args(argv)
    banks = args.bank or list(DEFAULT_BANKS)
    for bank in banks:  # every bank checked before any is replayed
        if not bank.is_file():
            parser.exit(2, f"search.py: --bank {bank}: no such file\n")
    results = [run(bank, 4 if args.quick else args.seeds, args.budget_grids) for bank in banks]
    print(report(results, args.out))


if __name__ == "__main__":
    main()
