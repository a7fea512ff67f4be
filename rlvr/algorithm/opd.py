"""`algorithm=opd`: on-policy distillation (docs/algorithms.md#on-policy-distillation). The student samples as in RL;
a frozen teacher (distill=teacher | server, rlvr/distill/) scores the sampled tokens, and each action token's credit
is coef · (log π_teacher(y_t) − log π_student(y_t)) alone: the rewards give none (every episode advantage is 0),
though they are still scored and reported. The loss is the shared importance-sampled policy gradient
(rlvr/algorithm/loss.py), as Thinking Machines' on-policy distillation trains with its per-token reverse KL as the
advantage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.policy_gradient import PolicyGradient

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class OPD(PolicyGradient):
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Any:
        loss = PolicyLoss.needs(settings["loss"])
        return replace(loss, requires={**loss.requires, "teacher": "algorithm=opd trains on a teacher's credit alone"})

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        return rewards_P_G.new_zeros(rewards_P_G.shape)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
