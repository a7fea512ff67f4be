"""`turn_credit=env`: advantages the environment supplies per turn ("MT-GRPO"), the predecessor's rule.

    e_{r,k}    = Step.info["advantage"] of turn k of episode r (NaN when absent; `env_advantages` builds it)
    covered_r  = n_r ≥ 1 and e_{r,k} is given for every turn k < n_r
    A_{r,t}    = e_{r, turn(t)}    on action tokens of a covered episode
    A_{r,t}    = A_r               on action tokens of any other episode (its episode advantage, = turn_credit=episode)
    A_{r,t}    = 0                 on every token of a group whose episode rewards tie, and off action tokens

All or nothing per episode, exactly as the predecessor: "if the environment supplies per-turn advantages
covering all turns, each turn's tokens get that scalar; otherwise the episode token advantages are sliced per
turn" (an episode with one turn's advantage missing falls back entirely, so the two modes never mix inside
one episode). The environment's values are used as given: not centred, not scaled.

A group whose rewards tie (within 1e-6, rlvr/algorithm/ties.py) gets 0 on every token, covered or not: the
predecessor skipped such groups before reading the environment's advantages. It kept them when its separate
`batch_advantage_norm` switch was on; rlvr always zeroes them (its single-turn rule), a deliberate departure
(docs/predecessor.md#multi-turn-credit).

Metric: `turn_credit/env_covered_fraction` (covered episodes / episodes with at least one turn): 0 says the
environment supplies no advantages and every episode trains on its episode advantage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.ties import uniform_groups
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.turn_credit.signals import check_turns, episode_tokens, per_turn, played_PG_K, spread
from rlvr.types import TurnSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

INFO_KEY = "advantage"


def env_advantages(infos_PG: Sequence[Sequence[Mapping[str, Any]]], K: int) -> Tensor:
    """float32 [P·G, K] from each row's per-turn `Step.info`: `info["advantage"]`, NaN where the key is absent
    or None. Anything else that is not a finite number fails, naming the row and turn."""
    out = torch.full((len(infos_PG), K), math.nan)
    for r, infos in enumerate(infos_PG):
        if len(infos) > K:
            raise ValueError(f"row {r} has {len(infos)} turns' infos, more than K={K}")
        for k, info in enumerate(infos):
            value = info.get(INFO_KEY)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"row {r}, turn {k}: Step.info[{INFO_KEY!r}] = {value!r} is not a finite number")
            out[r, k] = float(value)
    return out


class EnvAdvantages:
    branching = None
    """Nothing for the rollout to probe."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={"episodes": "turn_credit=env gives each turn the reward its environment step gave"})

    def __call__(self, adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> tuple[Tensor, dict[str, float]]:
        check_turns(adv_P_G, rewards_P_G, turns)
        env_adv = per_turn("env_adv_PG_K", turns.env_adv_PG_K, turns, "env")
        played = played_PG_K(turns, env_adv.shape[1])
        covered_PG = (torch.isfinite(env_adv) | ~played).all(1) & (turns.turns_PG > 0)
        from_env = spread(torch.where(played, env_adv, 0.0), turns).to(adv_P_G.dtype)
        adv_PG_T = torch.where(covered_PG[:, None], from_env, episode_tokens(adv_P_G, turns))
        tied_PG = uniform_groups(rewards_P_G).repeat_interleave(turns.group_size)
        adv_PG_T = adv_PG_T.masked_fill(tied_PG[:, None], 0.0)
        with_turns = int((turns.turns_PG > 0).sum())
        return adv_PG_T, {"turn_credit/env_covered_fraction": int(covered_PG.sum()) / with_turns if with_turns else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
