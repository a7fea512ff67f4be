"""turn_credit=tl_grpo: local branch advantage + turn_weight · (reward − EMA baseline), the EMA checkpointed."""

import json
import math

import pytest
import torch

from rlvr.turn_credit.episode import EpisodeCredit
from rlvr.turn_credit.tl_grpo import TLGRPO
from tests.turn_credit.rows import NAN, expand, off_action, turn_signals

KNOBS = dict(turn_weight=0.5, ema_decay=0.9, ema_init=0.5, branch_mode="action_space", branch_size=4,
             lookahead_steps=2)

# 2 prompts × 2 episodes, observations between actions
ROWS = ["00o1o.",   # e0: 2 turns
        "0o11..",   # e1: 2 turns
        "000o..",   # e2: 1 turn
        "0o1o1."]   # e3: 2 turns, never probed (a truncated episode): falls back to its episode advantage
# B = 4 values per turn: the primary's, then the alternatives'; NaN = not probed
BRANCHES = [[[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, NAN, NAN]],
            [[0.5, NAN, NAN, NAN], [0.0, 0.0, 0.0, 0.0]],
            [[1.0, 0.0, 0.5, 0.5], [NAN, NAN, NAN, NAN]],
            [[NAN, NAN, NAN, NAN], [NAN, NAN, NAN, NAN]]]
REWARDS = [[1.0, 0.0], [0.5, 0.0]]
ADV_P_G = [[0.5, -0.5], [0.25, -0.25]]


def call(credit: TLGRPO, rewards=REWARDS, branches=BRANCHES, rows=ROWS):
    turns = turn_signals(rows, 2, branch_rewards_PG_K_B=branches)
    return credit(torch.tensor(ADV_P_G), torch.tensor(rewards), turns)


def test_local_and_outcome_terms_with_the_ema_folded_group_by_group():
    credit = TLGRPO(**KNOBS)
    out, metrics = call(credit)
    # EMA, d = 0.9, from 0.5: group 0 is measured against b0 = 0.5;
    #   folding its rewards 1, 0: 0.9·0.5 + 0.1·1 = 0.55, 0.9·0.55 + 0.1·0 = 0.495 → group 1's b1 = 0.495;
    #   folding 0.5, 0: 0.9·0.495 + 0.05 = 0.4955, 0.9·0.4955 = 0.44595 (the EMA after the step)
    # outcome o = R − b: e0 1 − 0.5 = 0.5, e1 −0.5, e2 0.5 − 0.495 = 0.005, e3 −0.495
    # e0 turn 0: [1, 0, 0, 1] mean 0.5, population std 0.5 → local (1 − 0.5)/0.5 = 1   → 1 + 0.5·0.5 = 1.25
    #    turn 1: [0, 1] mean 0.5, std 0.5 → local −1                                   → −1 + 0.25 = −0.75
    # e1 turn 0: the primary alone → local 0                                           → 0.5·(−0.5) = −0.25
    #    turn 1: [0, 0, 0, 0] std 0 → 0 / (0 + 1e-8) = 0                              → −0.25
    # e2 turn 0: [1, 0, 0.5, 0.5] mean 0.5, var (0.25 + 0.25 + 0 + 0)/4 = 0.125 → local 0.5/√0.125 = √2
    #                                                                                 → √2 + 0.5·0.005 = √2 + 0.0025
    # e3: no probe at all → not covered → its episode advantage −0.25 on every action token
    per_turn = [[1.25, -0.75], [-0.25, -0.25], [math.sqrt(2) + 0.0025, 0.0], [-0.25, -0.25]]
    torch.testing.assert_close(out, expand(ROWS, per_turn))
    assert out[0].tolist() == pytest.approx([1.25, 1.25, 0.0, -0.75, 0.0, 0.0])
    assert not out[off_action(ROWS)].any()
    # 3 of 4 episodes covered; of their 5 turns, 4 had two values or more (not e1's turn 0)
    assert metrics == pytest.approx({"train/tl_grpo_ema_baseline": 0.44595,
                                     "turn_credit/tl_grpo_covered_fraction": 0.75,
                                     "turn_credit/tl_grpo_branched_turn_fraction": 0.8})
    assert credit.state_dict() == {"ema": pytest.approx(0.44595)}


