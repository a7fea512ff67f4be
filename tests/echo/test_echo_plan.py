"""ECHO's step plan (rlvr/echo/echo.py): which observation tokens it keeps and with what weight, on hand-made rows;
the entropy floor; the settings it refuses; the skip rule; the config checks (no env, tinker)."""

import pytest
import torch

from composing import FAST, compose_config
from rlvr.config_check import config_problems
from rlvr.credit import Credit
from rlvr.echo.echo import Echo
from rlvr.types import Rollouts

# one group of 2 episodes, T = 6 (a: action, o: observation body, t: template token, _: padding)
#   row 0:  a a o o a o      3 candidates (t 2, 3, 5)
#   row 1:  a t o o o o? -> a t o o o _   3 candidates (t 2, 3, 4); its t 1 is a template token
ACTIONS = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
BODY = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 0]], dtype=torch.bool)
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)


def rollouts(surprisal: float = 1.0, body: torch.Tensor | None = BODY) -> Rollouts:
    lp = torch.where(ACTIONS, -surprisal, 0.0)
    return Rollouts([[1, 2]], 2, torch.ones(2, 6, dtype=torch.long), lp, MASK, torch.ones(2, dtype=torch.bool), 1.0,
                    actions_PG_T=ACTIONS, turn_PG_T=torch.where(ACTIONS, 0, -1), observation_body_PG_T=body)


def echo(**kw) -> Echo:
    return Echo(**({"weight": 0.05, "target_retention": "bounded", "max_tokens_per_step": 2048,
                    "max_token_ratio": 0.5, "entropy_floor": 0.01} | kw))


def test_bounded_keeps_the_first_allowed_candidates_in_row_order_weighted_per_episode_and_per_step():
    # reference = 4 sampled tokens (3 + 1); allowed = min(2048, int(4 × 0.5)) = 2 → row 0's t 2 and 3
    # E = 2 episodes with candidates; row 0 has c = 3 → w = 0.05 / (3 × 2) = 0.008333…
    weights, m = echo().plan(rollouts())
    expected = torch.zeros(2, 6)
    expected[0, 2] = expected[0, 3] = 0.05 / 6
    torch.testing.assert_close(weights, expected)
    assert m["echo/allowed_tokens"] == 2 and m["echo/kept_tokens"] == 2 and m["echo/candidate_tokens"] == 6
    assert m["echo/reference_completion_tokens"] == 4 and m["echo/eligible_rollouts"] == 2
    assert m["echo/kept_datums"] == 1 and m["echo/truncated_tokens"] == 4
    assert m["echo/retention_ratio"] == pytest.approx(2 / 6) and m["echo/token_ratio"] == pytest.approx(2 / 4)
    assert m["echo/completion_surprisal_mean"] == pytest.approx(1.0) and m["echo/skipped_entropy_floor"] == 0


def test_bounded_takes_the_smaller_of_both_limits():
    # max_tokens_per_step = 1 < int(4 × 0.5) = 2: row 0's t 2 alone
    weights, m = echo(max_tokens_per_step=1).plan(rollouts())
    assert weights.nonzero().tolist() == [[0, 2]] and m["echo/allowed_tokens"] == 1
    # ratio 1.0: allowed = min(2048, 4) = 4 → row 0's 3 candidates, then row 1's first (t 2); row 1: 0.05 / (3 × 2)
    weights, m = echo(max_token_ratio=1.0).plan(rollouts())
    assert weights.nonzero().tolist() == [[0, 2], [0, 3], [0, 5], [1, 2]] and m["echo/kept_datums"] == 2
    assert float(weights[1, 2]) == pytest.approx(0.05 / 6)
    # ratio 0.1: int(0.4) = 0 → nothing kept, no weights (the step may be skipped)
    weights, m = echo(max_token_ratio=0.1).plan(rollouts())
    assert weights is None and m["echo/kept_tokens"] == 0


def test_all_keeps_every_candidate_and_a_row_is_normalised_by_its_own_count():
    body = BODY.clone()
    body[1, 4] = False  # row 1: c = 2 → w = 0.05 / (2 × 2) = 0.0125; row 0: 0.05 / (3 × 2)
    weights, m = echo(target_retention="all", entropy_floor=0.0).plan(rollouts(body=body))
    assert m["echo/kept_tokens"] == m["echo/candidate_tokens"] == m["echo/allowed_tokens"] == 5
    assert weights[0].tolist() == pytest.approx([0, 0, 0.05 / 6, 0.05 / 6, 0, 0.05 / 6])
    assert weights[1].tolist() == pytest.approx([0, 0, 0.0125, 0.0125, 0, 0])


def test_the_entropy_floor_switches_echo_off_for_the_step():
    # mean sampled surprisal 0.001 < 0.01: nothing kept; at 0.02 ≥ 0.01 it trains
    weights, m = echo().plan(rollouts(surprisal=0.001))
    assert weights is None and m["echo/skipped_entropy_floor"] == 1 and m["echo/kept_tokens"] == 0
    assert m["echo/allowed_tokens"] == 0 and m["echo/candidate_tokens"] == 6
    assert echo().plan(rollouts(surprisal=0.02))[0] is not None


def test_single_turn_rows_have_no_candidates():
    weights, m = echo().plan(rollouts(body=None))
    assert weights is None and m["echo/candidate_tokens"] == 0 and m["echo/retention_ratio"] == 0


@pytest.mark.parametrize(("kw", "match"), [({"weight": 0.0}, "echo.weight"), ({"target_retention": "some"}, "one of"),
                                           ({"target_retention": "all"}, "entropy_floor=0"),
                                           ({"max_token_ratio": 1.5}, "max_token_ratio"),
                                           ({"entropy_floor": -1.0}, "entropy_floor")])
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        echo(**kw)


def test_a_step_with_echo_targets_and_no_advantage_is_not_skipped():
    zero = torch.zeros(2, 6)
    assert Credit(zero[:, 0].view(1, 2), zero, {}).skipped
    assert not Credit(zero[:, 0].view(1, 2), zero, {}, echo_PG_T=echo().plan(rollouts())[0]).skipped


def test_config_refuses_echo_without_an_env_and_on_tinker():
    _, errors = config_problems(compose_config(FAST + ["echo=on"]), at_start=False)
    assert any("echo=on trains on observation tokens" in e for e in errors), errors
    _, errors = config_problems(compose_config(FAST + ["echo=on", "env=guess"]), at_start=False)
    assert errors == []
    _, errors = config_problems(compose_config(FAST + ["echo=on", "env=guess", "backend=tinker", "engine=tinker"]),
                                at_start=False)
    assert any("echo=on" in e and "local loss" in e for e in errors), errors
    _, errors = config_problems(compose_config(FAST + ["echo=on", "env=guess", "correction=token_mask"]),
                                at_start=False)
    assert any("echo <rlvr.echo.echo.Echo> does not work with a correction that masks tokens" in e for e in errors), \
        errors
