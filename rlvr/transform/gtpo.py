"""`transform=gtpo`: entropy-weighted token credit (GTPO, arXiv 2508.04349; docs/algorithms.md#gtpo).

Each completion i with episode advantage A_i and token uncertainties u_{i,t} (rlvr.transform.uncertainty)
gets, on its n_i real tokens,

    v_t    = min(u_t, 50)
    μ_i    = (1/n_i) Σ_t v_t                                   (this completion's tokens only)
    w_t    = max(0, 1 + β·(v_t / (μ_i + 1e-8) − 1))
    A_{i,t} = A_i · w_t

with two guards that give every token the plain A_i (w_t = 1): β = 0, and μ_i < 1e-7 (a completion
that is certain everywhere). Normalisation is per sequence, so the token-mean of w is ≈ 1 (exactly
μ_i/(μ_i + 1e-8) when no weight is clamped at 0) and the token-mean of A_{i,t} ≈ A_i; w ≥ 0 keeps the
sign of A_i. Zero advantages stay zero (tied groups, MaxRL groups with mean reward ≤ 1e-6); an empty
completion (n_i = 0) has no tokens to weight; padding is exactly 0.

Knobs: `beta` (β ≥ 0, retrain default 0.1) and `uncertainty` (surprisal | predictive_variance |
shannon_entropy). Metrics: the uncertainty stats of rlvr.transform.uncertainty_stats, every token exec.

The weight is retrain's `apply_gtpo_weighting`, rebuilt exactly and vectorised over [P·G, T]. It follows
the paper's idea (a token's credit grows with its uncertainty relative to its sequence's) rather than
the paper's own reward-shaping formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.protocols import Needs
from rlvr.transform.signals import as_weights, check_step, per_token
from rlvr.transform.uncertainty import MAX_UNCERTAINTY, check_uncertainty, signal_needs, token_uncertainty
from rlvr.transform.uncertainty_stats import uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

GTPO_EPS = 1e-8
"""Added to μ_i in the weight's denominator."""
GTPO_MIN_MEAN = 1e-7
"""Below this mean uncertainty a completion gets uniform weights."""


def check_beta(beta: float) -> float:
    if not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta={beta} must be a finite number >= 0")
    return float(beta)


def gtpo_token_advantages(adv_PG: Tensor, u_PG_T: Tensor, mask_PG_T: Tensor, beta: float) -> Tensor:
    """[P·G] episode advantages (or [P·G, T] turn ones, A_t·w_t) → [P·G, T] GTPO token advantages, in the dtype
    of `u_PG_T`.

    `mask_PG_T` may be bool or already a 0/1 float tensor of u's dtype. `u_PG_T` must be finite at padding
    (rlvr.transform.uncertainty gives 0 there); padding of the result is then exactly 0."""
    mask = as_weights(mask_PG_T, u_PG_T.dtype)
    adv_PG_1 = per_token(adv_PG, u_PG_T.dtype)
    if beta == 0.0:
        return adv_PG_1 * mask
    v = u_PG_T.clamp(max=MAX_UNCERTAINTY).mul_(mask)
    mean_PG_1 = v.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    weight = v.div_(mean_PG_1 + GTPO_EPS).sub_(1.0).mul_(beta).add_(1.0).clamp_(min=0.0)
    uniform_PG = (mean_PG_1 < GTPO_MIN_MEAN).squeeze(-1)
    if bool(uniform_PG.any()):
        weight[uniform_PG] = 1.0
    return weight.mul_(adv_PG_1).mul_(mask)


class GTPO:
    """`GTPO(beta, uncertainty)`: see the module docstring."""


    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return signal_needs(settings["uncertainty"], planning=False)

    def __init__(self, *, beta: float, uncertainty: str) -> None:
        self.beta = check_beta(beta)
        self.uncertainty = check_uncertainty(uncertainty)

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        check_step(adv_PG, signals)
        mask = as_weights(signals.mask_PG_T, signals.logprobs_PG_T.dtype)
        u = token_uncertainty(self.uncertainty, signals, mask)
        adv_PG_T = gtpo_token_advantages(adv_PG, u, mask, self.beta)
        return adv_PG_T, uncertainty_stats(u, u, mask, None, adv_PG, signals.group_size)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
