"""The table of sweep kinds (predictors/kinds.py): the rules that name a sweep's kind and find
the sweeps of a kind agree with what each kind says it varies and holds."""

from __future__ import annotations

import pytest

from predictors.kinds import kind_groups, sweep_kind
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
    assert sweep_kind(_sweep(kind)) == kind.name
    items = {f"r{i}": {**run, "seed": 0} for i, run in enumerate(_sweep(kind))}
    assert kind_groups(items, kind.name) == [["r0", "r1"]]


def test_labels_and_groups_derive_from_the_table() -> None:
    assert list(SWEEP_KINDS) == [k.name for k in KINDS]
    assert set(KIND_GROUPS["fixed_tau"]) | set(KIND_GROUPS["varying_tau"]) == set(SWEEP_KINDS)
    assert not set(KIND_GROUPS["fixed_tau"]) & set(KIND_GROUPS["varying_tau"])
    with pytest.raises(KeyError, match="unknown sweep kind 'nope'"):
        kind_axes("nope")


@pytest.mark.parametrize("values, kind", [
    ([{"eta": 0.01, "batch_size": 2048, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}], "eta_fixed_tau"),
    ([{"eta": 0.01, "batch_size": 1024, "tau": 0.3}, {"eta": 0.01, "batch_size": 2048, "tau": 0.3}], "batch_fixed_tau"),
    ([{"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.6},
      {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.2, "tau": 0.3}], "lambda"),
    ([{"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.6},
      {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.3}], "eta_fixed_lambda"),
    ([{"eta": 0.01, "batch_size": 1024, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}], "fixed_tau"),
    ([{"tau": 0.3}, {"tau": 0.6}], "varying_tau"),
    ([{"tau": 0.3, "tokens_per_param": 20}, {"tau": 0.3, "tokens_per_param": 80}], "mixed"),
])
def test_sweep_kind(values, kind) -> None:
    assert sweep_kind(values) == kind


def test_kind_groups_pair_runs_that_differ_only_in_the_swept_value() -> None:
    items = {
        "a": {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.10, "tau": 0.3, "seed": 1},
        "b": {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.05, "tau": 0.3, "seed": 1},
        "c": {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.05, "tau": 0.3, "seed": 2},
        "d": {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1005, "tau": 0.6, "seed": 1},
    }
    assert kind_groups(items, "eta_fixed_tau") == [["a", "b"]]  # c has another seed
    assert kind_groups(items, "lambda") == []  # a and d share λ within 1%
    assert kind_groups(items, "eta_fixed_lambda") == []


# Asserts: replicates with nearby seed numbers (201, 202) are separate sweeps: a seed is a name,
# not a magnitude within 1% (pooling them put seed noise into the measured order error).
def test_kind_groups_keep_replicate_seeds_apart() -> None:
    items = {f"{s}{e}": {"eta": e, "batch_size": 2048, "weight_decay": 0.1 * 0.01 / e, "tau": 0.3, "seed": s,
                         "data_seed": s} for s in (201, 202) for e in (0.01, 0.02)}
    assert kind_groups(items, "eta_fixed_tau") == [["2010.01", "2010.02"], ["2020.01", "2020.02"]]
