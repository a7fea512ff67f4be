"""RLOO episode advantages (docs/algorithms.md#rloo): REINFORCE with a leave-one-out baseline (Kool et al. 2019;
Ahmadian et al. 2024, arXiv 2402.14740), each completion's reward minus the mean of the other G − 1 of its group:

    A_i = r_i − (Σ_{j≠i} r_j)/(G − 1) = G/(G − 1) · (r_i − mean(r))

The baseline leaves out the sample it scores, so it is independent of that sample and the gradient unbiased (GRPO's
group mean includes r_i: the same direction, shrunk by (G − 1)/G). The second form is verl's
(`compute_rloo_outcome_advantage`) and TRL's RLOO trainer's. A group of one has no other sample to be its baseline:
0 (rlvr refuses trainer.group_size=1; verl returns the raw reward). No scaling, no batch pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient

if TYPE_CHECKING:
    from torch import Tensor


def leave_one_out(rewards_P_G: Tensor) -> Tensor:
    """r_i − mean of the group's other rewards; zeros for a group of one."""
    G = rewards_P_G.shape[-1]
    if G < 2:
        return rewards_P_G.new_zeros(rewards_P_G.shape)
    return (rewards_P_G - rewards_P_G.mean(-1, keepdim=True)) * (G / (G - 1))


@dataclass(frozen=True)
class RLOO(PolicyGradient):

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        return leave_one_out(rewards_P_G)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
