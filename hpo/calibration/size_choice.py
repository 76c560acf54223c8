"""How model size enters the shipped predictor: the size methods, compared leave-one-size-out.

Where the bank spans two or more model sizes, :func:`choose_size_method` predicts every size
leave-one-size-out (``hpo.calibration.held_out.axis_predictions``) with each of :func:`size_methods` (the
nearest size's reference curves held, the plain surrogate, the surrogate with a size term, and
reference curves extrapolated along the size term), and the calibration ships the simplest one
unless a more complex one beats it by more than the noise of the comparison
(:func:`pick_within_noise`, issue 28).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from hpo.calibration.held_out import HeldOutPredictions, Method, Refits, axis_predictions
from predictors import Curve
from predictors.curves import curve_size
from predictors.predictor import DECISION_FRACTIONS

#: Values on an axis must span this factor for the size comparison (as the fit's size term).
MIN_SIZE_SPAN = 1.5
#: The stop fractions that judge a size method (the decision fractions, as the mode choice).
CHOICE_FRACTIONS_MAX = 0.3


def size_methods(fit_kwargs: Mapping[str, Any]) -> list[Method]:
    """The ways model size can enter a prediction, compared by :func:`choose_size_method`,
    simplest first (the fallback of :func:`pick_within_noise`): the calibrated curve of the
    nearest size, held beyond the calibrated sizes (the nearest-width rule: no size trend, the
    shape measured closest to the run); one shape for every size (the plain surrogate, pooled
    over sizes); then the two that continue a fitted size trend m(N) beyond the calibrated
    sizes (the size term; reference curves along it), which overshoot more the farther they go
    when the trend is fitted on few sizes (issue 28)."""
    plain = {**dict(fit_kwargs), "size_term": False}
    sized = {**dict(fit_kwargs), "size_term": True}
    return [Method.of("reference curves", sized, "hold"), Method.of("surrogate", plain),
            Method.of("size term", sized), Method.of("reference curves, size-term trend", sized, "surrogate")]



def spans_sizes(curves: Sequence[Curve]) -> bool:
    """Whether the bank holds two or more model sizes at least ``MIN_SIZE_SPAN``× apart."""
    sizes = [n for n in (curve_size(c) for c in curves) if n is not None]
    return len(sizes) == len(list(curves)) and bool(sizes) and max(sizes) / min(sizes) >= MIN_SIZE_SPAN


#: A method more complex than another is chosen only when its leave-one-size-out score is lower
#: by more than this many standard errors of the paired per-size difference (issue 28).
CHOICE_NOISE_Z = 2.0


@dataclass(frozen=True, eq=False)
class SizeChoice:
    """The leave-one-size-out comparison of :func:`size_methods`: each method's predictions
    (with its held-out groups) and score, the chosen one and why (:func:`pick_within_noise`)."""

    chosen: Method
    held: Mapping[str, HeldOutPredictions]
    scores: Mapping[str, float]
    why: str = ""


def choose_size_method(
    curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any], fractions: Sequence[float] = DECISION_FRACTIONS,
    refits: Optional[Refits] = None, progress: Optional[Callable[[str], None]] = None,
) -> SizeChoice:
    """How model size enters the shipped predictor, chosen by leave-one-size-out.

    Every :func:`size_methods` entry predicts each size from a refit without it (and, for the
    report, the extrapolation refits); the score is :func:`size_score`, and the choice
    :func:`pick_within_noise`: the simplest method whose score is within its noise of the
    lowest (a method more complex than another is chosen only when it beats it by more than
    the noise of the comparison).
    A bank of one size (or sizes within ``MIN_SIZE_SPAN``×) cannot compare them: the plain
    surrogate is chosen, with no predictions.
    """
    methods = size_methods(fit_kwargs)
    surrogate = next(m for m in methods if m.name == "surrogate")
    if not spans_sizes(curves):
        return SizeChoice(surrogate, {}, {}, "one model size: the plain surrogate")
    refits = refits if refits is not None else Refits(curves)
    held: dict[str, HeldOutPredictions] = {}
    scores: dict[str, float] = {}
    for method in methods:
        h = axis_predictions(curves, "leave-one-size-out", fractions=fractions, method=method, refits=refits,
                             progress=progress)
        if h is None:
            continue
        held[method.name] = h
        scores[method.name] = size_score(h)
    if not scores:
        return SizeChoice(surrogate, {}, {}, "no size held out: the plain surrogate")
    name, why = pick_within_noise({m.name: size_scores(held[m.name]) for m in methods if m.name in held})
    return SizeChoice(next(m for m in methods if m.name == name), held, scores, why)


def size_scores(held: HeldOutPredictions) -> dict[float, float]:
    """Per held-out size (its N), the mean over s ≤ 0.3 of its RMS relative error, from the
    leave-one-size-out groups (NaN where none was predicted)."""
    out = {}
    for g in held.groups:
        if g.scheme != held.scheme:
            continue
        r = [r for s, r in zip(held.fractions, g.rms()) if s <= CHOICE_FRACTIONS_MAX + 1e-9 and np.isfinite(r)]
        out[float(g.value)] = float(np.mean(r)) if r else float("nan")
    return out


def size_score(held: HeldOutPredictions) -> float:
    """The mean over held-out sizes of :func:`size_scores`: every size counts once, so a size
    with many curves (the reference size of a bank, typically) does not drown the end sizes."""
    values = [v for v in size_scores(held).values() if np.isfinite(v)]
    return float(np.mean(values)) if values else math.inf


def pick_within_noise(per_size: Mapping[str, Mapping[float, float]], z: float = CHOICE_NOISE_Z) -> tuple[str, str]:
    """(the chosen method, the rule in words) from each method's score per held-out size,
    methods in order of simplicity (the first the simplest).

    The rule (issue 28): the method with the lowest mean score is the best; a simpler method
    is chosen instead unless the best beats it by more than the noise of the comparison, i.e.
    unless the mean of the paired per-size differences (simpler − best, over the sizes both
    predicted) exceeds ``z`` standard errors of that mean. With fewer than 2 sizes in common the
    noise is unknown, and the simpler method stands. With a handful of sizes and one seed per
    size, a lower mean is often one size's luck; this keeps a fitted size trend out unless it
    wins at every size held out by about the same margin."""
    names = list(per_size)
    means = {n: float(np.nanmean(list(v.values()))) if any(np.isfinite(list(v.values()))) else math.inf
             for n, v in per_size.items()}
    best = min(names, key=lambda n: (means[n], names.index(n)))
    for name in names[:names.index(best)]:
        common = [n for n in per_size[name] if n in per_size[best]
                  and np.isfinite(per_size[name][n]) and np.isfinite(per_size[best][n])]
        d = np.array([per_size[name][n] - per_size[best][n] for n in common])
        noise = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) >= 2 else math.inf
        gain = float(np.mean(d)) if len(d) else math.nan
        if not (gain > z * noise):
            return name, (f"{name}: {best} scored lower ({100 * means[best]:.2f}% against {100 * means[name]:.2f}%), "
                          f"but by {100 * gain:.2f}%, within {z:g} standard errors ({100 * z * noise:.2f}%) of the "
                          f"paired difference over {len(d)} held-out sizes: the simpler method")
    return best, (f"{best}: the lowest score ({100 * means[best]:.2f}%), lower than every simpler method by more "
                  f"than {z:g} standard errors of the paired difference over the held-out sizes"
                  if names.index(best) else f"{best}: the lowest score ({100 * means[best]:.2f}%)")
