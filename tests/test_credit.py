"""rlvr.credit.assign_credit: the trainer's whole credit chain, run on a batch built by hand."""

import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.reinforce_pp import ReinforcePP
from rlvr.credit import assign_credit
from rlvr.transform.none import NoTransform
from rlvr.types import TokenSignals


def signals(rows: int, tokens: int, lengths: list[int]) -> TokenSignals:
    mask = torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]
    return TokenSignals(logprobs_PG_T=torch.full((rows, tokens), -0.5), mask_PG_T=mask, group_size=4, step=0,
                        correct_rate=0.5)


def loss(cap: float = 0.0) -> PolicyLoss:
    return PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=cap)


def test_episode_advantages_ties_broadcast_and_cap():
    # group 0: rewards [1, 0, 0, 1] → mean 0.5 → [0.5, -0.5, -0.5, 0.5]; group 1 ties (all 1) → zeroed
    rewards_P_G = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    credit = assign_credit(rewards_P_G, signals(8, 3, [3, 2, 1, 3, 3, 3, 3, 3]), GRPO(loss(cap=0.4)), NoTransform())
    assert credit.adv_P_G.tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]
    # broadcast over each completion's real tokens (lengths 3, 2, 1, 3), then |A| capped at 0.4
    expected = [[0.4, 0.4, 0.4], [-0.4, -0.4, 0.0], [-0.4, 0.0, 0.0], [0.4, 0.4, 0.4]]
    assert torch.equal(credit.adv_PG_T[:4], torch.tensor(expected))
    assert credit.adv_PG_T[4:].abs().sum() == 0
    assert credit.metrics["adv_cap_fraction"] == 1.0  # all 9 non-zero tokens had |0.5| > 0.4
    assert not credit.skipped


def test_a_step_whose_groups_all_tie_is_skipped():
    credit = assign_credit(torch.ones(2, 4), signals(8, 3, [3] * 8), GRPO(loss()), NoTransform())
    assert credit.skipped and credit.adv_PG_T.abs().sum() == 0


def test_the_batch_pass_runs_after_the_transform():
    # REINFORCE++: the non-zero token advantages of the step are z-scored: mean 0, std 1 over those tokens
    rewards_P_G = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # mean 0.25 → [0.75, -0.25, -0.25, -0.25]
    credit = assign_credit(rewards_P_G, signals(4, 2, [2, 2, 1, 2]), ReinforcePP(loss(), batch_norm=True),
                           NoTransform())
    nonzero = credit.adv_PG_T[credit.adv_PG_T != 0]
    assert nonzero.numel() == 7 and abs(float(nonzero.mean())) < 1e-6
    assert credit.adv_PG_T[0, 0] > 0 > credit.adv_PG_T[1, 0]  # signs kept


def test_a_turn_credit_then_a_transform_weights_each_turn_advantage():
    """Multi-turn: reward_to_go gives each turn its own advantage, and GTPO weights it token by token over the
    action tokens only (the observation token `o` is outside the mask, so outside GTPO's mean)."""
    from rlvr.transform.gtpo import GTPO
    from rlvr.turn_credit.reward_to_go import RewardToGo
    from tests.turn_credit.rows import turn_signals

    # Group of 2 episodes, rows "00o1" (actions 0 and 1) and "0..." (one action): turn rewards [0, 1] and [0].
    # Returns-to-go: row 0 → [1, 1]; row 1 → [0]. Baseline per turn index: turn 0 mean(1, 0) = 0.5,
    # turn 1 reached by row 0 alone → 0 (lone). Turn advantages: row 0 [0.5, 0], row 1 [-0.5].
    rows = ["00o1", "0..."]
    turns = turn_signals(rows, 2, turn_rewards_PG_K=[[0.0, 1.0], [0.0, float("nan")]])
    # Surprisals on row 0's action tokens: 1, 3, (observation 7, masked), 2 → mean over actions (1+3+2)/3 = 2;
    # β = 0.5: w = 1 + 0.5·(u/2 − 1) = 0.75, 1.25, ·, 1.0; A = 0.5·0.75, 0.5·1.25, 0, 0·1.0
    # Row 1: one action token, u = 4 → mean 4, w = 1 → A = −0.5.
    logprobs = torch.tensor([[-1.0, -3.0, -7.0, -2.0], [-4.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    sig = TokenSignals(logprobs_PG_T=logprobs, mask_PG_T=turns.actions_PG_T, group_size=2, step=0,
                       correct_rate=0.5)
    credit = assign_credit(torch.tensor([[1.0, 0.0]]), sig, GRPO(loss()), GTPO(beta=0.5, uncertainty="surprisal"),
                           RewardToGo(discount=1.0, std_normalize=False), turns)
    assert credit.adv_PG_T[0].tolist() == pytest.approx([0.375, 0.625, 0.0, 0.0], abs=1e-7)  # μ + 1e-8 in w
    assert credit.adv_PG_T[1].tolist() == pytest.approx([-0.5, 0.0, 0.0, 0.0], abs=1e-7)
    assert credit.adv_P_G.tolist() == [[0.5, -0.5]]  # the algorithm's episode advantages, as reported
    assert credit.metrics["turn_credit/lone_turn_fraction"] > 0  # the turn credit's metrics come along
