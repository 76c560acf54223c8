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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from predictors import equations
from predictors.controls import Controls
from predictors.normalize import check_t_hat

# b ∈ B_BOX, q ∈ Q_BOX: inside them every term of Eq. 4 is finite for t̂, η(t̂) ∈ [0, 1]
# ((η+ε2)^q ≤ 1.1^30 ≈ 17); b = 10³ already means the schedule term dominates completely.
B_BOX = (1e-5, 1e3)
Q_BOX = (1e-3, 30.0)


@dataclass(frozen=True)
class SurrogateParams:
    """The four fitted parameters of Eq. 5 and the constants of Eq. 4.

    ``b_const`` and ``q_const`` must be > 0 (b, q > 0 as in the paper's fits); ``m``, ``eps1``,
    ``eps2`` must be > 0. Defaults for the constants are the paper's (m = 0.05, ε1 = 1e-3,
    ε2 = 0.1). ``irreducible_loss`` is the offset L̂ of Eq. 1 in loss units (≥ 0; 0, the
    paper's choice, means ℓ = L/L(1)); with L̂ > 0, ℓ̂ describes (L − L̂)/(L(1) − L̂).
    """

    b_const: float
    b_exp: float
    q_const: float
    q_exp: float
    m: float = equations.PAPER_M
    eps1: float = equations.PAPER_EPS1
    eps2: float = equations.PAPER_EPS2
    irreducible_loss: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")
        for name in ("b_const", "q_const", "m", "eps1", "eps2"):
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
        params.m,
        params.eps1,
        params.eps2,
    )
