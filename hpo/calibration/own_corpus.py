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
* **the cost** of a run from a measured probe: a few steps of the real trainer on this machine
  at this shape, times the steps a run needs, two runs at a time on two cores.

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
#: What a calibration costs beyond training, in seconds (seen on this project's 2-core machine
#: while other work ran: 20 runs of 4 s each took 11 min with Ray's start, each trial's process
#: and corpus load, and the fit's held-out refits): per run, and once for the fit.
RUN_OVERHEAD_S, FIT_S = 15.0, 240.0
CENTRE = {"lr": 0.01, "batch_size": 2048, "tau": 0.3}


@dataclass(frozen=True)
class Plan:
    """The calibration chosen for a corpus: its model shape, runs (trainer overrides, in order),
    and the estimated wall time."""

    model: dict[str, Any]
    n_params: int
    runs: list[dict[str, Any]]
    estimated_s: float
    tokens_per_param: float


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


def plan(budget_s: float, tokens_per_second: float, tokens_per_param: float = 20.0,
         sweep_params: int = 100_672, parallel: int = 2, probe_params: Optional[int] = None) -> Plan:
    """The model and runs that fit ``budget_s`` (see the module docstring). ``tokens_per_second``
    is one run's measured throughput at ``probe_params`` (default: the narrowest width); wider
    shapes are assumed to cost in proportion to their parameters."""
    probe_params = probe_params or WIDTHS[0][1]
    allowed = [w for w in WIDTHS if w[1] <= sweep_params / 4] or [WIDTHS[0]]
    candidates = candidate_runs()
    for d_model, n_params in reversed(allowed):
        speed = tokens_per_second * probe_params / n_params
        per_run = tokens_per_param * n_params / speed + RUN_OVERHEAD_S
        fits = int(max(budget_s - FIT_S, 0.0) // per_run) * parallel  # whole rounds of `parallel` runs
        if fits >= MIN_RUNS or d_model == allowed[0][0]:
            runs = candidates[:max(0, min(fits, len(candidates)))]
            model = {"d_model": d_model, "n_layers": 2, "d_head": 32, "seq_len": 64, "base_d_model": 64,
                     "base_n_layers": 2}
            return Plan(model, n_params, runs, math.ceil(len(runs) / parallel) * per_run + FIT_S, tokens_per_param)
    raise AssertionError("unreachable: the narrowest width always returns")


def measure_throughput(corpus: str, d_model: int = WIDTHS[0][0], seconds: float = 4.0) -> float:
    """Tokens per second of one run (1 thread) of the real trainer on ``corpus`` at the width
    ``d_model``: a few logged intervals after one warm-up interval."""
    from trainers.train import Trainer

    trainer = Trainer({"model": {"d_model": d_model, "n_layers": 2, "d_head": 32, "seq_len": 64, "base_d_model": 64,
                                 "base_n_layers": 2}, "data": {"corpus": corpus}, "tokens_per_param": 20,
                       "batch_size": CENTRE["batch_size"], "lr": CENTRE["lr"], "tau": CENTRE["tau"], "log_every": 5,
                       "eval_every": None, "threads": 1}, warn_repeats=False)
    trainer.train_interval()
    start, step0 = time.perf_counter(), trainer.step
    while time.perf_counter() - start < seconds and not trainer.done:
        trainer.train_interval()
    return (trainer.step - step0) * CENTRE["batch_size"] / max(time.perf_counter() - start, 1e-9)


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
    speed = tokens_per_second or measure_throughput(corpus)
    chosen = plan(budget_s, speed, tokens_per_param, sweep_params)
    if len(chosen.runs) < 3:
        raise ConfigError(f"--budget: {budget_s:.0f} s holds {len(chosen.runs)} runs at this machine's "
                          f"{speed:,.0f} tokens/s; a calibration needs at least 3 (give a longer budget)")
    label = name or corpus_label(corpus)
    trainer = {"model": chosen.model, "data": {"corpus": corpus, "data_seed": 0}, "tokens_per_param": tokens_per_param,
               **CENTRE, "schedule": "linear", "warmup_fraction": 0.1, "log_every": 5, "eval_every": None,
               "threads": 1}
    grid = [{k: [v] for k, v in run.items()} for run in chosen.runs]
    config = {"name": f"corpus_{label}", "bank": f"{output_dir}/bank.parquet", "output_dir": output_dir,
              "predictor_out": "{output_dir}/predictor.json", "trainer": trainer, "grid": grid, "seeds": [1],
              "num_cpus": 2, "fit": {"t_min": 0.05, "fit_m": True, "compare_fixed_m": True}}
    return config, chosen
