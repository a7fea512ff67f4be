"""`turn_credit=reward_to_go`: each turn is credited with the reward that followed it, against the other
episodes of its group at the same turn index.

    n_r        = turns episode r took; r_{r,j} its turn rewards (Step.reward), j < n_r
    G_{r,k}    = Σ_{j=k}^{n_r−1} γ^{j−k} · r_{r,j}                   return-to-go of turn k < n_r
    E_{p,k}    = the episodes of group p with n > k                  (those that reached turn k)
    b_{p,k}    = mean of G_{·,k} over E_{p,k}                         baseline per prompt group and turn index
    A_{r,k}    = G_{r,k} − b_{p,k}                                   std_normalize: false (default)
    A_{r,k}    = (G_{r,k} − b_{p,k}) / (σ_{p,k} + 1e-8)              std_normalize: true, σ the population
                                                                     std of G_{·,k} over E_{p,k}
    A_{r,t}    = A_{r, turn(t)} on action tokens, 0 elsewhere

Knobs: `discount` γ ∈ [0, 1] (1: the plain sum; 0: each turn's own reward), `std_normalize`. The default
divides by nothing, as rlvr's GRPO (arXiv 2503.20783 argues the std term biases towards easy and hard
prompts); `std_normalize: true` is the GRPO paper's scaling. DeepSeekMath's process supervision
(arXiv 2402.03300 §4.1.3) normalises each step's reward across the group first and then sums the normalised
rewards that follow; here the return is summed first and the baseline is per turn index, so episodes of
different lengths compare turn k with turn k.

Edge cases. A turn reached by one episode of its group only is its own baseline: advantage 0 (counted in
`turn_credit/lone_turn_fraction`). All of a group's returns at turn k equal → 0 at turn k. On one-turn rows
G_0 = r_0 and the baseline is the group's mean: exactly GRPO's single-turn advantage (with γ anything).

Not the algorithm's episode advantage: `adv_P_G` is not read, so `algorithm=` changes only the loss and the
batch pass here, and a group whose episode rewards tie is not zeroed (its turns may still differ in when the
reward came). Not in the predecessor, which had no per-turn-reward credit.

Metrics: `turn_credit/return_to_go_mean` (mean G_{r,k} over played turns), `turn_credit/lone_turn_fraction`
(group-turn cells reached by exactly one episode / cells reached by at least one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.turn_credit.signals import check_turns, per_turn, played_PG_K, spread
from rlvr.types import TurnSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

STD_EPS = 1e-8


def returns_to_go(rewards_PG_K: Tensor, played_PG_K: Tensor, discount: float) -> Tensor:
    """G_{r,k} = Σ_{j≥k, played} γ^{j−k} r_{r,j}, float64; 0 at turns not played."""
    r = torch.where(played_PG_K, rewards_PG_K.double(), 0.0)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for k in range(r.shape[1] - 1, -1, -1):  # K is the number of turns (a few), not tokens
        running = r[:, k] + discount * running
        out[:, k] = running
    return torch.where(played_PG_K, out, 0.0)


class RewardToGo:
    branching = None
    """Nothing for the rollout to probe."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={"episodes": "turn_credit=reward_to_go gives each turn the rewards of the turns from it "
                                           "on"})

    def __init__(self, *, discount: float, std_normalize: bool) -> None:
        if not (isinstance(discount, int | float) and 0.0 <= discount <= 1.0):
            raise ValueError(f"discount={discount!r} must be in [0, 1]")
        if not isinstance(std_normalize, bool):
            raise ValueError(f"std_normalize={std_normalize!r} must be true or false")
        self.discount = float(discount)
        self.std_normalize = std_normalize

    def __call__(self, adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> tuple[Tensor, dict[str, float]]:
        check_turns(adv_P_G, rewards_P_G, turns)
        rewards = per_turn("turn_rewards_PG_K", turns.turn_rewards_PG_K, turns, "reward_to_go")
        played = played_PG_K(turns, rewards.shape[1])
        if not bool(torch.isfinite(rewards[played]).all()):
            r, k = (int(i) for i in (played & ~torch.isfinite(rewards)).nonzero()[0])
            raise ValueError(f"turn_rewards_PG_K[{r}, {k}] = {float(rewards[r, k])} is not finite, but row {r} "
                             f"played turn {k} (turns_PG[{r}] = {int(turns.turns_PG[r])})")
        G = turns.group_size
        ret = returns_to_go(rewards, played, self.discount)
        ret_P_G_K, played_P_G_K = ret.view(-1, G, ret.shape[1]), played.view(-1, G, ret.shape[1])
        count_P_K = played_P_G_K.sum(1)
        baseline_P_K = ret_P_G_K.sum(1) / count_P_K.clamp(min=1)
        centred = torch.where(played_P_G_K, ret_P_G_K - baseline_P_K[:, None, :], 0.0)
        if self.std_normalize:
            std_P_K = (centred.pow(2).sum(1) / count_P_K.clamp(min=1)).sqrt()
            centred = centred / (std_P_K[:, None, :] + STD_EPS)
        adv_PG_T = spread(centred.view_as(ret), turns).to(adv_P_G.dtype)
        reached = int((count_P_K > 0).sum())
        metrics = {
            "turn_credit/return_to_go_mean": float(ret[played].mean()) if bool(played.any()) else 0.0,
            "turn_credit/lone_turn_fraction": int((count_P_K == 1).sum()) / reached if reached else 0.0,
        }
        return adv_PG_T, metrics

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

