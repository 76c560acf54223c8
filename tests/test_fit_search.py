"""The fit's search (predictors/fit_search.py): a state with a free mask, moved by coordinate
steps that only ever lower the objective and never touch a parameter the mask holds."""

from __future__ import annotations

import pytest

from predictors.fit import FitSettings
from predictors.fit_objective import FitBounds, prepare, table_axes
from predictors.fit_search import FitState, FreeMask, Search, alternate, free_mask, identifiability, refine
from tests.test_fit import TRUE, make_curves


def _search(curves, free: FreeMask) -> Search:
    d = prepare(curves, 0.2, 1.0, 100, TRUE.eps1, TRUE.eps2)
    return Search(d, FitBounds(), free, 11, 0.0, *table_axes(FitBounds(), 61))


def test_steps_lower_the_objective_and_hold_what_the_mask_holds() -> None:
    curves = make_curves(TRUE, noise=0.002, seed=3)
    start = FitState(0.1, 0.0, 1.0, 0.0, 0.05)
    held = _search(curves, FreeMask(q_const=False, q_exp=False))
    state, best, _ = alternate(held, start, 5)
    assert best < held.score(start)
    assert (state.q_const, state.q_exp, state.m) == (1.0, 0.0, 0.05)
    # Free, q moves towards the generating value and the fit gets better still.
    free = _search(curves, FreeMask())
    state_free, best_free, _ = alternate(free, start, 5)
    assert best_free < best and state_free.q_const != 1.0
    polished, after = refine(free, state_free, best_free)
    assert after <= best_free and polished.m == 0.05


def test_a_single_tpp_bank_frees_no_tpp_exponent() -> None:
    d = prepare(make_curves(TRUE, tpps=[20.0]), 0.2, 1.0, 100, TRUE.eps1, TRUE.eps2)
    fixed, notes = identifiability(d)
    mask = free_mask(fixed, fit_m=True, size_term=True, fit_irreducible=False)
    assert not mask.q_exp and mask.q_const and mask.m and not mask.m_size_exp
    assert any("q_exp not identifiable" in n for n in notes)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="t_min"):
        FitSettings(t_min=0.8, t_max=0.5)
    with pytest.raises(ValueError, match="m = 0.9 is outside the bounds"):
        FitSettings(m=0.9)
