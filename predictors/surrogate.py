"""The paper's normalised-TLC surrogate ℓ̂(t̂; τ, TPP, schedule), Eq. 4–5.

    ℓ̂_raw(t̂) = ((1+ε1)/(t̂+ε1))^m + b·(η(t̂)+ε2)^q,   ℓ̂ = ℓ̂_raw/ℓ̂_raw(1)        (Eq. 4)
    b = b_const·τ^b_exp,   q = q_const·TPP^q_exp                                  (Eq. 5)

Every number is computed by ``predictors.equations``; this module only wires the controls to it.
η(t̂) comes from ``controls.schedule`` (any schedule, any warmup fraction), η(1) from
``schedule(1.0)``.

Physical box (ours, not the paper's): b and q are clipped into ``B_BOX`` and ``Q_BOX`` when
evaluated, so a target run far outside the reference range (a TPP of 10⁶, say) still gets a
finite curve; the fit keeps every reference curve's b and q inside the same box, so for the
curves a predictor was fitted on the clip never acts.

Model size (ours, issue 15; the paper's Eq. 4–5 have no N): with ``m_size_exp`` ≠ 0 the
exponent of the power-law term depends on the run's non-embedding size N,

    m(N) = m·(N/N_ref)^m_size_exp,                                                (size term)

``N_ref`` = ``size_ref`` (the geometric centre of the calibrated sizes, so ``m`` is the
exponent at the middle of the bank), clipped into ``M_BOX``. Larger models fall further
relative to their final loss early in training (ℓ(0.1) ≈ 1.35 at 0.1M against ≈ 1.55 at 1.2M
on our TPP 5–20 banks; ℓ(t̂) ≈ t̂^−m early), which m(N) follows directly; of the one-parameter
size terms tried on those banks (on m, on b, on q) it cut the fit MAE most (3.2% → 2.3%).
A run without a reported N gets m(N_ref).

No weight decay (λ = 0) is τ = ∞. b(∞) is b_const when b_exp = 0 (a bank that includes
τ = ∞ curves fits with b_exp fixed at 0, ``predictors.fit``); otherwise τ^b_exp's limit, clipped
into the box, which the predictor's error then states as beyond every calibrated τ.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from predictors import equations
from predictors.controls import Controls
from predictors.normalize import check_t_hat

# b ∈ B_BOX, q ∈ Q_BOX: inside them every term of Eq. 4 is finite for t̂, η(t̂) ∈ [0, 1]
# ((η+ε2)^q ≤ 1.1^30 ≈ 17); b = 10³ already means the schedule term dominates completely.
B_BOX = (1e-5, 1e3)
Q_BOX = (1e-3, 30.0)
# m(N) ∈ M_BOX: the power-law term stays finite at t̂ = 0 ((1+ε1)/ε1)^m ≤ 1001^2) however far
# N lies from the calibrated sizes.
M_BOX = (1e-3, 2.0)


@dataclass(frozen=True)
class SurrogateParams:
    """The four fitted parameters of Eq. 5 and the constants of Eq. 4.

    ``b_const`` and ``q_const`` must be > 0 (b, q > 0 as in the paper's fits); ``m``, ``eps1``,
    ``eps2`` must be > 0. Defaults for the constants are the paper's (m = 0.05, ε1 = 1e-3,
    ε2 = 0.1). ``irreducible_loss`` is the offset L̂ of Eq. 1 in loss units (≥ 0; 0, the
    paper's choice, means ℓ = L/L(1)); with L̂ > 0, ℓ̂ describes (L − L̂)/(L(1) − L̂).
    ``m_size_exp`` and ``size_ref`` (> 0) are the size term m(N) = m·(N/size_ref)^m_size_exp
    (module docstring); ``m_size_exp = 0`` (the default) is the paper's surrogate.
    """

    b_const: float
    b_exp: float
    q_const: float
    q_exp: float
    m: float = equations.PAPER_M
    eps1: float = equations.PAPER_EPS1
    eps2: float = equations.PAPER_EPS2
    irreducible_loss: float = 0.0
    m_size_exp: float = 0.0
    size_ref: float = 1.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")
        for name in ("b_const", "q_const", "m", "eps1", "eps2", "size_ref"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if self.irreducible_loss < 0:
            raise ValueError(f"irreducible_loss: must be ≥ 0, got {self.irreducible_loss!r}")

    def b(self, tau: Any) -> np.ndarray:
        """b(τ) = b_const·τ^b_exp (Eq. 5), clipped into ``B_BOX``."""
        with np.errstate(over="ignore", under="ignore"):
            return np.clip(equations.b_of_tau(self.b_const, self.b_exp, tau), *B_BOX)

    def q(self, tokens_per_param: Any) -> np.ndarray:
        """q(TPP) = q_const·TPP^q_exp (Eq. 5), clipped into ``Q_BOX``."""
        with np.errstate(over="ignore", under="ignore"):
            return np.clip(equations.q_of_tpp(self.q_const, self.q_exp, tokens_per_param), *Q_BOX)

    @property
    def has_size_term(self) -> bool:
        """Whether m depends on the model size N (``m_size_exp`` ≠ 0)."""
        return self.m_size_exp != 0.0

    def m_at(self, n_params: Optional[float]) -> float:
        """m(N) = m·(N/size_ref)^m_size_exp, clipped into ``M_BOX``; m itself without a size
        term, and m(size_ref) = m when N is unknown (None)."""
        if not self.has_size_term or n_params is None:
            return self.m
        with np.errstate(over="ignore", under="ignore"):
            value = self.m * (float(n_params) / self.size_ref) ** self.m_size_exp
        return float(np.clip(value, *M_BOX))

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def normalized_surrogate(t_hat: Any, controls: Controls, params: SurrogateParams) -> np.ndarray:
    """ℓ̂ at ``t_hat`` (any order, each in [0, 1]) for one run's controls (Eq. 4–5)."""
    t = check_t_hat(np.atleast_1d(np.asarray(t_hat, dtype=np.float64)), increasing=False)
    return _surrogate(t, controls, params)


def _surrogate(t: np.ndarray, controls: Controls, params: SurrogateParams) -> np.ndarray:
    """Unchecked :func:`normalized_surrogate` (``t`` already validated)."""
    schedule = controls.schedule
    return equations.surrogate(
        t,
        schedule(t),
        schedule(1.0),
        float(params.b(controls.tau)),
        float(params.q(controls.tokens_per_param)),
        params.m_at(controls.n_params),
        params.eps1,
        params.eps2,
    )
