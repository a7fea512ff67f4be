"""Completions that run long (`trainer.overlong`): DAPO's soft overlong punishment and overlong filtering
(arXiv 2503.14476 §3.4; verl's `reward_model.overlong_buffer`, SkyRL's `apply_overlong_filtering`).

Soft punishment, on each training completion's reward (single turn), with L = trainer.sampling.max_tokens, its
length |y| in tokens (the EOS that ended it included) and the buffer B = buffer_frac · L (DAPO: 4096 of 20480, 0.2):

    R_length(y) = 0                                  |y| ≤ L − B
                = −penalty · (|y| − (L − B)) / B     L − B < |y| ≤ L       (−penalty at |y| = L)

added to the verifier's reward before anything reads it (credit, dynamic sampling's ties, the row's reward fields).
A completion cannot pass L here (the engine stops it there), so DAPO's third case, −1 beyond L, is the linear one's
end. verl's form; DAPO's paper has penalty 1. Evaluation rewards are the verifier's alone.

Filtering: a completion that hit L without its EOS (truncated) keeps its reward in its group's baseline, but its
tokens leave the loss: their advantages are set to 0 after the whole credit chain (rlvr/credit.py), as SkyRL masks
their loss. A step whose every non-zero advantage was on truncated completions trains nothing (skipped).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.credit import Credit
    from rlvr.types import Rollouts, StepBatch


@dataclass(frozen=True)
class Overlong:
    buffer_frac: float = 0.0
    """Soft punishment: the last buffer_frac · max_tokens tokens before max_tokens cost up to `penalty`, linearly
    (DAPO: 0.2); 0 = off."""
    penalty: float = 1.0
    """Soft punishment at a completion of max_tokens tokens (DAPO: 1.0)."""
    filter: bool = False
    """Truncated completions (no EOS by max_tokens) leave the loss."""

    def __post_init__(self) -> None:
        if not 0 <= self.buffer_frac < 1:
            raise ValueError(f"trainer.overlong.buffer_frac={self.buffer_frac} must be in [0, 1): the punishment "
                             "starts at (1 − buffer_frac) · trainer.sampling.max_tokens tokens")
        if self.penalty < 0:
            raise ValueError(f"trainer.overlong.penalty={self.penalty} must be >= 0")

    def punishment_PG(self, rollouts: Rollouts, max_tokens: int) -> Tensor:
        """float [P·G]: R_length of each row (buffer_frac > 0: its callers return early when off)."""
        buffer = self.buffer_frac * max_tokens
        over_PG = (rollouts.lengths_PG - (max_tokens - buffer)).clamp(min=0).double()
        return (-self.penalty * over_PG / buffer).float()

    def punish(self, batch: StepBatch, max_tokens: int) -> StepBatch:
        """The batch with R_length added to its rewards (as given when off)."""
        if not self.buffer_frac:
            return batch
        r_length = self.punishment_PG(batch.rollouts, max_tokens).view_as(batch.rewards_P_G)
        return replace(batch, rewards_P_G=batch.rewards_P_G + r_length)

    def fields(self, rollouts: Rollouts, max_tokens: int) -> dict[str, float]:
        """The `overlong/punished_frac` and `overlong/punishment_mean` of a step's rows ({} when off)."""
        if not self.buffer_frac:
            return {}
        r_length = self.punishment_PG(rollouts, max_tokens)
        return {"overlong/punished_frac": float((r_length < 0).double().mean()),
                "overlong/punishment_mean": float(r_length.mean())}

    def mask(self, credit: Credit, rollouts: Rollouts) -> tuple[Credit, dict[str, float]]:
        """`credit` with the truncated completions' advantages 0, and `overlong/filtered_frac` ({} when off)."""
        if not self.filter:
            return credit, {}
        truncated = ~rollouts.finished_PG
        fields = {"overlong/filtered_frac": float(truncated.double().mean())}
        return replace(credit, adv_PG_T=credit.adv_PG_T.masked_fill(truncated[:, None], 0.0)), fields
