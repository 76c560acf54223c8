"""The paper's equations, in one place, named as in the paper.

Bergsma et al. (2025), "Scaling with Collapse: Efficient and Predictable Training of LLM
Families" (arXiv 2509.25087, ICLR 2026). Section and equation numbers are the paper's (ICLR
version); ``docs/paper.md`` summarises the method, the equations and what we chose where the
paper is silent. Everything else in the project calls these functions rather than
re-deriving them.

Symbols: B tokens per optimizer step, η peak learning rate, λ AdamW weight decay,
D total training tokens, N parameters (we use non-embedding parameters, see
``docs/parameterization.md``), t̂ training fraction, ℓ normalised loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Paper §5 (fixed constants of Eq. 4): the exponent of the power-law term and the two
# offsets that keep the surrogate finite at t̂ → 0 and at η(t̂) → 0.
PAPER_M = 0.05
PAPER_EPS1 = 1e-3
PAPER_EPS2 = 0.1

# Power Lines (Bergsma et al. 2025a, arXiv 2505.13738) optimal-τ law, τ = 1.084·TPP^−0.527.
# THIRD-PARTY: the coefficient is quoted from a code comment in a public repository and the
# exponent from two independent summaries; it is not verified against the primary source.
POWER_LINES_COEF = 1.084
POWER_LINES_EXP = -0.527


def adamw_timescale(batch_tokens: float, lr: float, weight_decay: float, total_tokens: float) -> float:
    """Normalised AdamW timescale τ = B/(η·λ·D). Paper §2, Eq. 2."""
    return batch_tokens / (lr * weight_decay * total_tokens)


def weight_decay_for_timescale(batch_tokens: float, lr: float, tau: float, total_tokens: float) -> float:
    """λ that gives timescale τ: λ = B/(η·τ·D). Eq. 2 solved for λ (paper §5: a sweep holds τ
    fixed by deriving λ)."""
    return batch_tokens / (lr * tau * total_tokens)


def ema_rate(lr_multiplier: Any, tau: Any, total_steps: int) -> np.ndarray:
    """The per-step EMA rate of AdamW, α_t = η_t·λ = η(t̂)/(τ·T), with η(t̂) the peak-normalised
    schedule: Eq. 2 read per step (paper §2; App. B.3, where τ_t = 1/(η_t·λ·T) grows as the LR
    decays)."""
    return np.asarray(lr_multiplier, dtype=np.float64) / (tau * total_steps)


def power_lines_tau(tokens_per_param: float) -> float:
    """Power Lines optimal timescale τ_opt = 1.084·TPP^−0.527 (THIRD-PARTY fit, paper §2/§4)."""
    return POWER_LINES_COEF * tokens_per_param**POWER_LINES_EXP


def tokens_per_param(total_tokens: float, n_params: float) -> float:
    """TPP = D/N, tokens per parameter: one of the three controls of a normalised curve (paper
    §5, step 1; N counts non-embedding parameters here, see ``docs/parameterization.md``)."""
    return total_tokens / n_params


def training_fraction(step: Any, total_steps: int) -> np.ndarray:
    """t̂ = t/T (paper §3, Table 1)."""
    return np.asarray(step, dtype=np.float64) / float(total_steps)


def normalized_loss(loss: Any, final_loss: float) -> np.ndarray:
    """ℓ(t̂) = L(t̂)/L(1): Eq. 1 with the offset L̂ = 0, as the paper uses (§2, §3)."""
    return np.asarray(loss, dtype=np.float64) / final_loss


def reducible_loss(loss: Any, irreducible_loss: float) -> np.ndarray:
    """L(t̂) − L̂, the numerator of Eq. 1: the part of the loss that the collapse normalises
    (paper §2); with L̂ = 0 it is the loss itself."""
    return np.asarray(loss, dtype=np.float64) - irreducible_loss


def reducible_normalized_loss(loss: Any, final_loss: float, irreducible_loss: float) -> np.ndarray:
    """ℓ(t̂) = (L(t̂) − L̂)/(L(1) − L̂): Eq. 1 with the irreducible-loss offset L̂ of Qiu et al.
    (paper §2; the paper itself sets L̂ = 0 and lists why offsets did not help as open, App. A)."""
    return reducible_loss(loss, irreducible_loss) / (final_loss - irreducible_loss)


def loss_ratio_from_normalized(ell: Any, final_loss: Any, irreducible_loss: Any) -> np.ndarray:
    """L(t̂)/L(1) = r + (1 − r)·ℓ(t̂) with r = L̂/L(1): Eq. 1 solved for the loss and divided by
    the final loss, i.e. what a curve normalised with the offset L̂ looks like in the paper's
    L̂ = 0 units (ℓ itself when L̂ = 0). Arguments broadcast."""
    r = np.asarray(irreducible_loss, dtype=np.float64) / np.asarray(final_loss, dtype=np.float64)
    return r + (1.0 - r) * np.asarray(ell, dtype=np.float64)


def loss_from_normalized(ell: Any, final_loss: Any, irreducible_loss: float = 0.0) -> np.ndarray:
    """L(t̂) = L̂ + (L(1) − L̂)·ℓ(t̂): Eq. 1 solved for the loss (L̂ = 0 gives L(1)·ℓ)."""
    return irreducible_loss + (np.asarray(final_loss, dtype=np.float64) - irreducible_loss) * np.asarray(
        ell, dtype=np.float64
    )


def b_of_tau(b_const: float, b_exp: float, tau: Any) -> np.ndarray:
    """b = b_const·τ^b_exp. Paper §5, Eq. 5 (App. D.1, Eq. 24)."""
    return b_const * np.asarray(tau, dtype=np.float64) ** b_exp


def q_of_tpp(q_const: float, q_exp: float, tokens_per_param: Any) -> np.ndarray:
    """q = q_const·TPP^q_exp. Paper §5, Eq. 5 (App. D.1, Eq. 24)."""
    return q_const * np.asarray(tokens_per_param, dtype=np.float64) ** q_exp


def surrogate_raw(
    t_hat: Any,
    lr_multiplier: Any,
    b: Any,
    q: Any,
    m: float = PAPER_M,
    eps1: float = PAPER_EPS1,
    eps2: float = PAPER_EPS2,
) -> np.ndarray:
    """ℓ̂_raw(t̂) = ((1+ε1)/(t̂+ε1))^m + b·(η(t̂)+ε2)^q. Paper §5, Eq. 4.

    ``lr_multiplier`` is the peak-normalised schedule η(t̂) at the same points. All
    arguments broadcast, so ``b`` and ``q`` may carry a leading curve axis.
    """
    t = np.asarray(t_hat, dtype=np.float64)
    eta = np.asarray(lr_multiplier, dtype=np.float64)
    return ((1.0 + eps1) / (t + eps1)) ** m + b * (eta + eps2) ** q


def surrogate(
    t_hat: Any,
    lr_multiplier: Any,
    lr_multiplier_final: Any,
    b: Any,
    q: Any,
    m: float = PAPER_M,
    eps1: float = PAPER_EPS1,
    eps2: float = PAPER_EPS2,
) -> np.ndarray:
    """ℓ̂(t̂) = ℓ̂_raw(t̂)/ℓ̂_raw(1), so ℓ̂(1) = 1. Paper §5, Eq. 4.

    ``lr_multiplier_final`` is η(1) (0 for decay-to-zero schedules).
    """
    final = surrogate_raw(1.0, lr_multiplier_final, b, q, m, eps1, eps2)
    return surrogate_raw(t_hat, lr_multiplier, b, q, m, eps1, eps2) / final


def nqm_expected_loss(
    t_hat: Any, tau: float, curvature: float = 1.0, noise_var: float = 1.0, theta0_sq: float = 0.0
) -> np.ndarray:
    """E[L(t̂)] = (h·σ_x²/(4τ))·(1 − e^(−2t̂/τ)) + (h/2)·e^(−2t̂/τ)·E[θ(0)²].

    The noisy quadratic model under a constant LR (paper App. B.3, Eq. 15; main-text Eq. 3):
    a variance floor ∝ 1/τ plus a bias that decays with timescale τ. ``curvature`` is h,
    ``noise_var`` σ_x², ``theta0_sq`` E[θ(0)²] (0 gives Eq. 16).
    """
    decay = np.exp(-2.0 * np.asarray(t_hat, dtype=np.float64) / tau)
    return curvature * noise_var / (4.0 * tau) * (1.0 - decay) + 0.5 * curvature * decay * theta0_sq
