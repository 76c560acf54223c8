"""The table of sweep kinds (predictors/kinds.py): the rules that name a sweep's kind and find
the sweeps of a kind agree with what each kind says it varies and holds."""

from __future__ import annotations

import pytest

from hpo.decisions import rules
from predictors.kinds import KIND_GROUPS, KINDS, SWEEP_KINDS, SweepKind, kind_axes

#: Two values per sweep value, so that a sweep of any kind can be written down.
_VALUES = {"eta": (0.01, 0.02), "batch_size": (1024, 2048), "weight_decay": (0.1, 0.2), "tau": (0.3, 0.6)}


def _sweep(kind: SweepKind) -> list[dict[str, float]]:
    """Two runs that vary what ``kind`` varies, hold what it holds, and let τ follow
    (τ = B/(η·λ·D): it moves unless held)."""
    runs = []
    for i in range(2):
        run = {k: _VALUES[k][0] for k in kind.holds}
        run[kind.varies] = _VALUES[kind.varies][i]
        if "tau" not in kind.holds:
            run["tau"] = _VALUES["tau"][i]
        runs.append(run)
    return runs


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_sweep_built_from_its_row_is_named_that_kind(kind: SweepKind) -> None:
    assert rules.sweep_kind(_sweep(kind)) == kind.name
    items = {f"r{i}": {**run, "seed": 0} for i, run in enumerate(_sweep(kind))}
    assert rules.kind_groups(items, kind.name) == [["r0", "r1"]]


def test_labels_and_groups_derive_from_the_table() -> None:
    assert list(SWEEP_KINDS) == [k.name for k in KINDS]
    assert set(KIND_GROUPS["fixed_tau"]) | set(KIND_GROUPS["varying_tau"]) == set(SWEEP_KINDS)
    assert not set(KIND_GROUPS["fixed_tau"]) & set(KIND_GROUPS["varying_tau"])
    with pytest.raises(KeyError, match="unknown sweep kind 'nope'"):
        kind_axes("nope")
