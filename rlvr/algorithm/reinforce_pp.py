"""REINFORCE++ (docs/algorithms.md#reinforce_pp): GRPO's group baseline A_i = r_i − mean(r), then, when `batch_norm` is
on, a batch-level z-score of the token advantages after the token transform:

    values = every token advantage of the step that is ≠ 0          (token-weighted; 0 = no signal)
    mean, std = mean(values), population std(values)
    a ← (a − mean) / (std + 1e-8)   for a ≠ 0, if std ≥ 1e-8
    a ← a − mean                    for a ≠ 0, if std < 1e-8
    zeros stay exactly 0 (prompt padding, tied groups, tokens a transform zeroed)

Edge cases (docs/predecessor.md, tests/algorithm/test_reinforce_pp.py): no non-zero value → unchanged, metrics
all 0.0; a single value, or values all equal, have std < 1e-8 and are only centred, so each becomes 0 (a step
whose signal is one value, or one repeated value, then trains nothing) up to the rounding of the mean, as in the
predecessor's float arithmetic ([0.1, 0.1, 0.1] in float64: mean 0.1 + 1.4e-17, so −1.4e-17 each); a spread
under 1e-8 is centred, not divided; a value equal to the batch mean becomes 0 and leaves the loss like any zero.

Metrics: batch_adv_count, batch_adv_mean, batch_adv_std (before normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient
from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

STD_EPS = 1e-8


@dataclass(frozen=True)
class ReinforcePP(PolicyGradient):
    batch_norm: bool

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        return rewards_P_G - rewards_P_G.mean(-1, keepdim=True)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        if not self.batch_norm:
            return adv_PG_T, {}
        nonzero = (adv_PG_T != 0) & mask_PG_T
        n = int(nonzero.sum())
        if n == 0:
            return adv_PG_T, {"batch_adv_count": 0.0, "batch_adv_mean": 0.0, "batch_adv_std": 0.0}
        values = adv_PG_T[nonzero].double()
        mean = values.mean()
        std = values.sub(mean).pow(2).mean().sqrt()
        scaled = (adv_PG_T.double() - mean) / (std + STD_EPS) if std >= STD_EPS else adv_PG_T.double() - mean
        out = torch.where(nonzero, scaled, torch.zeros_like(scaled)).to(adv_PG_T.dtype)
        return out, {"batch_adv_count": float(n), "batch_adv_mean": float(mean), "batch_adv_std": float(std)}
