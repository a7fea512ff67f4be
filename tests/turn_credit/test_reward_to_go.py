"""turn_credit=reward_to_go: return-to-go per turn against the group's mean at the same turn index."""

import math

import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.credit import assign_credit
from rlvr.transform.none import NoTransform
from rlvr.turn_credit.reward_to_go import RewardToGo
from rlvr.types import TokenSignals
from tests.turn_credit.rows import NAN, expand, off_action, turn_signals

# 2 prompts × 3 episodes, 1 to 3 turns each, observations between actions
ROWS = ["00o1oo2.",   # e0: 3 turns
        "0oo11...",   # e1: 2 turns
        "000o....",   # e2: 1 turn
        "0o1.....",   # e3: 2 turns
        "00o11o..",   # e4: 2 turns
        "0o1o2..."]   # e5: 3 turns
TURN_REWARDS = [[0.0, 0.0, 1.0],
                [0.0, 1.0, NAN],
                [0.0, NAN, NAN],
                [1.0, 0.0, NAN],
                [0.0, 0.0, NAN],
                [0.0, 0.5, 0.5]]
THIRD = 1 / 3


def credit(rows=ROWS, turn_rewards=TURN_REWARDS, G=3, **knobs):
    knobs = {"discount": 1.0, "std_normalize": False, **knobs}
    turns = turn_signals(rows, G, turn_rewards_PG_K=turn_rewards)
    P = len(rows) // G
    return RewardToGo(**knobs)(torch.zeros(P, G), torch.zeros(P, G), turns)


def test_returns_to_go_against_the_groups_mean_at_each_turn_index():
    out, metrics = credit()
    # returns-to-go G_k: e0 [1, 1, 1], e1 [1, 1], e2 [0] | e3 [1, 0], e4 [0, 0], e5 [1, 1, 0.5]
    # group 0, turn 0: all three reached it, [1, 1, 0] → mean 2/3 → [1/3, 1/3, −2/3]
    #          turn 1: e0, e1 reached it, [1, 1] → mean 1 → [0, 0];  turn 2: e0 alone → its own baseline → 0
    # group 1, turn 0: [1, 0, 1] → mean 2/3 → [1/3, −2/3, 1/3]
    #          turn 1: [0, 0, 1] → mean 1/3 → [−1/3, −1/3, 2/3];     turn 2: e5 alone → 0
    per_turn = [[THIRD, 0, 0], [THIRD, 0, 0], [-2 * THIRD, 0, 0],
                [THIRD, -THIRD, 0], [-2 * THIRD, -THIRD, 0], [THIRD, 2 * THIRD, 0]]
    torch.testing.assert_close(out, expand(ROWS, per_turn))
    # e4 "00o11o..": turn 0 twice, an observation, turn 1 twice, an observation, padding
    torch.testing.assert_close(out[4], torch.tensor([-2, -2, 0, -1, -1, 0, 0, 0]) * THIRD)
    assert not out[off_action(ROWS)].any()
    # G over the 13 played turns: 3 + 2 + 0 + 1 + 0 + 2.5 = 8.5; lone cells (g0, t2), (g1, t2) of 6 reached
    assert metrics == pytest.approx({"turn_credit/return_to_go_mean": 8.5 / 13,
                                     "turn_credit/lone_turn_fraction": 2 / 6})


def test_std_normalize_divides_by_the_population_std_at_that_turn():
    out, _ = credit(std_normalize=True)
    # group 0, turn 0: deviations [1/3, 1/3, −2/3], population var (1/9 + 1/9 + 4/9) / 3 = 2/9, std √2/3
    #   → [1/√2, 1/√2, −√2];  turn 1: [0, 0] / (0 + 1e-8) = 0;  lone turns stay 0
    # group 1, turn 0: [1/3, −2/3, 1/3] / (√2/3) → [1/√2, −√2, 1/√2];  turn 1: [−1/3, −1/3, 2/3] → [−1/√2, −1/√2, √2]
    h, s = 1 / math.sqrt(2), math.sqrt(2)
    per_turn = [[h, 0, 0], [h, 0, 0], [-s, 0, 0], [h, -h, 0], [-s, -h, 0], [h, s, 0]]
    torch.testing.assert_close(out, expand(ROWS, per_turn))


