"""The paper's normalised-TLC surrogate ℓ̂(t̂; τ, TPP, schedule), Eq. 4–5.

    ℓ̂_raw(t̂) = ((1+ε1)/(t̂+ε1))^m + b·(η(t̂)+ε2)^q,   ℓ̂ = ℓ̂_raw/ℓ̂_raw(1)        (Eq. 4)
    b = b_const·τ^b_exp,   q = q_const·TPP^q_exp                                  (Eq. 5)

Every number is computed by ``predictors.equations``; this module only wires the controls to it.
η(t̂) comes from ``controls.schedule`` (any schedule, any warmup fraction), η(1) from
``schedule(1.0)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from predictors import equations
from predictors.controls import Controls
from predictors.normalize import check_t_hat


@dataclass(frozen=True)
class SurrogateParams:
    """The four fitted parameters of Eq. 5 and the constants of Eq. 4.

    ``b_const`` and ``q_const`` must be > 0 (b, q > 0 as in the paper's fits); ``m``, ``eps1``,
    ``eps2`` must be > 0. Defaults for the constants are the paper's (m = 0.05, ε1 = 1e-3,
    ε2 = 0.1).
    """

    b_const: float
    b_exp: float
    q_const: float
    q_exp: float
    m: float = equations.PAPER_M
    eps1: float = equations.PAPER_EPS1
    eps2: float = equations.PAPER_EPS2

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")
        for name in ("b_const", "q_const", "m", "eps1", "eps2"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")

    def b(self, tau: Any) -> np.ndarray:
        """b(τ) = b_const·τ^b_exp (Eq. 5)."""
        return equations.b_of_tau(self.b_const, self.b_exp, tau)

    def q(self, tokens_per_param: Any) -> np.ndarray:
        """q(TPP) = q_const·TPP^q_exp (Eq. 5)."""
        return equations.q_of_tpp(self.q_const, self.q_exp, tokens_per_param)

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
