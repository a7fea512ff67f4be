"""turn_credit=episode, and the shape checks every option runs first."""

import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.credit import assign_credit
from rlvr.transform.none import NoTransform
from rlvr.turn_credit.episode import EpisodeCredit
from rlvr.types import TokenSignals, TurnSignals
from tests.turn_credit.rows import expand, off_action, turn_signals

# 2 prompts × 2 episodes; episodes take 1 to 3 turns with observations between actions
ROWS = ["00o1o2.",
        "0oo11..",
        "000....",
        "0o1o22o"]


def test_every_action_token_gets_its_episodes_advantage():
    adv_P_G = torch.tensor([[0.5, -0.5], [0.25, -0.25]])
    out, metrics = EpisodeCredit()(adv_P_G, torch.zeros(2, 2), turn_signals(ROWS, 2))
    # row 0: A = 0.5 on its 4 action tokens (turns 0, 0, 1, 2), 0 on the 2 observations and the padding
    assert out[0].tolist() == [0.5, 0.5, 0.0, 0.5, 0.0, 0.5, 0.0]
    assert torch.equal(out, expand(ROWS, [[0.5] * 3, [-0.5] * 3, [0.25] * 3, [-0.25] * 3]))
    assert not out[off_action(ROWS)].any() and metrics == {}


def test_one_turn_rows_are_the_single_turn_path_bit_for_bit():
    # rewards [1, 0, 0, 1] → GRPO [0.5, −0.5, −0.5, 0.5]; [0.3, 0.3, 0.3, 0.3] ties → zeroed by assign_credit
    rewards_P_G = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3]])
    rows = ["000", "0..", "00.", "000", "0..", "00.", "000", "000"]
    turns = turn_signals(rows, 4)
    single = assign_credit(rewards_P_G, TokenSignals(logprobs_PG_T=torch.full((8, 3), -0.5),
                                                     mask_PG_T=turns.actions_PG_T, group_size=4, step=0,
                                                     correct_rate=0.5),
                           GRPO(PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)), NoTransform())
    out, _ = EpisodeCredit()(single.adv_P_G, rewards_P_G, turns)
    assert torch.equal(out, single.adv_PG_T)
    assert torch.equal(out, single.adv_P_G.reshape(-1)[:, None] * turns.actions_PG_T)


def test_empty_episodes_and_empty_actions_get_nothing():
    # row 1 took no action (0 turns); row 0's turn 1 had an empty action (turns_PG 2, no token of turn 1)
    turns = turn_signals(["0o..", "oo.."], 2, turns=[2, 0])
    out, _ = EpisodeCredit()(torch.tensor([[1.0, -1.0]]), torch.zeros(1, 2), turns)
    assert out.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("change,message", [
    (dict(turns_PG=torch.tensor([2, 3, 1, 3])), r"row 0: action token 5 has turn 2, outside \[0, 2\)"),
    (dict(group_size=3), "4 rows are not divisible by group_size=3"),
    (dict(turn_PG_T=torch.zeros(4, 7)), "turn_PG_T must be integer"),
    (dict(actions_PG_T=torch.ones(4, 7)), "actions_PG_T must be bool"),
    (dict(turns_PG=torch.tensor([3, 2, 1])), "turns_PG must be 4 integers"),
])
def test_inconsistent_rows_fail_before_any_arithmetic(change, message):
    good = turn_signals(ROWS, 2)
    fields = {f: getattr(good, f) for f in ("actions_PG_T", "turn_PG_T", "turns_PG", "group_size")}
    with pytest.raises(ValueError, match=message):
        EpisodeCredit()(torch.zeros(2, 2), torch.zeros(2, 2), TurnSignals(**{**fields, **change}))


def test_episode_tensors_must_match_the_rows():
    with pytest.raises(ValueError, match=r"adv_P_G has shape \(4,\), expected \(2, 2\) for 4 rows"):
        EpisodeCredit()(torch.zeros(4), torch.zeros(2, 2), turn_signals(ROWS, 2))
    with pytest.raises(ValueError, match=r"rewards_P_G has shape \(1, 4\), expected \(2, 2\)"):
        EpisodeCredit()(torch.zeros(2, 2), torch.zeros(1, 4), turn_signals(ROWS, 2))
