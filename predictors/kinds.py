"""The kinds of sweep, in one table: what each varies, what it holds fixed, and its label.

A keep/stop decision compares the trials of one sweep, and how well their order can be
predicted depends on what the sweep varies (the curves cross when τ varies, and share one
normalised shape at fixed τ). ``hpo calibrate`` measures the ranking error per kind
(``predictors.ranking``), the rules name the kind a set of trials forms and find the sweeps of
a kind in a bank ((:func:`sweep_kind`, :func:`kind_groups`)), and the reports label
them: all of them read this table (:data:`KINDS`), and :data:`SWEEP_KINDS`,
:data:`KIND_GROUPS` and :func:`kind_axes` derive from it.

Example:
    >>> kind_axes("lambda")
    ('weight_decay', ('batch_size', 'eta'))
    >>> SWEEP_KINDS["eta_fixed_tau"]
    'η at fixed τ (λ re-derived)'
    >>> KIND_GROUPS["fixed_tau"]
    ('eta_fixed_tau', 'batch_fixed_tau')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from predictors import run_keys
from predictors.io import finite_or_none


@dataclass(frozen=True)
class SweepKind:
    """One kind of sweep: its ``name`` (the key in calibration files), the sweep value it
    ``varies``, the values it ``holds`` fixed and the ``label`` reports print; ``tau_fixed``
    (τ among what it holds) says which broader group of :data:`KIND_GROUPS` it belongs to."""

    name: str
    varies: str
    holds: tuple[str, ...]
    label: str

    @property
    def tau_fixed(self) -> bool:
        return "tau" in self.holds


#: The kinds the ranking error is measured for, in the order calibration tables list them.
KINDS: tuple[SweepKind, ...] = (
    SweepKind("eta_fixed_tau", "eta", ("tau", "batch_size"), "η at fixed τ (λ re-derived)"),
    SweepKind("batch_fixed_tau", "batch_size", ("tau", "eta"), "B at fixed τ (λ re-derived)"),
    SweepKind("batch_fixed_lambda", "batch_size", ("weight_decay", "eta"), "B at fixed λ (τ grows with B)"),
    SweepKind("lambda", "weight_decay", ("batch_size", "eta"), "λ at fixed B and η (τ varies)"),
    SweepKind("eta_fixed_lambda", "eta", ("weight_decay", "batch_size"), "η at fixed λ (τ falls as η grows)"),
)
_BY_NAME: dict[str, SweepKind] = {k.name: k for k in KINDS}

#: Each kind's label, by name.
SWEEP_KINDS: dict[str, str] = {k.name: k.label for k in KINDS}
#: Broader kinds, for sweeps whose controls do not pin one kind down (both η and B vary, or
#: the sweep values are not reported): the largest error of their member kinds applies.
KIND_GROUPS: dict[str, tuple[str, ...]] = {
    "fixed_tau": tuple(k.name for k in KINDS if k.tau_fixed),
    "fixed_lambda": tuple(k.name for k in KINDS if "weight_decay" in k.holds),
    "varying_tau": tuple(k.name for k in KINDS if not k.tau_fixed),
    "mixed": tuple(k.name for k in KINDS),
}


def kind_axes(name: str) -> tuple[str, tuple[str, ...]]:
    """The sweep value kind ``name`` varies and the values it holds fixed (KeyError naming the
    kind and the known ones when it is not a kind of :data:`KINDS`)."""
    try:
        kind = _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown sweep kind {name!r}; known: {list(_BY_NAME)}") from None
    return kind.varies, kind.holds


__all__ = ["KINDS", "KIND_GROUPS", "SWEEP_KINDS", "SweepKind", "kind_axes"]

# ---------------------------------------------------------------------- which kind trials form

#: Two sweep values within this relative distance are the same value (τ = B/(η·λ·D) is
#: recomputed per run, and D is rounded to whole steps).
SAME_VALUE_TOLERANCE = 0.01
#: Keys of a trial's sweep values (:func:`sweep_values`; the table: predictors.run_keys).
SWEEP_VALUE_KEYS = run_keys.names(sweep_value=True)




def sweep_values(source: Mapping[str, Any]) -> dict[str, Any]:
    """The values that tell which kind of sweep a trial belongs to, from a result, a trial
    config or a bank row: η (``eta`` or ``lr``), B, λ, τ, TPP, N and the schedule (missing
    ones are None)."""
    def num(*keys: str) -> Optional[float]:
        for key in keys:
            value = finite_or_none(source.get(key))
            if value is not None:
                return value
        return None

    schedule = source.get("schedule")
    warmup = source.get("warmup_fraction")
    # Floor, WSD decay and cooldown shape only where they are not the defaults, so the value
    # of a schedule without them reads as it always did.
    floor, shape = source.get("final_fraction"), source.get("decay_shape")
    extra = "".join((f"/decay {source.get('decay_fraction')}" if schedule == "wsd" else "",
                     f"/floor {floor}" if floor not in (None, "", 0, 0.0) else "",
                     f"/{shape}" if shape not in (None, "", "linear") else ""))
    return {
        "eta": num("eta", "lr"),
        "batch_size": num("batch_size"),
        "weight_decay": num("weight_decay"),
        "tau": num("tau"),
        "tokens_per_param": num("tokens_per_param"),
        "n_params": num("n_params"),
        "schedule": None if schedule is None else f"{schedule}@{warmup}{extra}",
    }


def _varies(values: Sequence[Optional[Any]]) -> Optional[bool]:
    """Whether the values differ (beyond SAME_VALUE_TOLERANCE); None if any is unknown."""
    if any(v is None for v in values):
        return None
    if not values:
        return False
    if isinstance(values[0], str):
        return len(set(values)) > 1
    lo, hi = min(values), max(values)
    return hi > lo * (1.0 + SAME_VALUE_TOLERANCE) if lo > 0 else hi != lo


def sweep_kind(trials: Sequence[Mapping[str, Any]]) -> str:
    """The kind of sweep these trials form (their :func:`sweep_values`): one of
    ``predictors.kinds.SWEEP_KINDS``, or a broader group of ``KIND_GROUPS`` when the values
    do not pin one down (several of η, B, λ vary, or they are not reported).

    Example:
        >>> sweep_kind([{"eta": 0.01, "batch_size": 2048, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}])
        'eta_fixed_tau'
        >>> sweep_kind([{"eta": 0.01, "batch_size": 1024, "weight_decay": 0.1, "tau": 0.15},
        ...             {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.3}])
        'batch_fixed_lambda'
    """
    if len(trials) < 2:
        return "mixed"
    col = {k: [t.get(k) for t in trials] for k in SWEEP_VALUE_KEYS}
    if any(_varies(col[k]) for k in ("tokens_per_param", "n_params", "schedule")):
        return "mixed"
    varies = {k: _varies(col[k]) for k in ("tau", "eta", "batch_size", "weight_decay")}
    if varies["tau"] is None:
        return "mixed"
    for kind in KINDS:  # the table's kinds: the one value varied, everything it holds fixed
        if varies[kind.varies] and all(varies[h] is False for h in kind.holds):
            return kind.name
    return "fixed_tau" if varies["tau"] is False else "fixed_lambda" if varies["weight_decay"] is False else "varying_tau"


#: Values that every member of one sweep shares, whatever its kind.
_SHARED = ("tokens_per_param", "n_params", "schedule", "seed", "data_seed")


def _clusters(values: Sequence[Any]) -> list[Any]:
    """A label per value; numbers within SAME_VALUE_TOLERANCE share a label."""
    labels: list[Any] = []
    refs: list[float] = []
    for v in values:
        if v is None or isinstance(v, str):
            labels.append(v)
            continue
        for i, r in enumerate(refs):
            if abs(float(v) / r - 1.0) <= SAME_VALUE_TOLERANCE if r else v == r:
                labels.append(i)
                break
        else:
            refs.append(float(v))
            labels.append(len(refs) - 1)
    return labels


def kind_groups(items: Mapping[str, Mapping[str, Any]], kind: str) -> list[list[str]]:
    """The sweeps of ``kind`` among ``items`` (id → :func:`sweep_values` plus ``seed``,
    ``data_seed``): groups of ≥ 2 ids that share everything the kind holds fixed (and TPP, N,
    schedule and seeds) and differ in the value it varies. Each group is sorted; groups are
    sorted by their first id."""
    varied, fixed = kind_axes(kind)
    ids = sorted(items)
    keys = list(dict.fromkeys([*fixed, *_SHARED, varied]))
    # Seeds are names, not magnitudes: seeds 201 and 202 lie within SAME_VALUE_TOLERANCE of each
    # other, and clustering them pooled three replicates into one "sweep" (the order error
    # measured across seeds was inflated by the seed noise).
    labels = {k: [items[i].get(k) for i in ids] if k in ("seed", "data_seed") else
              _clusters([items[i].get(k) for i in ids]) for k in keys}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for n, i in enumerate(ids):
        if any(items[i].get(k) is None for k in (varied, *fixed)):
            continue
        groups.setdefault(tuple(labels[k][n] for k in keys if k != varied), []).append(i)
    out = []
    for members in groups.values():
        varied_labels = {labels[varied][ids.index(i)] for i in members}
        if len(varied_labels) >= 2:
            out.append(sorted(members))
    return sorted(out)
