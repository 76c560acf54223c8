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

Resuming. The searcher is *restored* where its state was saved: Ray Tune saves the search
algorithm with every experiment snapshot (``SearchGenerator.save_to_dir``: Optuna's study with
every told trial, and this wrapper's record of what it replaced) and ``tune.run(resume_config=...)``
restores it from ``<output>/ray/<name>`` before trials resume; the trial counter comes back with
it, so no finished configuration is suggested again and ``num_samples`` counts across the resume.
Where no searcher state was saved (a driver killed before its first snapshot held one, or the
files lost), the searcher is *rebuilt* (:func:`resume_search_alg`) from the trials Ray's
experiment state holds: each finished trial told its final, each stopped one its predicted final
(both from the scheduler state), each trial Ray will resume registered as running; the suggestion
counter starts at the number of those trials, and TPE draws from a seed derived from the sweep's
and that number (the same seed would start with the first sweep's suggestions again).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.search_generator import SearchGenerator

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
        rebuild_from: the trials of a resumed sweep whose searcher state was not saved, told to
            the searcher (and the running ones registered) once ``tune.run`` has given it the
            search space (:func:`resume_search_alg`).
    """

    def __init__(self, searcher: Searcher, predicted_final: PredictedFinal, metric: Optional[str] = None,
                 rebuild_from: Optional[Sequence["RecordedTrial"]] = None) -> None:
        super().__init__(metric=metric, mode="min")
        self.searcher = searcher  # Ray's SearchGenerator saves and restores wrappers through `.searcher`
        self.predicted_final = predicted_final
        #: trial id -> (loss at the stop or None, predicted final told instead): what was replaced.
        self.replaced: dict[str, tuple[Optional[float], float]] = {}
        self._rebuild_from = list(rebuild_from) if rebuild_from is not None else None

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any) -> bool:
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        accepted = self.searcher.set_search_properties(metric, mode, config, **spec)
        if accepted and self._rebuild_from is not None:
            self._tell_recorded(self._rebuild_from)  # Optuna needs the space to take a trial
            self._rebuild_from = None
        return accepted

    def _tell_recorded(self, recorded: Sequence["RecordedTrial"]) -> None:
        """The recorded trials into the inner searcher: ended ones told (``add_evaluated_point``),
        the ones Ray resumes registered as running (so their completion reaches Optuna and the
        concurrency limit counts them)."""
        limiter, base = None, self.searcher
        while hasattr(base, "searcher"):
            limiter = base if isinstance(base, ConcurrencyLimiter) else limiter
            base = base.searcher
        space = base._space  # OptunaSearch's distributions (set by set_search_properties)
        for trial in recorded:
            params = {k: trial.params[k] for k in space if k in trial.params}
            if trial.alive:
                # The trial's own configuration, as Optuna's running trial under Ray's trial id.
                base._ot_study.enqueue_trial(params)
                base._ot_trials[trial.trial_id] = base._ot_study.ask(fixed_distributions=space)
                if limiter is not None:
                    limiter.live_trials.add(trial.trial_id)
            elif trial.value is not None:
                base.add_evaluated_point(params, trial.value)
                if trial.predicted:
                    self.replaced[trial.trial_id] = (trial.loss_at_stop, trial.value)
            else:
                base.add_evaluated_point(params, 0.0, error=True)  # errored or diverged: no value

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


@dataclass(frozen=True)
class RecordedTrial:
    """One trial of a resumed sweep, as a rebuilt searcher is told it.

    ``value``: the final loss of a finished trial, or the predicted final of a stopped one
    (``predicted``; ``loss_at_stop`` the loss it had reached); None for a trial that errored or
    diverged, or one Ray will resume (``alive``)."""

    trial_id: str
    params: dict[str, Any]
    alive: bool
    value: Optional[float] = None
    predicted: bool = False
    loss_at_stop: Optional[float] = None


def recorded_trials(experiment: Path, scheduler_trials: Mapping[str, Any]) -> list[RecordedTrial]:
    """The trials Ray Tune's newest experiment state in ``experiment`` holds (the ones a resume
    keeps or resumes), with their suggested parameters, and what each taught: the scheduler
    state's (``scheduler_trials``: trial id -> ``TrialRecord``) final loss of a completed trial,
    predicted final of a stopped one. A trial Ray has not ended is alive: it resumes."""
    from hpo.decisions.scheduler_records import TrialStatus

    newest = max(experiment.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime, default=None)
    if newest is None:
        return []
    out = []
    for trial_json, _ in json.loads(newest.read_text())["trial_data"]:
        trial = json.loads(trial_json)
        trial_id, params = str(trial["trial_id"]), dict(trial.get("evaluated_params") or {})
        if trial.get("status") != "TERMINATED":  # ERROR ones resume too (ResumeConfig errored=RESUME)
            out.append(RecordedTrial(trial_id, params, alive=True))
            continue
        rec = scheduler_trials.get(trial_id)
        status = getattr(rec, "status", None)
        if status == TrialStatus.COMPLETED and rec.final_metric is not None:
            out.append(RecordedTrial(trial_id, params, alive=False, value=float(rec.final_metric)))
        elif status == TrialStatus.STOPPED and (rec.latest_prediction or {}).get("final_loss") is not None:
            at_stop = float(rec.history[-1][1]) if rec.history else None
            out.append(RecordedTrial(trial_id, params, alive=False, value=float(rec.latest_prediction["final_loss"]),
                                     predicted=True, loss_at_stop=at_stop))
        else:  # diverged, errored, or ended without a recorded value
            out.append(RecordedTrial(trial_id, params, alive=False))
    return out


class RebuiltSearchGenerator(SearchGenerator):
    """Ray's ``SearchGenerator`` for a rebuilt searcher: given the experiment (``tune.run`` hands
    a resumed run's search algorithm none: a restored state brings its own) and a suggestion
    counter that starts at the trials already created, so that ``num_samples`` counts across
    the resume."""

    def __init__(self, searcher: Searcher, experiment: Any, already_created: int) -> None:
        super().__init__(searcher)
        self.add_configurations([experiment])
        self._counter = already_created  # SearchGenerator's own count (its get_state's "counter")


def resume_search_alg(settings: SearchSettings, predicted_final: PredictedFinal, experiment: Path,
                      scheduler_trials: Mapping[str, Any], num_samples: int,
                      max_concurrent: Optional[int], make_experiment: Callable[[], Any]) -> tuple[Any, str]:
    """The search algorithm of a resumed sweep, and the line it prints about it.

    Ray restores a saved searcher state itself (``tune.run`` with ``resume_config``): then this is
    :func:`build_search_alg`'s and the line says what the state holds. An ``optuna`` search with
    no saved state is rebuilt from :func:`recorded_trials` (see the module docstring);
    ``make_experiment()``: the ``tune.Experiment`` that ``tune.run`` runs (its trials' spec)."""
    saved = _saved_search_state(settings, experiment)
    if saved is not None or settings.algorithm != "optuna":
        return build_search_alg(settings, predicted_final, max_concurrent), describe_restored_search(
            settings, experiment, num_samples)
    recorded = recorded_trials(experiment, scheduler_trials)
    alg = build_search_alg(settings, predicted_final, max_concurrent, rebuild_from=recorded)
    ended = [t for t in recorded if not t.alive]
    told = [t for t in ended if t.value is not None]
    line = (f"search: Optuna TPE rebuilt from the recorded results (no searcher state was saved in {experiment}): "
            f"{len(told)} trials told ({sum(t.predicted for t in told)} stopped ones with their predicted finals, "
            f"{len(ended) - len(told)} without a value as failed), {len(recorded) - len(ended)} resuming, "
            f"{len(recorded)} of {num_samples} suggested; it suggests the rest from there")
    return RebuiltSearchGenerator(alg, make_experiment(), len(recorded)), line


def _saved_search_state(settings: SearchSettings, experiment: Path) -> Optional[tuple[dict, dict]]:
    """The newest searcher state Ray saved in ``experiment`` (generator state, base searcher
    state), or None when there is none (``SearchGenerator.has_checkpoint``)."""
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.searcher import Searcher as _Searcher
    from ray.tune.utils.util import _load_newest_checkpoint

    if settings.algorithm == "random":
        state = _load_newest_checkpoint(str(experiment), BasicVariantGenerator.CKPT_FILE_TMPL.format("*"))
        return (state, {}) if state else None
    generator = _load_newest_checkpoint(str(experiment), SearchGenerator.CKPT_FILE_TMPL.format("*"))
    base = _load_newest_checkpoint(str(experiment), _Searcher.CKPT_FILE_TMPL.format("*"))
    return (generator, base) if generator and base else None


def describe_restored_search(settings: SearchSettings, experiment: Path, num_samples: int) -> str:
    """The line a resumed sweep prints about its searcher: the state Ray Tune will restore from
    ``experiment`` (``<output>/ray/<name>``) and what it holds, or that none was saved.

    Read before ``tune.run`` restores the same newest files (``SearchGenerator.restore_from_dir``)."""
    name = "Optuna TPE" if settings.algorithm == "optuna" else "random search (Ray's variant generator)"
    saved = _saved_search_state(settings, experiment)
    if settings.algorithm == "random":
        if saved is None:
            return (f"search: {name}: no saved generator state in {experiment}: it starts afresh (not rebuilt: "
                    "its draws may repeat configurations already run)")
        return (f"search: {name}: its generator state is restored with the experiment; the grid and "
                "draws go on where they stopped")
    if saved is None:
        return (f"search: {name}: no saved searcher state in {experiment}: it starts afresh and is not "
                "told the trials recorded so far")
    generator, base = saved
    study = base.get("_ot_study")
    told = [t for t in (study.trials if study is not None else []) if t.state.is_finished()]
    replaced = len((generator.get("name:PredictedFinalSearcher") or {}).get("replaced", {}))
    return (f"search: {name} restored from the state saved with the experiment (not rebuilt): "
            f"{len(told)} trials told ({replaced} stopped ones with their predicted finals), "
            f"{generator.get('counter', 0)} of {num_samples} suggested; it suggests the rest from there")


def build_search_alg(settings: SearchSettings, predicted_final: PredictedFinal,
                     max_concurrent: Optional[int] = None,
                     rebuild_from: Optional[Sequence[RecordedTrial]] = None) -> Any:
    """The ``search_alg`` handed to ``tune.run`` for the sweep's ``search:`` settings.

    ``random``: Ray's ``BasicVariantGenerator`` (grid points enumerated, ``choice`` and
    ``loguniform`` drawn; ``seed`` makes the draws repeatable). ``optuna``: ``OptunaSearch`` with
    a seeded TPE sampler (``n_startup_trials`` random ones first), in a ``ConcurrencyLimiter``
    when ``max_concurrent`` is set, wrapped in :class:`PredictedFinalSearcher`.
    ``max_concurrent``: the most trials alive at once (None: no limit but the cluster's slots);
    it is the search algorithm's, so ``tune.run`` gets none. ``rebuild_from`` (optuna): the
    recorded trials of a resumed sweep to tell it (:func:`resume_search_alg`); its TPE seed is
    then derived from ``seed`` and their number.
    """
    if settings.algorithm == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(random_state=settings.seed, max_concurrent=max_concurrent or 0)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    startup = {} if settings.n_startup_trials is None else {"n_startup_trials": settings.n_startup_trials}
    seed = settings.seed
    if rebuild_from is not None and seed is not None:
        import numpy as np

        seed = int(np.random.SeedSequence([seed, len(rebuild_from)]).generate_state(1)[0])
    sampler = optuna.samplers.TPESampler(seed=seed, **startup)
    searcher: Searcher = OptunaSearch(sampler=sampler)
    if max_concurrent:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return PredictedFinalSearcher(searcher, predicted_final, rebuild_from=rebuild_from)