def test_the_next_step_is_measured_against_the_updated_ema():
    credit = TLGRPO(**KNOBS)
    call(credit)
    out, _ = call(credit)
    # b0 = 0.44595 now: e1's turns (local 0) get 0.5·(0 − 0.44595) = −0.222975
    assert out[1, 0].item() == pytest.approx(-0.222975)


def test_state_round_trips_through_json_and_gives_the_same_next_output():
    trained = TLGRPO(**KNOBS)
    call(trained)
    state = json.loads(json.dumps(trained.state_dict()))
    resumed = TLGRPO(**KNOBS)
    resumed.load_state_dict(state)
    expected, expected_metrics = call(trained)
    again, again_metrics = call(resumed)
    assert torch.equal(again, expected) and again_metrics == expected_metrics
    fresh, _ = call(TLGRPO(**KNOBS))
    assert not torch.equal(fresh, expected)  # the baseline is what the state carries
    with pytest.raises(ValueError, match="has no finite 'ema'"):
        resumed.load_state_dict({})


def test_an_episode_missing_one_turns_primary_falls_back_entirely():
    # e0's turn 1 has no primary value: e0 is not covered, though turn 0 was probed
    branches = [[[1.0, 0.0, 0.0, 1.0], [NAN, 1.0, NAN, NAN]]] + BRANCHES[1:]
    out, metrics = call(TLGRPO(**KNOBS), branches=branches)
    assert out[0].tolist() == [0.5, 0.5, 0.0, 0.5, 0.0, 0.0]
    assert metrics["turn_credit/tl_grpo_covered_fraction"] == 0.5


def test_one_turn_rows_without_probes_are_the_episode_path_and_tied_groups_still_train():
    rows = ["00.", "0..", "000", "0.."]
    unprobed = [[[NAN, NAN]]] * 4
    adv, rewards = torch.tensor(ADV_P_G), torch.tensor(REWARDS)
    out, _ = TLGRPO(**KNOBS)(adv, rewards, turn_signals(rows, 2, branch_rewards_PG_K_B=unprobed))
    assert torch.equal(out, EpisodeCredit()(adv, rewards, turn_signals(rows, 2))[0])
    # a tied group (rewards 1, 1; its episode advantages 0) is kept: o = 1 − 0.5 = 0.5, local [1, 0] → 1
    tied = TLGRPO(**KNOBS)(torch.zeros(1, 2), torch.ones(1, 2),
                           turn_signals(["0", "0"], 2, branch_rewards_PG_K_B=[[[1.0, 0.0]], [[0.0, 1.0]]]))[0]
    assert tied.flatten().tolist() == pytest.approx([1.0 + 0.25, -1.0 + 0.25])


def test_turn_weight_scales_only_the_outcome_term():
    out, _ = call(TLGRPO(**{**KNOBS, "turn_weight": 0.0}))
    # e0 turn 0 is its local advantage alone (1); e1's turns (local 0) get 0
    assert out[0, 0].item() == pytest.approx(1.0) and out[1, 0].item() == 0.0


def test_probes_must_fit_the_branch_size_and_be_given():
    with pytest.raises(ValueError, match=r"B=4 values per turn, expected 1 to branch_size=3"):
        call(TLGRPO(**{**KNOBS, "branch_size": 3}))
    with pytest.raises(ValueError, match="turn_credit=tl_grpo needs turns.branch_rewards_PG_K_B"):
        TLGRPO(**KNOBS)(torch.zeros(2, 2), torch.zeros(2, 2), turn_signals(ROWS, 2))
    with pytest.raises(ValueError, match="non-finite reward"):
        call(TLGRPO(**KNOBS), rewards=[[1.0, NAN], [0.0, 0.0]])


@pytest.mark.parametrize("change", [dict(ema_decay=1.0), dict(ema_decay=0.0), dict(turn_weight=-0.1),
                                    dict(ema_init=math.nan), dict(branch_mode="tree"), dict(branch_size=1),
                                    dict(lookahead_steps=-1), dict(branch_size=True)])
def test_knobs_out_of_range_fail_at_construction(change):
    with pytest.raises(ValueError):
        TLGRPO(**{**KNOBS, **change})


def test_needs_fork_and_for_action_space_legal_actions():
    assert set(TLGRPO.needs(KNOBS).requires) == {"fork", "legal_actions"}
    assert set(TLGRPO.needs({**KNOBS, "branch_mode": "llm"}).requires) == {"fork"}