def test_discount_weights_later_rewards_by_gamma_per_turn():
    out, _ = credit(ROWS[:3], TURN_REWARDS[:3], discount=0.5)
    # γ = 0.5: e0 [0, 0, 1] → G = [0.25, 0.5, 1]; e1 [0, 1] → [0.5, 1]; e2 [0] → [0]
    # turn 0: [0.25, 0.5, 0] → mean 0.25 → [0, 0.25, −0.25]; turn 1: [0.5, 1] → mean 0.75 → [−0.25, 0.25]
    torch.testing.assert_close(out, expand(ROWS[:3], [[0, -0.25, 0], [0.25, 0.25, 0], [-0.25, 0, 0]]))
    out0, _ = credit(ROWS[:3], TURN_REWARDS[:3], discount=0.0)
    # γ = 0: each turn's own reward; turn 0 [0, 0, 0] → 0; turn 1 [0, 1] → [−0.5, 0.5]
    torch.testing.assert_close(out0, expand(ROWS[:3], [[0, -0.5, 0], [0, 0.5, 0], [0, 0, 0]]))


def test_one_turn_rows_equal_grpos_single_turn_path():
    # G_0 = r_0 and every episode reached turn 0, so A = r − mean(r): GRPO's advantage on every action token
    rewards_P_G = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 1.0]])
    rows = ["000o", "0...", "00.."] * 2
    turns = turn_signals(rows, 3, turn_rewards_PG_K=rewards_P_G.reshape(-1, 1).tolist())
    single = assign_credit(rewards_P_G, TokenSignals(logprobs_PG_T=torch.zeros(6, 4), mask_PG_T=turns.actions_PG_T,
                                                     group_size=3, step=0, correct_rate=0.5),
                           GRPO(PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)), NoTransform())
    out, _ = RewardToGo(discount=0.9, std_normalize=False)(single.adv_P_G, rewards_P_G, turns)
    torch.testing.assert_close(out, single.adv_PG_T)


def test_a_tie_in_episode_rewards_is_not_a_tie_in_turns():
    # both episodes earn 1, e0 at turn 0 and e1 at turn 1: turn 0 returns [1, 1] → 0; turn 1 [0, 1] → [−0.5, 0.5]
    out, _ = credit(["0o1", "0o1"], [[1.0, 0.0], [0.0, 1.0]], G=2)
    assert out.tolist() == [[0.0, 0.0, -0.5], [0.0, 0.0, 0.5]]


def test_a_played_turn_without_a_reward_fails_and_turns_not_played_are_not_read():
    with pytest.raises(ValueError, match=r"turn_rewards_PG_K\[1, 1\] = nan is not finite, but row 1 played turn 1"):
        credit(ROWS[:3], [[0.0, 0.0, 1.0], [0.0, NAN, NAN], [0.0, NAN, NAN]])
    # whatever sits past a row's turns is ignored: the same output as NaN there
    filled = [[0.0, 0.0, 1.0], [0.0, 1.0, 7.0], [0.0, 7.0, 7.0]]
    assert torch.equal(credit(ROWS[:3], filled)[0], credit(ROWS[:3], TURN_REWARDS[:3])[0])
    with pytest.raises(ValueError, match="turn_credit=reward_to_go needs turns.turn_rewards_PG_K"):
        RewardToGo(discount=1.0, std_normalize=False)(torch.zeros(1, 3), torch.zeros(1, 3), turn_signals(ROWS[:3], 3))
    with pytest.raises(ValueError, match=r"turn_rewards_PG_K has shape \(3, 2\), expected 2 dims .* K >= 3"):
        credit(ROWS[:3], [r[:2] for r in TURN_REWARDS[:3]])


@pytest.mark.parametrize("knobs", [dict(discount=1.5, std_normalize=False), dict(discount=-0.1, std_normalize=False),
                                   dict(discount=1.0, std_normalize="yes")])
def test_knobs_out_of_range_fail_at_construction(knobs):
    with pytest.raises(ValueError):
        RewardToGo(**knobs)
