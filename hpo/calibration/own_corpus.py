"""The paper's protocol as one command: calibrate on small runs of the user's own corpus.

``hpo calibrate --corpus DIR --budget 15m`` fits the predictor on reference runs of the corpus
the sweep will train on, with models at most a quarter of the sweep's size, within a stated
time budget. The order error on a corpus nobody calibrated on is larger than on the one a
predictor was fitted on (``benchmarks/decisions.md``: held out by corpus); this path removes
that gap the way the paper does (fit at 111M on the same data, decide at larger sizes).

How it chooses (:func:`plan`):

* **the model**: the widest shape of :data:`WIDTHS` (2 layers, d_head 32) whose non-embedding
  parameters are ≤ a quarter of ``sweep_params`` (default 100,672: the quickstart's 0.1M), and
  whose first :data:`MIN_RUNS` runs fit the budget; else the narrowest;
* **the runs**, in the order that pays: a τ ladder at the centre η, B (it carries the shape), η
  and B at fixed τ on three τ values (the kinds users sweep, for the order error), a second
  seed (seed noise: the keep rule's tolerance), then more τ values; as many as the budget holds;
* **the time** from a measured probe (:func:`measure_throughput`): a few steps of the real
  trainer on this machine at this shape (its tokens per second, and the seconds to build it on
  this corpus), times the steps a run needs, two runs at a time on two cores, plus the parts
  measured on whole calibrations (:data:`PARALLEL_SLOWDOWN`, :data:`TRIAL_START_S`,
  :data:`FIXED_S`, :data:`FIT_S_PER_RUN2`). A budget too short says the shortest that works.

Example:
    >>> p = plan(budget_s=900, tokens_per_second=150_000, tokens_per_param=20)
    >>> p.model["d_model"], len(p.runs) >= MIN_RUNS, p.estimated_s <= 900
    (32, True, True)
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpo.common.overrides import ConfigError

#: Candidate widths (2 layers, d_head 32, µP base 64 × 2) and their non-embedding parameters
#: at seq_len 64 (as the trainer counts them).
WIDTHS: tuple[tuple[int, int], ...] = ((32, 23_712), (64, 100_672), (96, 221_664), (128, 389_760))
#: Fewest runs worth fitting four parameters on, with a held-out check.
MIN_RUNS = 12
# The parts of a calibration's time the probe does not see, measured on whole `hpo calibrate
# --corpus /usr/share/perl/5.36` runs on this project's 2-core machine while other work ran
# (12 runs: 119 s; 27 runs: 328 s; probe 3.0 / 4.5 s):
#: A trial's training time over the probe's for the same tokens, two trials sharing two cores
#: (5.6 s against 3.0 s; 7.6 s against 4.3 s).
PARALLEL_SLOWDOWN = 1.8
#: Between two rounds of trials: Ray starts the next trial's process, which imports torch and
#: the trainer (7.0 s and 7.3 s on average; the trainer's build on the corpus, measured by the
#: probe, comes on top).
TRIAL_START_S = 6.8
#: Once per calibration: the command's imports (6 s), Ray's start and end around the trials
#: (10-11 s), the MLflow record after the fit (6-7 s).
FIXED_S = 24.0
#: The fit with its held-out refits grows with the square of the runs (12 runs: 13.4 s; 27: 47.6 s).
FIT_S_PER_RUN2 = 0.075
CENTRE = {"lr": 0.01, "batch_size": 2048, "tau": 0.3}
#: Fewest runs a calibration is made of (below it the command refuses the budget).
FEWEST_RUNS = 3


@dataclass(frozen=True)
class Plan:
    """The calibration chosen for a corpus: its model shape, runs (trainer overrides, in order),
    the estimated wall time, and its parts: ``fixed_s`` (the probe, imports, Ray's start, the
    fit, MLflow: paid whatever the runs) and ``round_s`` (one round of ``parallel`` runs).
    ``shortest_s`` is the shortest budget that holds :data:`FEWEST_RUNS` runs at this shape."""

    model: dict[str, Any]
    n_params: int
    runs: list[dict[str, Any]]
    estimated_s: float
    tokens_per_param: float
    fixed_s: float = 0.0
    round_s: float = 0.0
    shortest_s: float = 0.0


def parse_budget(text: str) -> float:
    """``15m`` / ``900s`` / ``1h`` / ``600`` → seconds (ConfigError naming the value otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"--budget: {text!r} is not a duration (e.g. 15m, 900s, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def candidate_runs() -> list[dict[str, Any]]:
    """The runs in the order they pay (module docstring)."""
    taus = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6]
    out = [{"tau": t} for t in taus]
    for t in (0.1, 0.4, 1.6):
        out += [{"tau": t, "lr": lr} for lr in (0.005, 0.02)]
    for t in (0.1, 0.4, 1.6):
        out += [{"tau": t, "batch_size": b} for b in (1024, 4096)]
    out += [{"tau": t, "seed": 2} for t in (0.1, 0.4, 1.6)]
    for t in (0.05, 0.2, 0.8):
        out += [{"tau": t, "lr": lr} for lr in (0.005, 0.02)]
    return out


def fit_seconds(n_runs: int) -> float:
    """The fit's time on ``n_runs`` curves (:data:`FIT_S_PER_RUN2`)."""
    return FIT_S_PER_RUN2 * n_runs ** 2


