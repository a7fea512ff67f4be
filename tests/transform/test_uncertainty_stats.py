import pytest
import torch

from rlvr.transform.uncertainty_stats import LEGACY_ALIASES, STAT_NAMES, uncertainty_stats
from tests.transform.retrain_reference import mask_of, pad


def _stats(u_rows, plan_rows, adv, group_size, post_rows=None):
    length = max(1, max(len(r) for r in u_rows))
    u = pad(u_rows, length, torch.float64)
    post = u if post_rows is None else pad(post_rows, length, torch.float64)
    mask = mask_of(u_rows, length)
    plan = None if plan_rows is None else pad(plan_rows, length, torch.float64).bool()
    exec_ = mask if plan is None else mask & ~plan
    return uncertainty_stats(u, post, exec_, plan, torch.tensor(adv).double(), group_size)


def test_table_per_group_then_unweighted_mean_over_groups():
    # group 0 (rows 0-1): exec u = [1, 3, 5] → mean 3, var (4 + 0 + 4)/3 = 8/3
    #                     planning u = [7] → mean 7, var 0
    # group 1 (rows 2-3): exec u = [2] → mean 2, var 0; no planning tokens → left out of the plan average
    # step: exec mean (3 + 2)/2 = 2.5, exec var (8/3 + 0)/2 = 4/3; plan mean 7 (group 0 only), var 0
    stats = _stats([[1, 3, 7], [5], [2], []], [[0, 0, 1], [0], [0], []], [1.0, -1.0, 0.5, -0.5], 2)
    assert stats["exec_surprisal_mean"] == 2.5
    assert stats["exec_surprisal_var"] == pytest.approx(4 / 3)
    assert (stats["plan_surprisal_mean"], stats["plan_surprisal_var"]) == (7.0, 0.0)
    assert stats["post_exec_surprisal_mean"] == 2.5  # no reshaping → post = pre


def test_groups_without_signal_are_left_out():
    # group 1 is tied (advantages 0): its huge u = 40 must not enter the average → exec mean stays 3
    stats = _stats([[1, 5], [3], [40], [40]], None, [1.0, -1.0, 0.0, 0.0], 2)
    assert stats["exec_surprisal_mean"] == 3.0


def test_values_are_clipped_at_50_and_post_is_separate():
    # pre u = [10, 90] → clipped [10, 50] → mean 30, var 400; post u = [30, 30] → mean 30, var 0
    stats = _stats([[10, 90]], None, [1.0], 1, post_rows=[[30, 30]])
    assert (stats["exec_surprisal_mean"], stats["exec_surprisal_var"]) == (30.0, 400.0)
    assert (stats["post_exec_surprisal_mean"], stats["post_exec_surprisal_var"]) == (30.0, 0.0)


def test_names_and_legacy_aliases():
    stats = _stats([[1, 2]], [[0, 1]], [1.0], 1)
    assert set(stats) == set(STAT_NAMES) | set(LEGACY_ALIASES)
    for alias, name in LEGACY_ALIASES.items():
        assert stats[alias] == stats[name]
    # no planning mask → every token exec, plan stats 0
    no_plan = _stats([[1, 2]], None, [1.0], 1)
    assert (no_plan["plan_surprisal_mean"], no_plan["exec_surprisal_mean"]) == (0.0, 1.5)


def test_no_signal_no_stats():
    assert _stats([[1, 2]], None, [0.0], 1) == {}
