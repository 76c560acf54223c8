"""The one calibration fit (``hpo calibrate``, banked runs and a user's own curves alike).

For each mode (m fitted, the paper's m fixed) it chooses how model size enters the prediction
(:mod:`hpo.calibration.size_choice`), fits, and measures the held-out decision error (:mod:`hpo.calibration.held_out`);
for the chosen mode the ranking error (:mod:`hpo.calibration.ranking_error`) and the monitor band. Nothing
is written until everything is ready (issue 28): the report and figure
(:mod:`hpo.calibration.report`) first, the predictor last.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hpo.calibration import report as calibration_report, held_out
from hpo.common.overrides import ConfigError
from hpo.calibration.ranking_error import corpus_order_error, evaluation_groups, ranking_error_table, seed_noise, swept_sizes
from hpo.calibration.size_choice import SizeChoice, choose_size_method, size_methods
from predictors import fit
from predictors.fit_objective import COVER_TOL
from predictors.io import atomic_write_bytes, atomic_write_json, atomic_write_text, dumps
from predictors.references import ReferenceCurves


class FitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    t_min: float = Field(0.2, ge=0, lt=1)
    fit_m: bool = True
    compare_fixed_m: bool = True  # also fit the paper's fixed-m mode and report both
    # Measure the decision-fraction error leave-one-out (one refit per curve) instead of in-sample.
    held_out_error: bool = True
    # Also measure it across scales (leave-one-TPP-out, leave-one-size-out where the bank has
    # two or more): the error the predictor states for runs away from the calibrated scale.
    cross_scale_error: bool = True
    # Fit the irreducible loss L̂ of Eq. 1 (ℓ = (L − L̂)/(L(1) − L̂)); the paper's L̂ = 0 otherwise.
    irreducible_loss: bool = False
    # Measure how reliably the predictor orders the trials of one sweep, per kind of sweep
    # (leave-one-sweep-out; across scales too): what the scheduler's calibrated margin uses.
    ranking_error: bool = True
    # How model size enters the prediction (issue 15): "choose" compares the plain surrogate,
    # the size term m(N) and reference curves leave-one-size-out where the bank spans sizes
    # (the size term, fitted only then, without held-out errors); or one of them by name.
    size_method: Literal["choose", "surrogate", "size term", "reference curves",
                         "reference curves, size-term trend"] = "choose"
    # Also refit on the values up to (down from) each TPP, size and τ and predict every value
    # beyond: the far distances the error off the calibrated scale is grown from.
    extrapolation_error: bool = True


def fit_and_report(
    curves: list, settings: FitSettings, predictor_path: Path, out: Path, *,
    provenance: dict[str, Any], source: str, notes: tuple[str, ...] = (), ranking_curves: Sequence[Any] = (),
    corpus_curves: Sequence[Any] = (), corpora: Sequence[str] = (),
) -> dict[str, Any]:
    """The one calibration fit, for banked runs and for a user's own curves alike.

    Leaves out (with a note) curves that do not reach the end of training; for each mode,
    chooses how model size enters the prediction (leave-one-size-out, where the bank spans
    sizes), fits, measures the decision error leave-one-out and per held-out group across
    scales and the coverage of the intervals it states; writes the predictor JSON,
    ``calibration.json``/``.md`` and the normalised-curve plot to ``out``. Prints progress
    through the held-out refits. Raises ``ConfigError`` naming ``source`` when fewer than 3
    complete curves remain.
    """
    curves, left_out = complete_curves(curves)
    notes = list(notes) + left_out
    if len(curves) < 3:
        raise ConfigError(f"{source}: only {len(curves)} complete curves to calibrate on (need 3)"
                          + (f"; {'; '.join(notes)}" if notes else ""))
    late = [c for c in curves if float(c.t_hat[0]) > settings.t_min + COVER_TOL]
    if late:  # the fit would stop at its first curve with a traceback: say which setting to change
        first = max(late, key=lambda c: float(c.t_hat[0]))
        raise ConfigError(
            f"fit.t_min: {settings.t_min:g} is before the first point of {len(late)} run(s) (latest: "
            f"{first.meta.get('name', '?')} starts at t̂ {float(first.t_hat[0]):.3g}); the fit needs every curve from "
            f"t_min on: give --set fit.t_min={math.ceil(100 * float(first.t_hat[0])) / 100:g} (or later)")
    provenance = {**provenance,
                  "corpus_hash": sorted(set(str(c.meta.get("corpus_hash")) for c in curves))}
    refits = held_out.Refits(curves)  # shared: the size comparison's refits serve the error tables too
    modes = [True, False] if settings.compare_fixed_m else [settings.fit_m]
    # Held out from refits of two or more curves: three curves suffice (a three-width calibration
    # shipped its in-sample error: on the Perl ladder ±2σ 32% at s = 0.1 and 3.3% at 0.3 for a
    # width 2.2x beyond, whose errors were 6.9% and 6.3%).
    measured = settings.held_out_error
    fits = {fit_m: _fit_mode(curves, settings, fit_m, provenance, refits, measured) for fit_m in modes}
    results = {fit_m: f.result for fit_m, f in fits.items()}
    chosen_mode = _choose_mode(results, settings.fit_m)
    chosen = fits[chosen_mode]
    predictor = chosen.result.predictor
    if measured and settings.ranking_error:
        ranking = _ranking_error(curves, predictor, chosen, refits, ranking_curves, corpus_curves, corpora, notes)
        predictor = dataclasses.replace(predictor, ranking_error=ranking)
        if ranking is None:
            notes.append("ranking error not measured: the bank holds no sweep (curves that differ in "
                         "only one of η, B, λ at one TPP, size and seed)")
    corpus_complete = complete_curves(list(corpus_curves))[0]
    band = (monitor_band(curves, predictor, refits, chosen.method, corpus_complete) if measured
            else monitor_band(curves, predictor, corpus_curves=corpus_complete))
    if band is None:
        notes.append("monitor band not measured: fewer than 3 complete curves the predictor covers")
    else:
        predictor = dataclasses.replace(predictor, monitor=band)
    results[chosen_mode] = dataclasses.replace(chosen.result, predictor=predictor)
    held = {fit_m: f.held for fit_m, f in fits.items()}
    choices = {fit_m: f.choice for fit_m, f in fits.items() if f.choice is not None}
    summary = calibration_report.calibration_summary(curves, results, chosen_mode, held, notes, choices)
    _write_outputs(summary, curves, predictor, predictor_path, out)
    summary["predictor"] = str(predictor_path)
    summary["report_dir"] = str(out)
    return summary


@dataclasses.dataclass(frozen=True)
class ModeFit:
    """One mode's fit: the fit result (its predictor with the held-out decision error), how
    model size entered it, its held-out predictions (``leave-one-out``, ``cross``; empty when
    not measured) and the size comparison behind the method (None when not compared)."""

    result: Any
    method: held_out.Method
    held: dict[str, Any]
    choice: Optional[SizeChoice]


def _fit_mode(curves: list, settings: FitSettings, fit_m: bool, provenance: dict[str, Any],
              refits: held_out.Refits, measured: bool) -> ModeFit:
    """Fit one mode (m fitted or fixed): choose the size method, fit, and attach the held-out
    decision error where ``measured``."""
    base = {"t_min": settings.t_min, "fit_m": fit_m, "fit_irreducible": settings.irreducible_loss}
    label = "five-parameter" if fit_m else "paper (m = 0.05)"
    candidates = {m.name: m for m in size_methods(base)}
    choice = None
    # With three curves too (refits of two): below four the size term shipped unexamined, and on the
    # width ladders of one run a width a three-width calibration shipped it 2-3x worse than the
    # nearest width (issue 37).
    if settings.size_method == "choose" and measured:
        _progress(f"{label}: how model size enters the prediction (leave-one-size-out)")
        choice = choose_size_method(curves, fit_kwargs=base, refits=refits, progress=_progress)
        method = choice.chosen
    else:
        # Without held-out refits: the size term (fitted only where the bank spans sizes).
        method = candidates["size term" if settings.size_method == "choose" else settings.size_method]
    result = fit(curves, **method.fit_kwargs,
                 provenance={**provenance, "mode": "five-parameter" if fit_m else "paper (m fixed)",
                             "size_method": method.name})
    if method.references is not None:
        refs = ReferenceCurves.from_curves(curves, extrapolation=method.references)  # type: ignore[arg-type]
        result = dataclasses.replace(result, predictor=dataclasses.replace(result.predictor, references=refs))
    if not measured:
        return ModeFit(result, method, {}, choice)
    # The in-sample decision error is optimistic; the predictor ships the held-out one.
    _progress(f"{label}, {method.name}: held-out decision error")
    loo = held_out.leave_one_out(curves, method=method, refits=refits, progress=_progress)
    cross = (held_out.across_scales(curves, method=method, refits=refits, progress=_progress,
                                    extrapolate=settings.extrapolation_error)
             if settings.cross_scale_error else [])
    table = held_out.decision_error_table(loo, cross)
    result = dataclasses.replace(result, predictor=dataclasses.replace(result.predictor, decision_error=table))
    return ModeFit(result, method, {"leave-one-out": loo, "cross": cross}, choice)


def _ranking_error(curves: list, predictor: Any, chosen: ModeFit, refits: held_out.Refits,
                   ranking_curves: Sequence[Any], corpus_curves: Sequence[Any] = (), corpora: Sequence[str] = (),
                   notes: Optional[list] = None) -> Any:
    """The chosen mode's ranking error (``hpo.calibration.ranking_error``), with the order error of the
    ranking banks' sweeps (never fitted) and the seed noise; None when the bank holds no sweep."""
    ranking = ranking_error_table(curves, method=chosen.method, refits=refits,
                                  cross=chosen.held.get("cross", []), progress=_progress)
    if ranking is None:
        return None
    complete_extra = complete_curves(list(ranking_curves))[0]
    if complete_extra:
        _progress(f"ranking error on {len(complete_extra)} curves of the ranking banks (never fitted)")
    swept = swept_sizes(curves)
    extra_groups = evaluation_groups(predictor, complete_extra, swept=swept) if complete_extra else ()
    noise = seed_noise(curves)
    across = corpus_order_error(predictor, complete_curves(list(corpus_curves))[0], corpora) if corpus_curves else None
    if across is not None:
        # The rule reads the order error measured on other corpora (a user's sweep is on a corpus
        # the fit never saw); a kind not swept there keeps the within-corpus error, and says so.
        within_only = sorted(set(ranking.kinds) - set(across.kinds))
        if notes is not None:
            notes.append(f"order error: {across.source}; within-corpus ({ranking.source}) for "
                         f"{', '.join(within_only) or 'no kind'}")
        ranking = dataclasses.replace(ranking, kinds={**ranking.kinds, **across.kinds}, source=across.source + (
            f"; {', '.join(within_only)}: {ranking.source} on the fit's corpus" if within_only else ""))
    return dataclasses.replace(ranking, cross_groups=(*ranking.cross_groups, *extra_groups),
                               seed_noise=None if noise is None else noise[0],
                               seed_noise_source=None if noise is None else noise[1], swept_sizes=swept)


