"""GRPO episode advantages (docs/algorithms.md#grpo): A_i = r_i − mean(r) within each group of G.

No division by the group's standard deviation and no epsilon (Dr. GRPO-style; arXiv 2503.20783
argues the std term biases towards easy and hard prompts). All-equal rewards give all zeros; the
trainer also drops such groups from the loss. The loss is the shared importance-sampled policy gradient
(rlvr/algorithm/loss.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.loss import PolicyLoss
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class GRPO:
    loss: PolicyLoss

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return PolicyLoss.needs(settings["loss"])

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        return rewards_P_G - rewards_P_G.mean(-1, keepdim=True)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
