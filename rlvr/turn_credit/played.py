"""What turn credit reads of a batch of played episodes (rlvr/rollout/episodes.py): the credit step
(rlvr/credit.py) computes their `TurnSignals` here from the batch the rollout returns, so that the episode loop does
no credit work."""

from __future__ import annotations

from rlvr.turn_credit.env import env_advantages
from rlvr.types import Played, TurnSignals


def turn_signals(played: Played) -> TurnSignals:
    """Their action tokens and turns, each turn's reward, the environment's own advantages and the branch probes'
    values."""
    ro = played.rollouts
    assert ro.turn_PG_T is not None, "played episodes always mark their turns (rlvr/rollout/pack.py)"
    return TurnSignals(actions_PG_T=ro.action_mask_PG_T, turn_PG_T=ro.turn_PG_T, turns_PG=played.turns_PG,
                       group_size=ro.group_size, turn_rewards_PG_K=played.turn_rewards_PG_K,
                       env_adv_PG_K=env_advantages(played.infos, played.turn_rewards_PG_K.shape[1]),
                       branch_rewards_PG_K_B=played.branch_rewards_PG_K_B)
