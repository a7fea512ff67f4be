import pytest
import torch

from rlvr.algorithm.ties import tie_metrics, uniform_groups


def test_uniform_groups_within_tolerance():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.5, 0.5 + 5e-7, 0.5]])
    assert uniform_groups(rewards).tolist() == [True, False, True]


def test_tie_metrics():
    # group A [1,1,0,0]: buckets {0,0},{1,1} → 2 unique of 4, tied pairs 1+1 = 2 of 6
    # group B [1,1,1,1]: 1 bucket → uniform, tied pairs 6 of 6
    # group C [0,1,2,3]: 4 unique, no tie
    m = tie_metrics(torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0] * 4, [0.0, 1.0, 2.0, 3.0]]))
    assert m["reward_tie_eligible_groups"] == 3
    assert m["reward_tie_groups"] == 2 and m["reward_uniform_groups"] == 1
    assert m["reward_tie_group_rate"] == pytest.approx(2 / 3)
    assert m["reward_uniform_group_rate"] == pytest.approx(1 / 3)
    assert m["reward_tie_pair_rate"] == pytest.approx((2 + 6 + 0) / 18)
    assert m["reward_unique_fraction_mean"] == pytest.approx((0.5 + 0.25 + 1.0) / 3)


def test_single_sample_groups_are_not_eligible():
    assert tie_metrics(torch.ones(3, 1))["reward_tie_eligible_groups"] == 0
