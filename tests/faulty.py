"""Components that misbehave on purpose, for the resilience tests (importable as `faulty.<Name>` in a
config's `_target_`, since tests/ is on the test path)."""

from collections.abc import Sequence

import torch
from torch import Tensor

from rlvr.algorithm.loss import PolicyLoss
from rlvr.protocols import Needs
from rlvr.types import Scores


class NaNOnCalls:
    """GRPO advantages, except that the calls listed in `calls` (0-based) return NaN."""

    @classmethod
    def needs(cls, settings) -> Needs:
        return PolicyLoss.needs(settings["loss"])

    def __init__(self, loss: PolicyLoss, calls: list[int]) -> None:
        self.loss, self.calls, self.seen = loss, set(calls), 0

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        self.seen += 1
        adv = rewards_P_G - rewards_P_G.mean(-1, keepdim=True)
        return torch.full_like(adv, float("nan")) if self.seen - 1 in self.calls else adv

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor):
        return adv_PG_T, {}


class FlakyReward:
    """Exact match, but raises on any completion that starts with `poison`."""

    @classmethod
    def needs(cls, settings) -> Needs:
        return Needs()

    def __init__(self, poison: str) -> None:
        self.poison = poison

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        if any(c.startswith(self.poison) for c in completions):
            raise ValueError(f"cannot grade a completion starting with {self.poison!r}")
        return Scores([float(c.strip() == r.strip()) for c, r in zip(completions, references)])


class Constant:
    """Every completion scores `value` (a reward class, not a function: nan, inf, 1e9 as it returns them)."""

    @classmethod
    def needs(cls, settings) -> Needs:
        return Needs()

    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        return Scores([self.value] * len(completions))
