"""How model size enters the shipped predictor: the size methods, compared leave-one-size-out.

Where the bank spans two or more model sizes, :func:`choose_size_method` predicts every size
leave-one-size-out (``hpo.calibration.held_out.axis_predictions``) with each of :func:`size_methods` (the
nearest size's reference curves held, the plain surrogate, the surrogate with a size term, and
reference curves extrapolated along the size term), and the calibration ships the simplest one
unless a more complex one beats it by more than the noise of the comparison
(:func:`pick_paired`: paired per held-out curve, issues 28 and 37).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from hpo.calibration.held_out import GroupPredictions, HeldOutPredictions, Method, Refits, axis_predictions
from predictors import Curve
from predictors.curves import curve_size
from predictors.predictor import DECISION_FRACTIONS

#: Values on an axis must span this factor for the size comparison (as the fit's size term).
MIN_SIZE_SPAN = 1.5
#: The stop fractions that judge a size method (the decision fractions, as the mode choice).
CHOICE_FRACTIONS_MAX = 0.3


def size_methods(fit_kwargs: Mapping[str, Any]) -> list[Method]:
    """The ways model size can enter a prediction, compared by :func:`choose_size_method`,
    simplest first (the fallback of :func:`pick_paired`): the calibrated curve of the
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


#: A richer method is chosen only when its mean gain over a simpler one, on the held-out curves
#: where their predictions differ, exceeds this many standard errors of that mean (issue 28, 37).
CHOICE_NOISE_Z = 2.0
#: Two predictions of one held-out curve within this relative distance of each other (at every
#: judged s) coincide: that curve says nothing about which method is better (issue 37).
COINCIDE_TOLERANCE = 1e-6
#: Folds whose refit saw fewer sizes than this do not judge a size method: the shipped calibration
#: always spans two or more, and a refit on one has no size trend to compare; its extrapolations
#: 4-16x away are so wrong for every method (the width ladder: 8-16% at s = 0.1) that their spread
#: drowns the folds that do tell the methods apart.
MIN_FOLD_SIZES = 2


@dataclass(frozen=True)
class PairedCurve:
    """One held-out curve of one fold, predicted by two size methods: its fold (``scheme``:
    leave-one-size-out or an extrapolation; ``value``: the held-out N; ``distance``: |log| to the
    nearest size the refit saw, ``inside`` the calibrated range or beyond), the curve (index
    into the bank, seed), each method's error (mean over s ≤ 0.3 of |relative error of the
    final|) and whether the two predictions coincide."""

    scheme: str
    value: float
    inside: bool
    distance: float
    curve: int
    seed: Any
    simpler_error: float
    richer_error: float
    coincide: bool

    @property
    def difference(self) -> float:
        """simpler − richer: > 0 where the richer method is better at this curve."""
        return self.simpler_error - self.richer_error


@dataclass(frozen=True)
class PairedComparison:
    """A richer size method against a simpler one, per held-out curve (:func:`compare_paired`).

    ``gain`` is the mean of the paired differences (simpler − richer error) over the curves
    where the predictions differ; ``noise`` its standard error: the spread of those differences
    (``spread``, their standard deviation, over √n) combined with the seed noise of the true
    finals (``seed_noise``: each distinct curve counted once, however many folds held it out;
    None when the bank holds no replicate seeds). The richer method ``beats`` the simpler when
    ``gain > z · noise``; with fewer than 2 differing curves the noise is unknown and it does not.
    """

    simpler: str
    richer: str
    pairs: tuple[PairedCurve, ...]
    gain: float
    spread: float
    seed_noise: Optional[float]
    noise: float
    z: float

    @property
    def differing(self) -> tuple[PairedCurve, ...]:
        return tuple(p for p in self.pairs if not p.coincide)

    @property
    def beats(self) -> bool:
        return bool(math.isfinite(self.noise) and self.gain > self.z * self.noise)

    def words(self) -> str:
        n, k = len(self.pairs), len(self.differing)
        seed = ("no replicate seeds: spread only" if self.seed_noise is None
                else f"seed noise {100 * self.seed_noise:.2f}%")
        if k < 2:
            return (f"{self.richer} vs {self.simpler}: they differ on {k} of {n} held-out curves, too few to "
                    "measure the noise")
        verdict = "better by more than the noise" if self.beats else "within the noise"
        return (f"{self.richer} vs {self.simpler}: mean gain {100 * self.gain:+.2f}% on the {k} of {n} held-out "
                f"curves where they differ, {self.z:g}σ noise {100 * self.z * self.noise:.2f}% ({seed}): {verdict}")

    def to_dict(self) -> dict[str, Any]:
        return {"simpler": self.simpler, "richer": self.richer, "n_pairs": len(self.pairs),
                "n_differ": len(self.differing), "gain": self.gain, "spread": self.spread,
                "seed_noise": self.seed_noise, "noise": self.noise if math.isfinite(self.noise) else None,
                "z": self.z, "beats": self.beats, "words": self.words(),
                "pairs": [{"scheme": p.scheme, "n_params": p.value, "inside": p.inside, "distance": p.distance,
                           "curve": p.curve, "seed": p.seed, "simpler_error": p.simpler_error,
                           "richer_error": p.richer_error, "coincide": p.coincide} for p in self.pairs]}


