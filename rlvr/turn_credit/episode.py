"""`turn_credit=episode` (default): every action token of an episode gets the episode's advantage.

    A_{r,t} = A_r · a_{r,t}

A_r is the algorithm's episode advantage (tied groups already zeroed) and a the action mask, so prompt,
observation and padding tokens stay exactly 0. On a one-turn row this is, bit for bit, what `transform=none`
gives a single-turn completion (`adv[:, None] * mask`), so a one-turn environment trains as the single-turn
path does. Turn indices and per-turn rewards are not read.

The predecessor did the same when the environment supplied no per-turn advantages: the episode's token
advantages, sliced per turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.protocols import Needs
from rlvr.turn_credit.signals import check_turns, episode_tokens
from rlvr.types import TurnSignals

if TYPE_CHECKING:
    from torch import Tensor


class EpisodeCredit:
    branching = None
    """Nothing for the rollout to probe."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __call__(self, adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> tuple[Tensor, dict[str, float]]:
        check_turns(adv_P_G, rewards_P_G, turns)
        return episode_tokens(adv_P_G, turns), {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