def _write_outputs(summary: dict[str, Any], curves: list, predictor: Any, predictor_path: Path, out: Path) -> None:
    """Everything is computed before anything is written (issue 28): a report or figure that
    fails leaves no predictor file a user could take for a finished calibration. The predictor
    goes last, so it exists only once its report and figure do."""
    report = calibration_report.calibration_markdown(summary)
    figure = calibration_report.render_normalized(curves, predictor)
    predictor_json = dumps(predictor.to_dict()) + "\n"
    # Strict JSON: a coverage or error that could not be measured is null, never a bare NaN.
    atomic_write_json(out / "calibration.json", summary)
    atomic_write_text(out / "calibration.md", report)
    atomic_write_bytes(out / "normalized.png", figure)
    atomic_write_text(predictor_path, predictor_json)


def monitor_band(curves: list, predictor: Any, refits: Optional[held_out.Refits] = None,
                 method: Optional[held_out.Method] = None, corpus_curves: Sequence[Any] = ()) -> Any:
    """The collapse-residual noise bands (``predictors.monitor``) of the clean calibration curves:
    the predictor's ``monitor`` section. None when fewer than 3 curves are covered.

    Predictor mode: with the calibration's ``refits`` and chosen ``method`` each run is judged
    by its leave-one-out refit (the cached one the decision error used), so the band is that of
    a run the predictor has not seen: in-sample a run is part of its own reference curves and
    the band shrinks to the noise of an average containing it (measured on the shipped bank:
    13/116 false alarms on clean in-range runs). Without them, against ``predictor`` itself
    (in-sample). ``corpus_curves`` (complete runs of the ``corpus_banks``, other corpora the fit
    never saw) join the band, each against ``predictor``: a corpus's own shape is then part of
    the spread the band allows (against a band of the stdlib calibration runs alone, clean Perl
    and C-header runs alarmed at 36% and 79%). Reference mode (``band.reference``): each run against
    the runs of the same corpus and controls and another seed
    (``predictors.monitor.pair_changes``), calibration and corpus runs alike; None without such
    pairs."""
    from predictors.monitor import calibrate_band, calibrate_reference_band

    reference: Any = predictor
    words = "residual against the fitted predictor (in-sample)"
    if refits is not None and method is not None:
        index = {id(c): i for i, c in enumerate(refits.curves)}

        def leave_one_out_refit(curve: Any) -> Any:
            return refits.predictor([j for j in range(len(refits.curves)) if j != index[id(curve)]], method)

        reference, words = leave_one_out_refit, "residual against each run's leave-one-out refit"
    others = list(corpus_curves)
    if others:
        calibration = {id(c) for c in curves}
        inner = reference

        def judged_by(curve: Any) -> Any:
            return (inner(curve) if callable(inner) and not hasattr(inner, "normalized_curve") else inner) \
                if id(curve) in calibration else predictor

        reference = judged_by
        words += f"; and {len(others)} clean runs of other corpora against the predictor"
    pooled = list(curves) + others
    pairs = calibrate_reference_band(pooled, source="pairs of clean runs of the same corpus and controls and "
                                                    "different seeds, one judged against the other")
    try:
        return calibrate_band(pooled, reference, source=f"{len(curves)} clean calibration curves, {words}",
                              reference_band=pairs)
    except ValueError:
        return None