@dataclass(frozen=True, eq=False)
class SizeChoice:
    """The leave-one-size-out comparison of :func:`size_methods`: each method's predictions
    (with its held-out groups) and score, the paired comparisons behind the choice
    (:func:`pick_paired`), the chosen one and why."""

    chosen: Method
    held: Mapping[str, HeldOutPredictions]
    scores: Mapping[str, float]
    why: str = ""
    comparisons: tuple[PairedComparison, ...] = ()


def choose_size_method(
    curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any], fractions: Sequence[float] = DECISION_FRACTIONS,
    refits: Optional[Refits] = None, progress: Optional[Callable[[str], None]] = None,
) -> SizeChoice:
    """How model size enters the shipped predictor, chosen by leave-one-size-out.

    Every :func:`size_methods` entry predicts each size from a refit without it, and every size
    beyond the ones up to (down from) each size (the extrapolation refits); the score of a
    method is the mean over every held-out curve of every such fold of :func:`curve_errors`,
    and the choice :func:`pick_paired`: the methods compared curve by curve, a richer one
    chosen only when it beats every simpler one by more than the noise on the curves where
    their predictions differ.
    A bank of one size (or sizes within ``MIN_SIZE_SPAN``×) cannot compare them: the plain
    surrogate is chosen, with no predictions.
    """
    from hpo.calibration.ranking_error import seed_noise

    methods = size_methods(fit_kwargs)
    surrogate = next(m for m in methods if m.name == "surrogate")
    if not spans_sizes(curves):
        return SizeChoice(surrogate, {}, {}, "one model size: the plain surrogate")
    refits = refits if refits is not None else Refits(curves)
    held: dict[str, HeldOutPredictions] = {}
    for method in methods:
        h = axis_predictions(curves, "leave-one-size-out", fractions=fractions, method=method, refits=refits,
                             progress=progress)
        if h is not None:
            held[method.name] = h
    if not held:
        return SizeChoice(surrogate, {}, {}, "no size held out: the plain surrogate")
    noise = seed_noise(curves)
    seeds = [c.meta.get("seed") for c in curves]
    name, why, comparisons = pick_paired({m.name: held[m.name] for m in methods if m.name in held},
                                         seed_noise=None if noise is None else noise[0], seeds=seeds)
    scores = {n: size_score(h) for n, h in held.items()}
    return SizeChoice(next(m for m in methods if m.name == name), held, scores, why, comparisons)


def curve_errors(held: HeldOutPredictions) -> dict[tuple[str, float, float, int], tuple[float, np.ndarray]]:
    """Per held-out curve of every fold ((scheme, N, distance, curve index): leave-one-size-out
    and the extrapolations: :func:`judging_groups`), (its error: the mean over s ≤ 0.3 of |relative error of the
    predicted final|, NaN where none was predicted; its predictions relative to the truth at
    those s)."""
    judged = [k for k, s in enumerate(held.fractions) if s <= CHOICE_FRACTIONS_MAX + 1e-9]
    out = {}
    for g in judging_groups(held):
        rel = g.rel_errors()[judged]
        for col, i in enumerate(g.members):
            r = rel[:, col]
            ok = np.isfinite(r)
            out[(g.scheme, float(g.value), float(g.position.distance), int(i))] = (
                float(np.mean(np.abs(r[ok]))) if ok.any() else float("nan"), r)
    return out


def judging_groups(held: HeldOutPredictions) -> list[GroupPredictions]:
    """The folds of ``held`` that judge a size method: those whose refit saw ``MIN_FOLD_SIZES``
    or more sizes (every fold where none did: a bank of two sizes)."""
    enough = [g for g in held.groups if not g.seen or len(g.seen) >= MIN_FOLD_SIZES]
    return enough or list(held.groups)


def size_score(held: HeldOutPredictions) -> float:
    """The mean of :func:`curve_errors` over every held-out curve of every fold."""
    values = [e for e, _ in curve_errors(held).values() if np.isfinite(e)]
    return float(np.mean(values)) if values else math.inf


