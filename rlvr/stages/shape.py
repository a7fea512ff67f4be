"""shape: the rewards as the step trains them. DAPO's soft overlong punishment (trainer.overlong,
rlvr/reward/overlong.py), on every round a step samples; the reference KL folded into the rewards
(algorithm.kl.where=reward, rlvr/algorithm/kl.py), on the rows that train (after select: dynamic sampling reads
the verifier's rewards)."""

from __future__ import annotations

from typing import ClassVar

from rlvr.algorithm.kl import kl_in_reward
from rlvr.protocols import Algorithm
from rlvr.reward.overlong import Overlong
from rlvr.stages import Stateless, StepState
from rlvr.types import StepBatch


class OverlongShaping(Stateless):
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, overlong: Overlong, max_tokens: int) -> None:
        self.overlong, self.max_tokens = overlong, max_tokens

    def shape(self, batch: StepBatch) -> StepBatch:
        return self.overlong.punish(batch, self.max_tokens)

    def apply(self, s: StepState) -> None:
        s.batch = self.shape(s.scored)


class RewardKL(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("policy/kl_ref", "policy/kl_coef", "policy/kl_reward_penalty")

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm

    def apply(self, s: StepState) -> None:
        batch = s.scored
        s.rewards_P_G, fields = kl_in_reward(self.algorithm.loss, s.live.backend, batch.rollouts, batch.rewards_P_G)
        s.fields.update(fields)
