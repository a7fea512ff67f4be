"""A played batch packed as tensors, one row per episode (rlvr/rollout/episodes.py says what a row holds)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.types import Played, Rollouts

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.rollout.playing import Playing

torch = lazy_import("torch")


def padded(lists: list[list], fill: Any, dtype: Any, width: int) -> Tensor:
    """[rows, width] with each list at the left of its row, `fill` after it (one tensor, not one per row)."""
    out = torch.tensor([values + [fill] * (width - len(values)) for values in lists], dtype=dtype)
    return out.view(len(lists), width)


def pack(plays: list[Playing], prompts: int, G: int, temperature: float, pad_id: int, with_entropy: bool,
         env_seconds: float) -> Played:
    """The `prompts` × `G` episodes as played, rows p·G + g."""
    T = max([1, *(len(p.tokens) for p in plays)])
    K = max([1, *(len(p.rewards) for p in plays)])
    return Played(
        rollouts=_rollouts(plays, prompts, G, temperature, pad_id, with_entropy, T),
        rewards_P_G=torch.tensor([sum(p.rewards) for p in plays], dtype=torch.float32).view(prompts, G),
        turn_rewards_PG_K=padded([p.rewards for p in plays], math.nan, torch.float32, K),
        turns_PG=torch.tensor([len(p.rewards) for p in plays]),
        truncated_PG=torch.tensor([p.truncated and not p.failed for p in plays]),
        failed_PG=torch.tensor([p.failed for p in plays]),
        transcripts=[p.transcript for p in plays],
        infos=[p.infos for p in plays],
        env_seconds=env_seconds,
        rewritten_turns=[p.rewritten for p in plays] if any(p.view is not None for p in plays) else None,
    )


def _rollouts(plays: list[Playing], prompts: int, G: int, temperature: float, pad_id: int, with_entropy: bool,
              T: int) -> Rollouts:
    return Rollouts(
        prompt_ids_P=[plays[p * G].prompt for p in range(prompts)], group_size=G,
        tokens_PG_T=padded([p.tokens for p in plays], pad_id, torch.long, T),
        logprobs_PG_T=padded([p.logprobs for p in plays], 0.0, torch.float32, T),
        mask_PG_T=padded([[True] * len(p.tokens) for p in plays], False, torch.bool, T),
        finished_PG=torch.tensor([p.done and not p.truncated for p in plays]), temperature=temperature,
        entropy_PG_T=padded([p.entropy for p in plays], 0.0, torch.float32, T) if with_entropy else None,
        actions_PG_T=padded([p.actions for p in plays], False, torch.bool, T),
        turn_PG_T=padded([p.turns for p in plays], -1, torch.long, T),
        observation_body_PG_T=padded([p.body for p in plays], False, torch.bool, T),
        segments_PG=[[(a, ids) for a, ids in p.segments if a < len(p.tokens)] for p in plays]
        if any(p.segments for p in plays) else None,
    )
