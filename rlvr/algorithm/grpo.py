"""GRPO episode advantages (docs/algorithms.md#grpo): A_i = r_i − mean(r) within each group of G, then, by
`scale`:

    none       A_i                                   (the default; Dr. GRPO, arXiv 2503.20783, and the predecessor)
    std        A_i / (std(r of the group) + eps)     (DeepSeekMath's GRPO, arXiv 2402.03300; TRL's scale_rewards=
                                                      "group", verl's and SkyRL's default)
    batch_std  A_i / (std(r of the step) + eps)      (batch-level normalisation: ScaleRL, arXiv 2510.13786; TRL's
                                                      scale_rewards="batch")

std is the sample standard deviation (Bessel's n − 1, as torch.std in TRL, verl and SkyRL), taken as 0 for a single
value; eps is `scale_eps` (1e-6, verl's and SkyRL's; TRL's is 1e-4). Dr. GRPO argues the std term biases training
toward very easy and very hard prompts; ScaleRL found batch-level scaling the more efficient. All-equal rewards give
all zeros whatever the scale (0 / (0 + eps)); the trainer also drops such groups from the loss. The step is every
process's rows together (rollouts are gathered before advantages), so `batch_std` does not depend on the number of
processes. The loss is the shared importance-sampled policy gradient (rlvr/algorithm/loss.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient

if TYPE_CHECKING:
    from torch import Tensor

SCALES = ("none", "std", "batch_std")


@dataclass(frozen=True)
class GRPO(PolicyGradient):
    scale: str = "none"
    scale_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"algorithm.scale={self.scale!r}: expected none, std or batch_std")
        if not self.scale_eps > 0:
            raise ValueError(f"algorithm.scale_eps={self.scale_eps} must be > 0")

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        centred = rewards_P_G - rewards_P_G.mean(-1, keepdim=True)
        if self.scale == "none":
            return centred
        values = rewards_P_G if self.scale == "std" else rewards_P_G.reshape(1, -1)
        std = values.std(-1, keepdim=True) if values.shape[-1] > 1 else values.new_zeros(values.shape[0], 1)
        return centred / (std + self.scale_eps)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        return {}

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}
