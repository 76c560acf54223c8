"""How model size enters the shipped predictor (hpo/calibration/size_choice.py): the methods compared
per held-out curve, a richer one chosen only when it wins by more than the noise where it differs."""

from __future__ import annotations

import numpy as np

from hpo.calibration.held_out import GroupPredictions, HeldOutPredictions
from hpo.calibration.size_choice import compare_paired, pick_paired
from predictors.ranking import Position

FRACTIONS = (0.1, 0.2, 0.3)
SIZES = (1e4, 1e5, 1e6, 1e7)


def held(errors: dict[float, list[float]], extra: tuple[tuple[float, list[float], tuple[float, ...]], ...] = ()
         ) -> HeldOutPredictions:
    """Leave-one-size-out predictions of a 4-size bank with one relative error of the final per
    held-out curve (the same at every s), two curves (seeds) per size; ``extra`` folds: (N, errors,
    sizes the refit saw)."""
    truth = np.ones(2 * len(SIZES))
    groups, members = [], {n: (2 * k, 2 * k + 1) for k, n in enumerate(SIZES)}
    folds = [(n, errors[n], tuple(m for m in SIZES if m != n), "leave-one-size-out") for n in SIZES]
    folds += [(n, e, seen, "size extrapolation upward") for n, e, seen in extra]
    for n, e, seen, scheme in folds:
        position = Position.of(n, list(seen), "n_params")
        predicted = np.tile(1.0 + np.asarray(e), (len(FRACTIONS), 1))
        groups.append(GroupPredictions(scheme, n, position, members[n], predicted, np.zeros_like(predicted),
                                       truth[list(members[n])], seen))
    predicted = np.full((len(FRACTIONS), truth.size), np.nan)
    return HeldOutPredictions("leave-one-size-out", FRACTIONS, predicted, predicted.copy(), truth, len(SIZES),
                              tuple(groups))


def test_a_method_much_better_where_it_differs_is_chosen_though_it_coincides_on_half_the_folds() -> None:
    # The nearest width and the size trend interpolate alike: identical at the two interior
    # sizes; at the end sizes the trend is ~10× better on every curve. Per fold mean with the
    # coinciding folds counted as zero differences, the gain would sit within 2 SE; per curve
    # where they differ, it is far beyond the noise.
    interior = {1e5: [0.010, -0.012], 1e6: [0.008, 0.011]}
    nearest = held({1e4: [0.030, 0.034], 1e7: [-0.041, -0.036], **interior},
                   ((1e6, [0.050, 0.046], (1e4, 1e5)),))
    trend = held({1e4: [0.003, -0.002], 1e7: [0.004, 0.002], **interior},
                 ((1e6, [0.006, 0.004], (1e4, 1e5)),))
    methods = {"reference curves": nearest, "reference curves, size-term trend": trend}
    name, why, comparisons = pick_paired(methods, seed_noise=0.003)
    assert name == "reference curves, size-term trend"
    (c,) = comparisons
    assert len(c.pairs) == 10 and len(c.differing) == 6 and c.beats
    assert "on the 6 of 10 held-out curves where they differ" in why


def test_a_gain_within_the_seed_noise_keeps_the_simpler_method() -> None:
    # The trend is better by ~0.2% where it differs, steadily (a small spread), but the finals
    # themselves scatter 1% between seeds: no evidence the trend is better; the simpler stays.
    interior = {1e5: [0.010, -0.012], 1e6: [0.008, 0.011]}
    nearest = held({1e4: [0.012, 0.013], 1e7: [-0.011, -0.012], **interior})
    trend = held({1e4: [0.010, 0.011], 1e7: [-0.009, -0.010], **interior})
    methods = {"reference curves": nearest, "reference curves, size-term trend": trend}
    name, why, (c,) = pick_paired(methods, seed_noise=0.01)
    assert name == "reference curves" and not c.beats and c.gain > 0
    assert "not by more than the noise" in why
    # The same gain with finals that do not scatter between seeds: beyond the noise.
    assert pick_paired(methods, seed_noise=0.0)[0] == "reference curves, size-term trend"


def test_methods_that_coincide_everywhere_give_no_evidence_and_the_simpler_stands() -> None:
    same = {1e4: [0.03, 0.03], 1e5: [0.01, 0.01], 1e6: [0.01, 0.01], 1e7: [0.03, 0.03]}
    c = compare_paired("reference curves", "reference curves, size-term trend", held(same), held(same))
    assert not c.differing and not c.beats and "too few to measure the noise" in c.words()


def test_a_fold_calibrated_on_one_size_does_not_judge_a_size_method() -> None:
    # Extrapolating from one size is wrong for every method by far more than the differences
    # that matter; such a fold is left out of the comparison.
    base = {1e4: [0.03, 0.03], 1e5: [0.01, 0.012], 1e6: [0.011, 0.01], 1e7: [0.03, 0.031]}
    a = held(base, ((1e7, [0.4, -0.3], (1e4,)),))
    b = held(base, ((1e7, [-0.2, 0.1], (1e4,)),))
    c = compare_paired("reference curves", "size term", a, b)
    assert len(c.pairs) == 8 and all(p.scheme == "leave-one-size-out" for p in c.pairs)


def test_a_richer_method_must_beat_every_simpler_one() -> None:
    # The size term beats the nearest width clearly but not the plain surrogate: the surrogate
    # (simpler than the size term, and itself beyond the noise of the nearest width).
    nearest = held({1e4: [0.05, 0.052], 1e5: [0.04, 0.041], 1e6: [0.04, 0.042], 1e7: [0.05, 0.049]})
    surrogate = held({1e4: [0.010, 0.011], 1e5: [0.009, 0.010], 1e6: [0.010, 0.012], 1e7: [0.011, 0.010]})
    size_term = held({1e4: [0.004, 0.016], 1e5: [0.015, 0.002], 1e6: [0.003, 0.017], 1e7: [0.012, 0.006]})
    name, _, comparisons = pick_paired({"reference curves": nearest, "surrogate": surrogate, "size term": size_term},
                                       seed_noise=0.002)
    assert name == "surrogate" and len(comparisons) == 3


def test_the_calibration_report_shows_the_paired_differences_the_choice_used() -> None:
    from hpo.calibration import report
    from hpo.calibration.held_out import Method
    from hpo.calibration.size_choice import SizeChoice, size_score

    interior = {1e5: [0.010, -0.012], 1e6: [0.008, 0.011]}
    methods = {"reference curves": held({1e4: [0.030, 0.034], 1e7: [-0.041, -0.036], **interior}),
               "reference curves, size-term trend": held({1e4: [0.003, -0.002], 1e7: [0.004, 0.002], **interior})}
    name, why, comparisons = pick_paired(methods, seed_noise=0.003)
    choice = SizeChoice(Method(name), methods, {n: size_score(h) for n, h in methods.items()}, why, comparisons)
    lines = report._size_markdown({"five-parameter": {"size_comparison": report._size_comparison(choice),
                                                      "size_choice_rule": why}}, "0.1 / 0.2 / 0.3")
    text = "\n".join(lines)
    assert "Paired differences behind the choice" in text
    # One row per fold (the interior folds: both curves coincide, no evidence) and the verdict.
    fold_rows = [line for line in text.splitlines() if "| leave-one-size-out" in line]
    assert len(fold_rows) == 4 and sum("no evidence" in line for line in fold_rows) == 2
    assert any("all folds" in line and ": richer" in line for line in text.splitlines())
