"""The kinds of sweep, in one table: what each varies, what it holds fixed, and its label.

A keep/stop decision compares the trials of one sweep, and how well their order can be
predicted depends on what the sweep varies (the curves cross when τ varies, and share one
normalised shape at fixed τ). ``hpo calibrate`` measures the ranking error per kind
(``predictors.ranking``), the rules name the kind a set of trials forms and find the sweeps of
a kind in a bank (``hpo.decisions.rules.sweep_kind``, ``hpo.decisions.rules.kind_groups``), and the reports label
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
