"""DAPO's soft overlong punishment and overlong filtering (rlvr/reward/overlong.py), with the arithmetic."""

import re

import pytest
import torch

from rlvr.credit import Credit
from rlvr.reward.overlong import Overlong
from rlvr.types import Rollouts, Scores, StepBatch

MAX_TOKENS = 8


def step(lengths: list[int], rewards: list[float]) -> StepBatch:
    mask = torch.arange(MAX_TOKENS)[None, :] < torch.tensor(lengths)[:, None]
    rollouts = Rollouts(prompt_ids_P=[[1]], group_size=len(lengths), tokens_PG_T=mask.long(),
                        logprobs_PG_T=mask.float() * -1, mask_PG_T=mask,
                        finished_PG=torch.tensor([n < MAX_TOKENS for n in lengths]), temperature=1.0)
    return StepBatch(rollouts=rollouts, rewards_P_G=torch.tensor([rewards]), completions=[""] * len(lengths),
                     scores=Scores(values=rewards), metrics={}, failures={}, what="completions", check="",
                     sample_seconds=0.0, score_seconds=0.0)


def test_the_soft_punishment_is_linear_over_the_buffer():
    # L = 8, buffer_frac 0.5: B = 4, penalty 0.5: no punishment up to L − B = 4 tokens; then −0.5·(|y| − 4)/4
    #   |y| = 3 → 0,  4 → 0,  5 → −0.125,  6 → −0.25,  8 → −0.5 (the most: the completion hit L)
    batch = step([3, 4, 5, 6, 8], [1.0, 1.0, 0.0, 1.0, 1.0])
    overlong = Overlong(buffer_frac=0.5, penalty=0.5)
    punished = overlong.punish(batch, MAX_TOKENS)
    assert punished.rewards_P_G.tolist() == [[1.0, 1.0, -0.125, 0.75, 0.5]]
    fields = overlong.fields(batch.rollouts, MAX_TOKENS)
    assert fields["overlong/punished_frac"] == 3 / 5
    assert fields["overlong/punishment_mean"] == pytest.approx(-(0.125 + 0.25 + 0.5) / 5)


def test_off_changes_nothing():
    batch = step([8, 2], [1.0, 0.0])
    assert Overlong().punish(batch, MAX_TOKENS) is batch and Overlong().fields(batch.rollouts, MAX_TOKENS) == {}
    credit = Credit(torch.zeros(1, 2), torch.ones(2, MAX_TOKENS), {})
    assert Overlong().mask(credit, batch.rollouts) == (credit, {})


def test_filtering_zeroes_the_truncated_completions_advantages_only():
    batch = step([8, 5, 8], [1.0, 0.0, 0.0])  # rows 0 and 2 hit max_tokens without EOS
    adv = torch.where(batch.rollouts.mask_PG_T, torch.tensor([[0.7], [-0.3], [-0.4]]), 0.0)
    credit, fields = Overlong(filter=True).mask(Credit(torch.zeros(1, 3), adv, {}), batch.rollouts)
    assert credit.adv_PG_T[0].abs().sum() == 0 and credit.adv_PG_T[2].abs().sum() == 0
    assert torch.equal(credit.adv_PG_T[1], adv[1]) and fields == {"overlong/filtered_frac": 2 / 3}
    only_truncated = Overlong(filter=True).mask(Credit(torch.zeros(1, 3), torch.where(
        torch.tensor([True, False, True])[:, None], adv, 0.0), {}), batch.rollouts)[0]
    assert only_truncated.skipped  # nothing left to train on


@pytest.mark.parametrize(("overlong", "message"), [
    (dict(buffer_frac=-0.1), "buffer_frac=-0.1 must be in [0, 1)"),
    (dict(buffer_frac=1.0), "buffer_frac=1.0 must be in [0, 1)"),
    (dict(penalty=-1.0), "trainer.overlong.penalty=-1.0 must be >= 0"),
])
def test_bad_settings_name_the_key(overlong, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Overlong(**overlong)
