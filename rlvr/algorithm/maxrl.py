"""MaxRL episode advantages (docs/algorithms.md#maxrl):

    μ = mean(r) over the group
    A_i = (r_i − μ) / (μ + eps)     if μ > eps
    A_i = 0                         if μ ≤ eps   (all wrong, or a negative mean even when rewards differ)

eps = 1e-6 (YAML). Dividing by the success rate weights rare successes heavily: 1 correct of 16
(μ = 0.0625) gives the correct sample ≈ +15.0 and each wrong one ≈ −1.0, which is why an advantage
cap (`loss.adv_clip_max`, rlvr/algorithm/loss.py) exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient
from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


@dataclass(frozen=True)
class MaxRL(PolicyGradient):
    eps: float

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        mean_P_1 = rewards_P_G.mean(-1, keepdim=True)
        adv = (rewards_P_G - mean_P_1) / (mean_P_1 + self.eps)
        return torch.where(mean_P_1 > self.eps, adv, torch.zeros_like(adv))

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
