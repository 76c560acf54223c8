"""The decision error off the calibrated scale (predictors/distance.py): σ sized to the errors
held out at the run's distance, one distance counted once, the side of the range respected."""

from __future__ import annotations

import math

import pytest

from predictors.distance import ErrorGroup, off_scale_error
from predictors.ranking import Position

FRACTIONS = (0.1, 0.3)
E_IN = 0.01


def _group(axis: str, d: float, rms: float, direction=None, n: int = 2) -> ErrorGroup:
    return ErrorGroup("held out", 1.0, Position(axis, False, d), n, (rms, rms), (0.0, 0.0), direction)


def test_error_is_the_rms_the_groups_show_at_that_distance_not_the_largest():
    # Three groups on the N axis at log distance 0.5: two with 2% errors, one poor one with 6%.
    # The stated error is their RMS excess at that distance (about 4%), not the worst (6%).
    groups = [_group("n_params", 0.5, 0.02), _group("n_params", 0.5, 0.02), _group("n_params", 0.5, 0.06)]
    e, words, _ = off_scale_error(groups, FRACTIONS, 0.1, E_IN, [Position("n_params", False, 0.5)])
    expected = math.sqrt(E_IN ** 2 + (2 * (0.02**2 - E_IN**2) + (0.06**2 - E_IN**2)) / 3)
    assert e == pytest.approx(expected) and e < 0.06
    # Twice the distance: the trend grows the excess with d (said so beyond the farthest group).
    far, words, _ = off_scale_error(groups, FRACTIONS, 0.1, E_IN, [Position("n_params", False, 1.0)])
    assert far**2 - E_IN**2 == pytest.approx(4 * (expected**2 - E_IN**2))
    assert "farther than any held-out group" in words[0]


def test_tpp_and_size_off_together_count_one_distance_once():
    groups = [_group("n_params", 0.7, 0.03), _group("tokens_per_param", 0.7, 0.04)]
    both = [Position("n_params", False, 0.7), Position("tokens_per_param", False, 0.7)]
    e, words, _ = off_scale_error(groups, FRACTIONS, 0.1, E_IN, both)
    assert e == pytest.approx(0.04)  # the larger, not sqrt(e_in² + both excesses) = 0.049
    assert any("counted once" in w for w in words)
    # τ is another control: its excess still adds.
    tau = off_scale_error([*groups, _group("tau", 0.7, 0.03)], FRACTIONS, 0.1, E_IN,
                          [*both, Position("tau", False, 0.7)])[0]
    assert tau == pytest.approx(math.sqrt(0.04**2 + 0.03**2 - E_IN**2))


def test_a_run_above_the_calibrated_sizes_gets_the_errors_held_out_above():
    # Extrapolating down to the smallest models went badly (8%); up, 2%. A run above gets 2%.
    groups = [_group("n_params", 0.8, 0.02, "above"), _group("n_params", 0.8, 0.08, "below")]
    pos = [Position("n_params", False, 0.8)]
    assert off_scale_error(groups, FRACTIONS, 0.1, E_IN, pos, {"n_params": "above"})[0] == pytest.approx(0.02)
    assert off_scale_error(groups, FRACTIONS, 0.1, E_IN, pos, {"n_params": "below"})[0] == pytest.approx(0.08)
    # Groups from files without a direction are matched on either side.
    both = off_scale_error([_group("n_params", 0.8, 0.02), _group("n_params", 0.8, 0.08)], FRACTIONS, 0.1, E_IN,
                           pos, {"n_params": "above"})[0]
    assert 0.02 < both < 0.08
    assert ErrorGroup.from_dict(groups[0].to_dict()) == groups[0]


def test_both_off_scale_rules_take_only_groups_on_the_same_side_of_the_range():
    # Held out beyond the calibrated sizes: 2%; interpolated inside them: 8%. A run beyond gets
    # the error of the extrapolations, from the decision error and from the order's scale alike.
    from predictors.ranking import HeldOutGroup, KindError, RankingError

    beyond, inside = Position("n_params", False, 0.8), Position("n_params", True, 0.8)
    groups = [ErrorGroup("held out", 1.0, beyond, 2, (0.02, 0.02), (0.0, 0.0)),
              ErrorGroup("held out", 2.0, inside, 2, (0.08, 0.08), (0.0, 0.0))]
    assert off_scale_error(groups, FRACTIONS, 0.1, E_IN, [Position("n_params", False, 0.5)])[0] < 0.02

    def kind(scale: float) -> dict[str, KindError]:
        return {"lambda": KindError(FRACTIONS, (scale, scale), (scale, scale), (10, 10), (2, 2))}

    table = RankingError(kind(0.01), cross_groups=(HeldOutGroup(1.0, beyond, kind(0.02)),
                                                   HeldOutGroup(2.0, inside, kind(0.08))))
    assert table.order_at(0.1, "lambda", [Position("n_params", False, 0.5)]).scale == pytest.approx(0.02)
    assert table.order_at(0.1, "lambda", [Position("n_params", True, 0.5)]).scale == pytest.approx(0.08)
    # The rules differ on purpose beyond that: the order takes the worst group held out at least
    # as far (a keep margin), the decision error the RMS trend at the distance (a stated band).
    assert Position("n_params", False, 0.5).analogous(beyond) and not beyond.analogous(inside)


# Asserts: the per-situation fits a predictor memoises (``fits``) give the numbers and words
# the unmemoised call gives, at every distance asked, inside and beyond the range.
def test_memoised_fits_give_the_same_error_and_words_at_each_distance():
    groups = [_group("tau", 0.4, 0.02), _group("tau", 0.8, 0.03), _group("n_params", 0.5, 0.02),
              ErrorGroup("held out", 1.0, Position("tau", True, 0.3), 2, (0.015, 0.015), (0.0, 0.0))]
    fits: dict = {}
    for d in (0.1, 0.5, 1.3, math.inf):
        for pos in ([Position("tau", False, d, "above")], [Position("tau", True, d)],
                    [Position("tau", False, d, "below"), Position("n_params", False, d, "above")]):
            directions = {p.axis: p.direction for p in pos if p.direction}
            assert (off_scale_error(groups, FRACTIONS, 0.1, E_IN, pos, directions, fits=fits)
                    == off_scale_error(groups, FRACTIONS, 0.1, E_IN, pos, directions))
    assert len(fits) == 4  # one fit per situation, reused across distances
