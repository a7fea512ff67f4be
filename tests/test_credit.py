"""rlvr.credit.assign_credit: the trainer's whole credit chain, run on a batch built by hand."""

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