def plan(budget_s: float, tokens_per_second: float, tokens_per_param: float = 20.0,
         sweep_params: int = 100_672, parallel: int = 2, probe_params: Optional[int] = None,
         setup_s: float = 0.0, probe_s: float = 0.0) -> Plan:
    """The model and runs that fit ``budget_s`` (see the module docstring). ``tokens_per_second``
    is one run's measured throughput at ``probe_params`` (default: the narrowest width); wider
    shapes are assumed to cost in proportion to their parameters. ``setup_s``: the probe's
    trainer build on the corpus (every run pays it); ``probe_s``: what the probe itself took
    (already spent from the budget)."""
    probe_params = probe_params or WIDTHS[0][1]
    allowed = [w for w in WIDTHS if w[1] <= sweep_params / 4] or [WIDTHS[0]]
    candidates = candidate_runs()

    def seconds(n_runs: int, round_s: float) -> float:
        return probe_s + FIXED_S + fit_seconds(n_runs) + math.ceil(n_runs / parallel) * round_s

    for d_model, n_params in reversed(allowed):
        speed = tokens_per_second * probe_params / n_params
        round_s = PARALLEL_SLOWDOWN * tokens_per_param * n_params / speed + TRIAL_START_S + setup_s
        # As many runs as fit, in whole rounds of `parallel` runs (the fit's time grows with them).
        fits = next((n for n in range(len(candidates), 0, -1) if seconds(n, round_s) <= budget_s), 0)
        if fits >= MIN_RUNS or d_model == allowed[0][0]:
            model = {"d_model": d_model, "n_layers": 2, "d_head": 32, "seq_len": 64, "base_d_model": 64,
                     "base_n_layers": 2}
            return Plan(model, n_params, candidates[:fits], seconds(fits, round_s) if fits else 0.0,
                        tokens_per_param, fixed_s=probe_s + FIXED_S, round_s=round_s,
                        shortest_s=seconds(FEWEST_RUNS, round_s))
    raise AssertionError("unreachable: the narrowest width always returns")


@dataclass(frozen=True)
class Probe:
    """What the probe measured: one run's tokens per second (1 thread), the seconds to build the
    trainer on the corpus (every run pays it), and the probe's own time."""

    tokens_per_second: float
    setup_s: float
    probe_s: float


def measure_throughput(corpus: str, d_model: int = WIDTHS[0][0], seconds: float = 4.0) -> Probe:
    """Probe the real trainer (1 thread) on ``corpus`` at the width ``d_model``: its build time,
    then its speed over a few logged intervals after one warm-up interval."""
    from trainers.train import Trainer

    began = time.perf_counter()
    trainer = Trainer({"model": {"d_model": d_model, "n_layers": 2, "d_head": 32, "seq_len": 64, "base_d_model": 64,
                                 "base_n_layers": 2}, "data": {"corpus": corpus}, "tokens_per_param": 20,
                       "batch_size": CENTRE["batch_size"], "lr": CENTRE["lr"], "tau": CENTRE["tau"], "log_every": 5,
                       "eval_every": None, "threads": 1}, warn_repeats=False)
    setup_s = time.perf_counter() - began
    trainer.train_interval()
    start, step0 = time.perf_counter(), trainer.step
    while time.perf_counter() - start < seconds and not trainer.done:
        trainer.train_interval()
    speed = (trainer.step - step0) * CENTRE["batch_size"] / max(time.perf_counter() - start, 1e-9)
    return Probe(speed, setup_s, time.perf_counter() - began)


def corpus_label(corpus: str) -> str:
    """A safe calibration name part for a corpus path (its last directory)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", Path(corpus).name or "corpus").strip("_") or "corpus"


def corpus_config(corpus: str, budget_s: float, output_dir: str, *, tokens_per_param: float = 20.0,
                  sweep_params: int = 100_672, name: Optional[str] = None, tokens_per_second: Optional[float] = None) -> tuple[dict[str, Any], Plan]:
    """The calibration config (a dict ``CalibrationConfig`` validates) for ``corpus`` within
    ``budget_s``, and its :class:`Plan`. Checks the corpus before anything is trained."""
    from trainers.corpus import corpus_files

    if corpus != "stdlib":
        path = Path(corpus).expanduser()
        if not path.is_dir() and not path.is_file():
            raise ConfigError(f"--corpus: {corpus}: no such file or directory")
        try:
            if not corpus_files(str(path)):
                raise ConfigError(f"--corpus: {corpus}: holds no files")
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        corpus = str(path.resolve())
    probe = Probe(tokens_per_second, 0.0, 0.0) if tokens_per_second else measure_throughput(corpus)
    chosen = plan(budget_s, probe.tokens_per_second, tokens_per_param, sweep_params, setup_s=probe.setup_s,
                  probe_s=probe.probe_s)
    if len(chosen.runs) < FEWEST_RUNS:
        raise ConfigError(
            f"--budget: {budget_s:.0f} s is too short: the shortest that works is {math.ceil(chosen.shortest_s)} s "
            f"({FEWEST_RUNS} runs); {chosen.fixed_s:.0f} s of any calibration is fixed (the throughput probe, Ray's "
            f"start, MLflow; the fit adds {fit_seconds(FEWEST_RUNS):.0f} s and more with more runs) and each round of 2 runs "
            f"takes {chosen.round_s:.0f} s at this machine's {probe.tokens_per_second:,.0f} tokens/s")
    label = name or corpus_label(corpus)
    trainer = {"model": chosen.model, "data": {"corpus": corpus, "data_seed": 0}, "tokens_per_param": tokens_per_param,
               **CENTRE, "schedule": "linear", "warmup_fraction": 0.1, "log_every": 5, "eval_every": None,
               "threads": 1}
    grid = [{k: [v] for k, v in run.items()} for run in chosen.runs]
    config = {"name": f"corpus_{label}", "bank": f"{output_dir}/bank.parquet", "output_dir": output_dir,
              "predictor_out": "{output_dir}/predictor.json", "trainer": trainer, "grid": grid, "seeds": [1],
              "num_cpus": 2, "fit": {"t_min": 0.05, "fit_m": True, "compare_fixed_m": True}}
    return config, chosen
