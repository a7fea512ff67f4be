"""turn_credit=env: the environment's per-turn advantages when they cover every turn, else the episode's."""

import math

import pytest
import torch

from rlvr.turn_credit.env import EnvAdvantages, env_advantages
from rlvr.turn_credit.episode import EpisodeCredit
from tests.turn_credit.rows import NAN, expand, off_action, turn_signals

# 2 prompts × 3 episodes, observations between actions
ROWS = ["00o1o..",   # e0: 2 turns
        "0o11o..",   # e1: 2 turns
        "000o...",   # e2: 1 turn
        "0o1o2..",   # e3: 3 turns
        "0o11...",   # e4: 2 turns
        "00o....",   # e5: 1 turn
        ]
ENV_ADV = [[0.3, -0.1, NAN],    # covers both turns → used
           [0.2, NAN, NAN],     # turn 1 missing → the whole episode falls back
           [NAN, 0.9, NAN],     # turn 0 missing (turn 1 was not played) → falls back
           [0.1, 0.2, 0.3],     # covers all 3 turns
           [NAN, NAN, NAN],     # none → falls back
           [0.4, NAN, NAN]]     # covers its one turn (past it nothing is read)
ADV_P_G = [[0.5, -0.25, -0.25], [0.125, 0.0, -0.125]]


def credit(rewards_P_G, adv_P_G=ADV_P_G, env_adv=ENV_ADV):
    turns = turn_signals(ROWS, 3, env_adv_PG_K=env_adv)
    return EnvAdvantages()(torch.tensor(adv_P_G), torch.tensor(rewards_P_G), turns)


def test_covered_episodes_take_the_environments_values_the_others_their_episode_advantage():
    out, metrics = credit([[1.0, 0.0, 0.0], [0.5, 0.25, 0.0]])
    per_turn = [[0.3, -0.1, 0],          # e0 covered
                [-0.25, -0.25, 0],       # e1: episode advantage −0.25 on every action token (0.2 of turn 0 unused)
                [-0.25, 0, 0],           # e2: episode advantage
                [0.1, 0.2, 0.3],         # e3 covered
                [0.0, 0.0, 0],           # e4: episode advantage 0
                [0.4, 0, 0]]             # e5 covered
    torch.testing.assert_close(out, expand(ROWS, per_turn))
    assert out[0].tolist() == pytest.approx([0.3, 0.3, 0.0, -0.1, 0.0, 0.0, 0.0])
    assert not out[off_action(ROWS)].any()
    assert metrics == {"turn_credit/env_covered_fraction": 3 / 6}  # e0, e3, e5


def test_a_group_whose_rewards_tie_gets_nothing_even_where_covered():
    # group 1's rewards all 1.0: the predecessor skipped the group, so e3's and e5's advantages are not used
    out, _ = credit([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], adv_P_G=[[0.5, -0.25, -0.25], [0.0, 0.0, 0.0]])
    assert not out[3:].any()
    assert out[0].tolist() == pytest.approx([0.3, 0.3, 0.0, -0.1, 0.0, 0.0, 0.0])


def test_without_any_environment_advantage_it_is_turn_credit_episode():
    rewards, adv = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.25, 0.0]]), torch.tensor(ADV_P_G)
    out, metrics = EnvAdvantages()(adv, rewards, turn_signals(ROWS, 3, env_adv_PG_K=[[NAN] * 3] * 6))
    assert torch.equal(out, EpisodeCredit()(adv, rewards, turn_signals(ROWS, 3))[0])
    assert metrics == {"turn_credit/env_covered_fraction": 0.0}


def test_env_advantages_reads_each_turns_info():
    infos = [[{"advantage": 0.3}, {"advantage": -1}], [{"advantage": 0.2}, {}], [{"advantage": None}], []]
    adv = env_advantages(infos, K=2)
    assert adv.dtype == torch.float32 and adv.shape == (4, 2)
    expected = torch.tensor([[0.3, -1.0], [0.2, NAN], [NAN, NAN], [NAN, NAN]])
    torch.testing.assert_close(adv, expected, equal_nan=True)


@pytest.mark.parametrize("value", ["high", True, math.nan, math.inf, [0.1]])
def test_env_advantages_refuses_what_is_not_a_finite_number(value):
    with pytest.raises(ValueError, match=r"row 1, turn 0: Step.info\['advantage'\] = .* is not a finite number"):
        env_advantages([[{}], [{"advantage": value}]], K=1)


def test_more_turns_than_k_and_a_missing_tensor_fail():
    with pytest.raises(ValueError, match="row 0 has 2 turns' infos, more than K=1"):
        env_advantages([[{}, {}]], K=1)
    with pytest.raises(ValueError, match="turn_credit=env needs turns.env_adv_PG_K"):
        EnvAdvantages()(torch.zeros(2, 3), torch.zeros(2, 3), turn_signals(ROWS, 3))