def _progress(message: str) -> None:
    print(f"  {message}", flush=True)


def choose_offset(curves: Sequence[Any], settings: FitSettings, fractions: Sequence[float] = (0.1, 0.3, 0.5)
                  ) -> tuple[bool, dict[str, dict[float, float]]]:
    """Whether to fit the irreducible loss L̂ (Eq. 1) for these curves, chosen on them alone:
    each size is held out in turn (every size where the curves span two or more, else each curve),
    both forms (L̂ = 0, the paper's; L̂ fitted) are refitted on the rest, and the form whose
    held-out predicted finals are off least (mean relative error at ``fractions``, rungs read
    as the scheduler reads them) wins; ties keep the paper's L̂ = 0.

    Returns (fit L̂?, {form: {s: mean relative error}}). Why it matters: on the public 33M–93M
    ladder L̂ = 0 left b(τ) rising with τ, against the paper's finding, and a 124M η sweep's
    predicted finals in the loss order; fitting L̂ gave b(τ) falling with τ and a third of the
    held-out error (docs/public_bench.md)."""
    from predictors.prediction import predict_at_rung
    from hpo.trials.replay import curve_points

    sizes = sorted({c.controls.n_params for c in curves if c.controls.n_params})
    folds = ([[c for c in curves if c.controls.n_params == n] for n in sizes] if len(sizes) >= 2
             else [[c] for c in curves])
    table: dict[str, dict[float, float]] = {}
    for label, fitted in (("L̂ = 0", False), ("L̂ fitted", True)):
        errors: dict[float, list[float]] = {s: [] for s in fractions}
        for held in folds:
            rest = [c for c in curves if all(c is not h for h in held)]
            predictor = fit(rest, t_min=settings.t_min, fit_m=settings.fit_m, fit_irreducible=fitted,
                            decision_fractions=()).predictor
            for curve in held:
                points = curve_points(curve)
                for s in fractions:
                    pred = predict_at_rung(predictor, [p["train_fraction"] for p in points],
                                                 [p["loss"] for p in points], points[0], s)
                    if pred.final_loss is not None:
                        errors[s].append(abs(pred.final_loss / curve.final_loss - 1.0))
        table[label] = {s: float(np.mean(v)) if v else math.inf for s, v in errors.items()}
    mean = {label: float(np.mean(list(v.values()))) for label, v in table.items()}
    return mean["L̂ fitted"] < mean["L̂ = 0"], table


