"""Which configurations a sweep tries: Ray Tune's random variants, or Optuna's TPE fed the
predicted finals of the trials the scheduler stopped.

The hook. Ray Tune tells a searcher that a trial is over through ``Searcher.on_trial_complete``
(``TuneController.stop_trial`` and the end of a trial's results both reach it). For a trial
the scheduler stopped it passes the loss at the stop, or for a PAUSED trial stopped at a sync
rung no result at all (Optuna then records the trial PRUNED and TPE learns little from it).
:class:`PredictedFinalSearcher` wraps the searcher and, in ``on_trial_complete``, replaces the
metric of every trial the ``CollapseScheduler`` has marked stopped with the final loss the
scheduler predicted for it at its last rung (the prediction its decision used). Finished
trials reach the searcher with their own final loss, untouched. The scheduler's decisions come
first in Ray's loop (a STOP is decided in ``on_trial_result`` or in a rung decision that calls
``stop_trial``), so the prediction is recorded before the searcher is told. Optuna's ``tell``
takes a value only: the prediction's uncertainty is not passed (it stays in the scheduler state).
This works the same in ``sync``, ``async`` and ``audit`` modes (audit stops nothing, so nothing
is replaced).

Resuming. The searcher is *restored*, not rebuilt: Ray Tune saves the search algorithm with
every experiment snapshot (``SearchGenerator.save_to_dir``: Optuna's study with every told
trial, and this wrapper's record of what it replaced) and ``tune.run(resume_config=...)``
restores it from ``<output>/ray/<name>`` before trials resume; the trial counter comes back with
it, so no finished configuration is suggested again and ``num_samples`` counts across the resume.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

from ray.tune.search import ConcurrencyLimiter, Searcher

from hpo.trials.sweep_config import SearchSettings

logger = logging.getLogger(__name__)

#: Given a trial id, the predicted final loss to report for it (None: report its own result).
PredictedFinal = Callable[[str], Optional[float]]


def stopped_prediction(scheduler: Any) -> PredictedFinal:
    """The scheduler's predicted final loss of a trial it stopped (its latest rung's), else None
    (finished, errored, diverged, or never predicted)."""
    from hpo.decisions.scheduler_records import TrialStatus

    def predicted_final(trial_id: str) -> Optional[float]:
        rec = scheduler.state.trials.get(trial_id)
        if rec is None or rec.status != TrialStatus.STOPPED:
            return None
        return (rec.latest_prediction or {}).get("final_loss")

    return predicted_final


class PredictedFinalSearcher(Searcher):
    """A Ray Tune searcher wrapper: a trial the scheduler stopped is completed with its
    predicted final loss instead of its truncated loss (see the module docstring for the hook).

    Args:
        searcher: the searcher that suggests (``OptunaSearch``, possibly in a ``ConcurrencyLimiter``).
        predicted_final: trial id -> predicted final loss for a stopped trial, else None
            (:func:`stopped_prediction`). Not saved with the searcher's state: a resumed sweep
            hands in its own scheduler's.
        metric: the result key the searcher minimises (set by ``tune.run`` when None).
    """

    def __init__(self, searcher: Searcher, predicted_final: PredictedFinal, metric: Optional[str] = None) -> None:
        super().__init__(metric=metric, mode="min")
        self.searcher = searcher  # Ray's SearchGenerator saves and restores wrappers through `.searcher`
        self.predicted_final = predicted_final
        #: trial id -> (loss at the stop or None, predicted final told instead): what was replaced.
        self.replaced: dict[str, tuple[Optional[float], float]] = {}

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any) -> bool:
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[dict]:
        return self.searcher.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Not passed on: TPE models final values only (OptunaSearch would report every result
        # as an intermediate value for a pruner, and warn when a resumed trial reports a step
        # again); the scheduler does the stopping.
        pass

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        predicted = None if error else self.predicted_final(trial_id)
        if predicted is not None:
            metric = self.metric or self.searcher.metric
            truncated = (result or {}).get(metric)
            result = {**(result or {}), metric: float(predicted)}
            self.replaced[trial_id] = (None if truncated is None else float(truncated), float(predicted))
            logger.debug("searcher told trial %s's predicted final %.4g (loss at the stop %s)",
                         trial_id, predicted, truncated)
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def add_evaluated_point(self, parameters: dict, value: float, error: bool = False, pruned: bool = False,
                            intermediate_values: Optional[list] = None) -> None:
        self.searcher.add_evaluated_point(parameters, value, error, pruned, intermediate_values)

    # Ray's SearchGenerator.save_to_dir/restore_from_dir: this wrapper's state (without the
    # callable, which belongs to the sweep now running), then the inner searcher's own file.
    def get_state(self) -> dict:
        return {"replaced": dict(self.replaced), "_metric": self._metric, "_mode": self._mode}

    def set_state(self, state: dict) -> None:
        self.replaced = dict(state.get("replaced", {}))
        self._metric = state.get("_metric", self._metric)
        self._mode = state.get("_mode", self._mode)

    def save(self, checkpoint_path: str) -> None:
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.searcher.restore(checkpoint_path)


def describe_restored_search(settings: SearchSettings, experiment: Path, num_samples: int) -> str:
    """The line a resumed sweep prints about its searcher: the state Ray Tune will restore from
    ``experiment`` (``<output>/ray/<name>``) and what it holds, or that none was saved.

    Read before ``tune.run`` restores the same newest files (``SearchGenerator.restore_from_dir``)."""
    from ray.tune.search.searcher import Searcher as _Searcher
    from ray.tune.search.search_generator import SearchGenerator
    from ray.tune.utils.util import _load_newest_checkpoint

    name = "Optuna TPE" if settings.algorithm == "optuna" else "random search (Ray's variant generator)"
    if settings.algorithm == "random":
        return (f"search: {name}: its generator state is restored with the experiment; the grid and "
                "draws go on where they stopped")
    generator = _load_newest_checkpoint(str(experiment), SearchGenerator.CKPT_FILE_TMPL.format("*"))
    base = _load_newest_checkpoint(str(experiment), _Searcher.CKPT_FILE_TMPL.format("*"))
    if not generator or not base:
        return (f"search: {name}: no saved searcher state in {experiment}: it starts afresh and is not "
                "told the trials recorded so far")
    study = base.get("_ot_study")
    told = [t for t in (study.trials if study is not None else []) if t.state.is_finished()]
    replaced = len((generator.get("name:PredictedFinalSearcher") or {}).get("replaced", {}))
    return (f"search: {name} restored from the state saved with the experiment (not rebuilt): "
            f"{len(told)} trials told ({replaced} stopped ones with their predicted finals), "
            f"{generator.get('counter', 0)} of {num_samples} suggested; it suggests the rest from there")


def build_search_alg(settings: SearchSettings, predicted_final: PredictedFinal,
                     max_concurrent: Optional[int] = None) -> Any:
    """The ``search_alg`` handed to ``tune.run`` for the sweep's ``search:`` settings.

    ``random``: Ray's ``BasicVariantGenerator`` (grid points enumerated, ``choice`` and
    ``loguniform`` drawn; ``seed`` makes the draws repeatable). ``optuna``: ``OptunaSearch`` with
    a seeded TPE sampler (``n_startup_trials`` random ones first), in a ``ConcurrencyLimiter``
    when ``max_concurrent`` is set, wrapped in :class:`PredictedFinalSearcher`.
    ``max_concurrent``: the most trials alive at once (None: no limit but the cluster's slots);
    it is the search algorithm's, so ``tune.run`` gets none.
    """
    if settings.algorithm == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(random_state=settings.seed, max_concurrent=max_concurrent or 0)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    startup = {} if settings.n_startup_trials is None else {"n_startup_trials": settings.n_startup_trials}
    sampler = optuna.samplers.TPESampler(seed=settings.seed, **startup)
    searcher: Searcher = OptunaSearch(sampler=sampler)
    if max_concurrent:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return PredictedFinalSearcher(searcher, predicted_final)