def compare_paired(simpler: str, richer: str, a: HeldOutPredictions, b: HeldOutPredictions, *,
                   seed_noise: Optional[float] = None, seeds: Optional[Sequence[Any]] = None,
                   z: float = CHOICE_NOISE_Z) -> PairedComparison:
    """``richer`` (predictions ``b``) against ``simpler`` (``a``), curve by curve over the folds
    both predicted (:class:`PairedComparison`). A curve whose two predictions coincide
    (within ``COINCIDE_TOLERANCE`` of its truth at every judged s) is kept in the table but adds
    no evidence either way: the gain and its noise are measured on the curves where they differ."""
    ea, eb = curve_errors(a), curve_errors(b)
    pairs = []
    for key, (err_a, rel_a) in ea.items():
        if key not in eb:
            continue
        err_b, rel_b = eb[key]
        if not (np.isfinite(err_a) and np.isfinite(err_b)):
            continue
        both = np.isfinite(rel_a) & np.isfinite(rel_b)
        coincide = bool(np.all(np.abs(rel_a[both] - rel_b[both]) <= COINCIDE_TOLERANCE))
        scheme, value, _, i = key
        position = next(g.position for g in a.groups if g.scheme == scheme and g.value == value
                        and float(g.position.distance) == key[2] and i in g.members)
        pairs.append(PairedCurve(scheme, value, bool(position.inside), float(position.distance), i,
                                 None if seeds is None else seeds[i], err_a, err_b, coincide))
    differ = [p for p in pairs if not p.coincide]
    d = np.array([p.difference for p in differ])
    k = len(d)
    gain = float(np.mean(d)) if k else 0.0
    spread = float(np.std(d, ddof=1)) if k >= 2 else math.nan
    if k < 2:
        noise = math.inf
    else:
        # The truths carry seed noise: a curve held out by several folds carries one draw of it,
        # so its weight in the mean counts once with its number of folds (Σ (n_c / k)²).
        counts: dict[int, int] = {}
        for p in differ:
            counts[p.curve] = counts.get(p.curve, 0) + 1
        seed_var = (seed_noise or 0.0) ** 2 * sum((n / k) ** 2 for n in counts.values())
        noise = math.sqrt(spread ** 2 / k + seed_var)
    return PairedComparison(simpler, richer, tuple(pairs), gain, spread, seed_noise, noise, z)


def pick_paired(held: Mapping[str, HeldOutPredictions], *, seed_noise: Optional[float] = None,
                seeds: Optional[Sequence[Any]] = None,
                z: float = CHOICE_NOISE_Z) -> tuple[str, str, tuple[PairedComparison, ...]]:
    """(the chosen method, the rule in words, every comparison made) from each method's
    held-out predictions, methods in order of simplicity (the first the simplest).

    The rule (issue 37): every richer method is compared with every simpler one curve by curve
    (:func:`compare_paired`: over every held-out curve of every fold, the folds where the two
    coincide adding nothing). A method is *admissible* when it beats every simpler method by
    more than the noise; the simplest always is. The chosen method is the admissible one with
    the lowest score (mean error over the held-out curves), the simpler on a tie. Comparing per
    curve rather than per fold mean lets a method that is much better where it differs win even
    where it coincides with the simpler one on half the folds (the size trend and the nearest
    width agree wherever the nearest width is a neighbour); a gain smaller than the seed noise
    of the finals, or than the spread of the differences, keeps the simpler method."""
    names = list(held)
    scores = {n: size_score(h) for n, h in held.items()}
    comparisons = tuple(compare_paired(names[i], names[j], held[names[i]], held[names[j]],
                                       seed_noise=seed_noise, seeds=seeds, z=z)
                        for j in range(len(names)) for i in range(j))
    beaten = {(c.simpler, c.richer): c for c in comparisons}
    admissible = [n for j, n in enumerate(names) if all(beaten[(s, n)].beats for s in names[:j])]
    best = min(admissible, key=lambda n: (scores[n], names.index(n)))
    overall = min(names, key=lambda n: (scores[n], names.index(n)))
    if best == names[0] and overall != best:
        c = beaten[(names[0], overall)]
        why = (f"{best}: {overall} scored lower ({100 * scores[overall]:.2f}% against {100 * scores[best]:.2f}%), "
               f"but not by more than the noise ({c.words()}): the simpler method")
    elif best == overall:
        why = (f"{best}: the lowest score ({100 * scores[best]:.2f}% mean |error| over the held-out curves)"
               + ("" if best == names[0] else ", better than every simpler method by more than the noise on the "
                  "curves where they differ (" + "; ".join(beaten[(s, best)].words() for s in names[:names.index(best)])
                  + ")"))
    else:
        blocking = [beaten[(s, overall)] for s in names[:names.index(overall)] if not beaten[(s, overall)].beats]
        why = (f"{best}: better than every simpler method by more than the noise; {overall} scored lower "
               f"({100 * scores[overall]:.2f}% against {100 * scores[best]:.2f}%) but not beyond the noise of "
               + "; ".join(c.words() for c in blocking))
    return best, why, comparisons
