"""`turn_credit=tl_grpo`: the predecessor's branching credit (TL-GRPO). Each turn's action is compared with
alternatives probed from the same state, and the episode's outcome with a running baseline.

    v_{r,k,0}     the primary action's value at turn k; v_{r,k,b}, b ≥ 1, the alternatives' (below)
    V_{r,k}       the values present (not NaN) of v_{r,k,·}, the primary's included
    local_{r,k}   = (v_{r,k,0} − mean V) / (std V + 1e-8)   if |V| ≥ 2; std the population std (÷|V|)
                  = 0                                        if |V| < 2 (no alternative was probed)
    o_r           = R_r − b_p                                R_r the episode's reward, b_p the EMA (below)
    A_{r,k}       = local_{r,k} + w · o_r                    w = `turn_weight` (0.5)
    covered_r     = n_r ≥ 1 and v_{r,k,0} is present for every turn k < n_r
    A_{r,t}       = A_{r, turn(t)} on action tokens of a covered episode; A_r (the episode advantage, as
                    turn_credit=episode) on those of any other (a truncated episode, one not probed); 0 elsewhere

The outcome baseline is an exponential moving average of episode rewards, kept across steps and stored in
the checkpoint (`state_dict`: {"ema": float}; `ema_init` 0.5 before the first step, `ema_decay` d = 0.9):

    for each group p of the step, in row order:
        b_p = ema                                   the baseline group p is measured against
        for each episode g of group p:  ema ← d·ema + (1 − d)·R_{p,g}

So a group is measured against the EMA before its own episodes are folded in, later groups of the same step
see earlier groups' rewards, and every episode is folded (truncated ones and tied groups too). The metric
`train/tl_grpo_ema_baseline` (the predecessor's name) is the EMA after the step. Calling twice on one step
folds twice: call once per step.

What the rollout must give (`TurnSignals.branch_rewards_PG_K_B`, B ≤ `branch_size`; rlvr/rollout/branch_probes.py
measures it, told what to probe by `self.branching`). For turn k of episode r,
with s_k the state before the primary action a_k and c = the next `lookahead_steps` actions the primary
episode took after a_k (fewer near its end):

    v_{r,k,0} = reward collected from s_k by a_k then c           (lookahead 0: the turn's own reward r_k)
    v_{r,k,b} = reward collected on a fork of s_k by an alternative action then the same c, replayed (not
                resampled); `branch_mode` action_space: up to B − 1 distinct legal actions other than a_k,
                drawn at random (unseeded in the predecessor; seeded from the step's seed here); llm: B − 1
                actions sampled from the policy at turn k's context
    NaN       where nothing was probed; a turn whose action was invalid carries only v_{r,k,0}. A probe that
              failed was 0.0 in the predecessor, and is here

So `branch_mode`, `branch_size` and `lookahead_steps` are the rollout's knobs (held here, read by it); the
credit reads `turn_weight`, `ema_decay`, `ema_init` and B ≤ `branch_size`.

As the predecessor's code, on points its documentation leaves open: the std is the population std
and the primary value is one of the values it is taken over; fewer than two values give local 0 (the outcome
term alone); the outcome term is not normalised; coverage is all or nothing per episode; the EMA is updated
per episode, group by group, after the group's advantages. Tied groups are not zeroed (the predecessor kept
them under TL-GRPO). `turn_weight` is a knob here; the predecessor fixed it at 0.5.

Metrics: `train/tl_grpo_ema_baseline`, `turn_credit/tl_grpo_covered_fraction` (covered episodes / episodes
with a turn), `turn_credit/tl_grpo_branched_turn_fraction` (turns of covered episodes with |V| ≥ 2 / their turns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.turn_credit.signals import check_turns, episode_tokens, per_turn, played_PG_K, spread
from rlvr.types import Branching, TurnSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

STD_EPS = 1e-8
BRANCH_MODES = ("action_space", "llm")


def local_advantages(branch_PG_K_B: Tensor) -> tuple[Tensor, Tensor]:
    """(local [P·G, K] float64, present-value count [P·G, K]) from the probes, NaN = absent."""
    values = branch_PG_K_B.double()
    present = torch.isfinite(values)
    count = present.sum(-1)
    zeroed = torch.where(present, values, 0.0)
    mean = zeroed.sum(-1) / count.clamp(min=1)
    var = torch.where(present, values - mean[..., None], 0.0).pow(2).sum(-1) / count.clamp(min=1)
    local = (zeroed[..., 0] - mean) / (var.sqrt() + STD_EPS)
    return torch.where(count >= 2, local, 0.0), count


def fold_ema(ema: float, decay: float, rewards_P_G: list[list[float]]) -> tuple[list[float], float]:
    """(baseline of each group: the EMA before its episodes, the EMA after the step), in row order."""
    baselines = []
    for group in rewards_P_G:
        baselines.append(ema)
        for reward in group:
            ema = decay * ema + (1.0 - decay) * reward
    return baselines, ema


class TLGRPO:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        mode = settings.get("branch_mode")
        why = {"fork": f"turn_credit=tl_grpo probes alternative actions (branch_mode={mode}) on copies of each episode"}
        if mode == "action_space":
            why["legal_actions"] = "turn_credit=tl_grpo branch_mode=action_space draws alternatives among them"
        return Needs(requires=why)

    def __init__(self, *, turn_weight: float, ema_decay: float, ema_init: float, branch_mode: str,
                 branch_size: int, lookahead_steps: int) -> None:
        if not (_number(turn_weight) and turn_weight >= 0.0):
            raise ValueError(f"turn_weight={turn_weight!r} must be a finite number >= 0")
        if not (_number(ema_decay) and 0.0 < ema_decay < 1.0):
            raise ValueError(f"ema_decay={ema_decay!r} must be in (0, 1)")
        if not _number(ema_init):
            raise ValueError(f"ema_init={ema_init!r} must be a finite number")
        if branch_mode not in BRANCH_MODES:
            raise ValueError(f"branch_mode={branch_mode!r} must be one of {', '.join(BRANCH_MODES)}")
        if isinstance(branch_size, bool) or not isinstance(branch_size, int) or branch_size < 2:
            raise ValueError(f"branch_size={branch_size!r} must be an int >= 2 (the primary and an alternative)")
        if isinstance(lookahead_steps, bool) or not isinstance(lookahead_steps, int) or lookahead_steps < 0:
            raise ValueError(f"lookahead_steps={lookahead_steps!r} must be an int >= 0")
        self.turn_weight, self.ema_decay = float(turn_weight), float(ema_decay)
        self.branching = Branching(branch_mode, branch_size, lookahead_steps)
        self.ema = float(ema_init)

    def __call__(self, adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> tuple[Tensor, dict[str, float]]:
        check_turns(adv_P_G, rewards_P_G, turns)
        branch = per_turn("branch_rewards_PG_K_B", turns.branch_rewards_PG_K_B, turns, "tl_grpo", dims=3)
        if not 1 <= branch.shape[2] <= self.branching.size:
            raise ValueError(f"branch_rewards_PG_K_B has B={branch.shape[2]} values per turn, expected 1 to "
                             f"branch_size={self.branching.size} (the primary, then the alternatives)")
        if not bool(torch.isfinite(rewards_P_G).all()):
            raise ValueError(f"rewards_P_G holds a non-finite reward, which would poison the EMA baseline: "
                             f"{rewards_P_G.tolist()}")
        baselines_P, ema_after = fold_ema(self.ema, self.ema_decay, rewards_P_G.double().tolist())
        baseline_PG = torch.tensor(baselines_P, dtype=torch.float64, device=rewards_P_G.device)
        outcome_PG = rewards_P_G.double().reshape(-1) - baseline_PG.repeat_interleave(turns.group_size)
        local, count = local_advantages(branch)
        played = played_PG_K(turns, branch.shape[1])
        covered_PG = (torch.isfinite(branch[..., 0]) | ~played).all(1) & (turns.turns_PG > 0)
        turn_adv = torch.where(played, local + self.turn_weight * outcome_PG[:, None], 0.0)
        adv_PG_T = torch.where(covered_PG[:, None], spread(turn_adv, turns).to(adv_P_G.dtype),
                               episode_tokens(adv_P_G, turns))
        self.ema = ema_after
        with_turns = int((turns.turns_PG > 0).sum())
        covered_turns = played & covered_PG[:, None]
        n_covered_turns = int(covered_turns.sum())
        return adv_PG_T, {
            "train/tl_grpo_ema_baseline": ema_after,
            "turn_credit/tl_grpo_covered_fraction": int(covered_PG.sum()) / with_turns if with_turns else 0.0,
            "turn_credit/tl_grpo_branched_turn_fraction":
                int((covered_turns & (count >= 2)).sum()) / n_covered_turns if n_covered_turns else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the EMA baseline; a state without one (a checkpoint of another turn_credit) is refused."""
        ema = state.get("ema")
        if not _number(ema):
            raise ValueError(f"tl_grpo state {state!r} has no finite 'ema' (the outcome baseline)")
        self.ema = float(ema)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
