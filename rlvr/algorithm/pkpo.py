"""PKPO episode advantages (docs/algorithms.md#pkpo): Pass@K Policy Optimization (Walder & Karkhanis, NeurIPS 2025,
arXiv 2505.15201), the unbiased gradient of pass@k (of maxg@k = E[max of k samples' rewards], which is pass@k for
0/1 rewards) with the paper's lowest-variance baseline, s^(loo−1) (eq. 33 as public implementations number it):

    A_i = k · E_J [ max(r_i, max r_J) − max r_J ]      J: a uniformly random (k−1)-subset of the group's other G − 1
        = k · Σ_{m=1}^{G−1} C(m−1, k−2)/C(G−1, k−1) · max(0, r_i − o_(m))      o_(1) ≤ … ≤ o_(G−1): the others sorted

i.e. G·s_i^(loo−1): the paper's s sums over the group, rlvr's loss averages over it. Each k-subset holding sample i
credits i with how much it raises the subset's maximum over the other k − 1 (the pass@(k−1) baseline, independent of
sample i). For 0/1 rewards with c correct: k·C(G−c, k−1)/C(G−1, k−1) for a correct sample (k times the chance
that the other k − 1 of a subset are all wrong), 0 for a wrong one. Advantages are ≥ 0 and do not sum to 0.

k = 1 (pass@1) has no pass@0 baseline: RLOO's leave-one-out baseline instead (rlvr/algorithm/rloo.py), as MaxRL's
PKPO code gives at k = 1. 1 ≤ k ≤ G, checked at construction (`group_size` interpolates trainer.group_size).
O(P·G²) per step, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient
from rlvr.algorithm.rloo import leave_one_out
from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


@lru_cache(maxsize=16)
def max_weights(G: int, k: int) -> tuple[float, ...]:
    """P(the m-th smallest of G − 1 values is the maximum of a random (k−1)-subset of them), m = 1 … G − 1."""
    total = math.comb(G - 1, k - 1)
    return tuple(math.comb(m - 1, k - 2) / total for m in range(1, G))


@dataclass(frozen=True)
class PKPO(PolicyGradient):
    k: int
    """`algorithm.k` (the MaxRL paper's T): the k of the pass@k optimised."""
    group_size: int
    """trainer.group_size (G), interpolated: k ≤ G is checked before the run starts."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"algorithm.k={self.k} must be >= 1 (pass@k of k completions)")
        if self.k > self.group_size:
            raise ValueError(f"algorithm.k={self.k} must be <= trainer.group_size={self.group_size}: pass@k is "
                             "estimated from the completions of one group")

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        G, k = rewards_P_G.shape[-1], self.k
        if k > G:
            raise ValueError(f"algorithm.k={k} must be <= the group's {G} completions")
        if k == 1:
            return leave_one_out(rewards_P_G)
        r_sorted, order = rewards_P_G.double().sort(-1)
        m = torch.arange(G - 1)
        others = m.unsqueeze(0) + (m.unsqueeze(0) >= torch.arange(G).unsqueeze(1)).long()  # [G, G−1]: positions ≠ row
        gain = (r_sorted.unsqueeze(-1) - r_sorted[:, others]).clamp(min=0)  # [P, G, G−1], others ascending
        weights = torch.tensor(max_weights(G, k), dtype=torch.float64)
        adv_sorted = k * (gain * weights).sum(-1)
        return torch.empty_like(adv_sorted).scatter_(-1, order, adv_sorted).to(rewards_P_G.dtype)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
