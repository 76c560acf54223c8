"""Banking reference runs: train every run a calibration lists that the curve bank lacks,
through Ray Tune, and append each finished curve to the bank.

This is the part of ``hpo calibrate`` that needs Ray and torch; :mod:`hpo.calibration.calibrate` imports
it only when it trains, so fitting from a bank (``--fit-only``) or from a user's curves
(``--from-curves``) starts without either.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from ray import tune

from hpo.trials.curve_bank import append_runs, curve_frame, load_bank, run_id_of
from hpo.trials.trainable import CollapseTrainable, short_trial_dirname
from predictors import run_keys

# The run-level columns a banked curve keeps from its last result (the table: predictors.run_keys).
RUN_KEYS = run_keys.names(banked=True, from_result=True)


def run_reference_curves(
    runs: list[dict[str, Any]],
    bank_path: Path,
    sweep_name: str,
    *,
    storage: Path,
    num_cpus: Optional[int] = None,
    cpus_per_run: float = 1.0,
) -> int:
    """Train every resolved trainer config of ``runs`` not yet in the bank at ``bank_path``
    (Ray Tune storage under ``storage``); return how many curves were added."""
    import ray

    banked = set(load_bank(bank_path)["run_id"])
    todo = [c for c in runs if run_id_of(c) not in banked]
    if not todo:
        return 0
    print(f"calibration: {len(todo)} runs to train ({len(runs) - len(todo)} already banked)")
    collector = CurveCollector(bank_path, sweep_name)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 log_to_driver=False)
    space = {"_run": tune.grid_search(todo)}
    trainable = tune.with_resources(CalibrationTrainable, {"cpu": cpus_per_run})
    tuner = tune.Tuner(
        trainable, param_space=space,
        tune_config=tune.TuneConfig(num_samples=1, trial_dirname_creator=short_trial_dirname),
        run_config=tune.RunConfig(name=sweep_name, storage_path=str(storage),
                                  verbose=0, callbacks=[collector]),
    )
    tuner.fit()
    return collector.added


class CalibrationTrainable(CollapseTrainable):
    """Our trainable, configured by one whole resolved trainer config (``_run``)."""

    def _build(self, config: dict[str, Any]) -> None:
        self._base_trainer = config["_run"]
        self._run = config["_run"]
        super()._build({})

    def step(self) -> dict[str, Any]:
        result = super().step()
        result["run_id"] = run_id_of(self._run)
        result["config_json"] = json.dumps(self._run, sort_keys=True)
        # (Banks written before this fix hold "" here: the hash was looked up under a wrong name.)
        result["corpus_hash"] = self.trainer.corpus.corpus_hash
        result["vocab_size"] = int(self.trainer.config.model.vocab_size)
        result["epochs"] = float(self.trainer.epochs)
        result["d_model"] = int(self._run["model"]["d_model"])
        result["n_layers"] = int(self._run["model"]["n_layers"])
        result["seq_len"] = int(self._run["model"]["seq_len"])
        return result


def _trial_key(trial: Any) -> str:
    return str(trial.trial_id)


class CurveCollector(tune.Callback):
    """Driver-side: gathers each trial's results and banks the curve when it ends."""

    def __init__(self, bank_path: Path, sweep_name: str) -> None:
        self.bank_path = Path(bank_path)
        self.sweep_name = sweep_name
        self.points: dict[str, list[dict[str, Any]]] = {}
        self.added = 0
        self._start = time.time()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.points.setdefault(_trial_key(trial), []).append(dict(result))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        points = self.points.pop(_trial_key(trial), [])
        if not points:
            return
        last = points[-1]
        run = {k: last.get(k) for k in RUN_KEYS}
        run["sweep"] = self.sweep_name
        run["status"] = "diverged" if last.get("diverged") else "completed"
        append_runs(self.bank_path, [curve_frame(run, points)])
        self.added += 1
        done = sum(1 for t in trials if t.status == "TERMINATED")
        print(f"  banked {run['run_id']} (τ={run['tau']:.3g}, TPP={run['tokens_per_param']:.0f}, "
              f"final {last.get('loss', float('nan')):.4f}, {run['status']}) "
              f"[{done}/{len(trials)} done, {time.time() - self._start:.0f}s]", flush=True)