def complete_curves(curves: list) -> tuple[list, list[str]]:
    """The curves that reach the end of training (``predictors.curves.reaches_end``: t̂ ≥ 0.99 or
    within one logging interval of the end), and a note for each left out (a run whose non-finite
    tail the bank dropped, or one stopped early)."""
    from predictors.curves import reaches_end

    complete, notes = [], []
    for curve in curves:
        if not reaches_end(curve.t_hat):
            notes.append(f"run {curve.meta.get('name', '?')}: ends at t̂ = {float(curve.t_hat[-1]):.3g} "
                         "(non-finite tail or stopped early); left out of the fit")
        else:
            complete.append(curve)
    return complete, notes


def _choose_mode(results: dict[bool, Any], preferred: bool) -> bool:
    """Pick the mode with the lower decision-fraction error (mean over fractions), if known."""
    if len(results) == 1:
        return next(iter(results))

    def score(result: Any) -> float:
        table = result.predictor.decision_error
        if table is None:
            return float(result.fit_mae)
        # Judge by the error of the final loss predicted at the decision fractions (≤ 0.3).
        errors = [e for s, e in zip(table.stop_fractions, table.rel_error) if s <= 0.3 + 1e-9]
        return float(np.mean(errors or list(table.rel_error)))

    return min(results, key=lambda mode: (score(results[mode]), mode != preferred))
