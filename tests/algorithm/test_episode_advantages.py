import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.maxrl import MaxRL
from rlvr.algorithm.reinforce_pp import ReinforcePP

LOSS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)


def test_grpo_subtracts_group_mean_without_std():
    # group 0: [1,0,0,1] → mean 0.5 → [0.5,-0.5,-0.5,0.5]
    # group 1: [1,0,0,0] → mean 0.25 → [0.75,-0.25,-0.25,-0.25]  (no division by std 0.433)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv = GRPO(LOSS).advantages(rewards)
    assert torch.allclose(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]]))


def test_grpo_all_equal_rewards_give_zeros():
    for scale in ("none", "std", "batch_std"):
        assert GRPO(LOSS, scale=scale).advantages(torch.full((2, 4), 0.7)).abs().max() == 0


def test_grpo_scale_std_divides_by_the_groups_sample_std_as_deepseekmath():
    # group 0: [1,0,0,1]: mean 0.5, centred [0.5,-0.5,-0.5,0.5], sample std sqrt(4·0.25/3) = sqrt(1/3) ≈ 0.57735
    #          → ±0.5/(0.57735 + 1e-6) ≈ ±0.86602
    # group 1: [1,0,0,0]: mean 0.25, centred [0.75,-0.25,-0.25,-0.25], sample std sqrt((0.5625+3·0.0625)/3) = 0.5
    #          → [0.75, -0.25, -0.25, -0.25]/(0.5 + 1e-6) ≈ [1.5, -0.5, -0.5, -0.5]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = GRPO(LOSS, scale="std").advantages(rewards)
    s0 = (1 / 3) ** 0.5
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]], dtype=torch.float64)
    expected /= torch.tensor([[s0 + 1e-6], [0.5 + 1e-6]], dtype=torch.float64)
    assert torch.allclose(adv, expected, rtol=0, atol=1e-12)


def test_grpo_scale_batch_std_divides_by_the_steps_reward_std_as_scalerl():
    # the same rewards, 8 values [1,0,0,1,1,0,0,0]: mean 3/8, sample std sqrt((3·(5/8)² + 5·(3/8)²)/7)
    #   = sqrt((75/64 + 45/64)/7) = sqrt(120/448) ≈ 0.51755; each group's centred rewards / (0.51755 + 1e-6)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = GRPO(LOSS, scale="batch_std").advantages(rewards)
    centred = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]], dtype=torch.float64)
    assert torch.allclose(adv, centred / ((120 / 448) ** 0.5 + 1e-6), rtol=0, atol=1e-12)


def test_grpo_scale_of_a_single_completion_is_zero_not_nan():
    # G = 1: r − mean = 0 and a sample std of one value is undefined (taken as 0): 0 / (0 + eps) = 0
    for scale in ("std", "batch_std"):
        assert GRPO(LOSS, scale=scale).advantages(torch.tensor([[1.0]])).tolist() == [[0.0]]


def test_grpo_scale_names_the_setting_when_unknown():
    with pytest.raises(ValueError, match=r"algorithm.scale='group': expected none, std or batch_std"):
        GRPO(LOSS, scale="group")
    with pytest.raises(ValueError, match=r"algorithm.scale_eps=-1.0 must be > 0"):
        GRPO(LOSS, scale="std", scale_eps=-1.0)


def test_maxrl_divides_by_success_rate():
    # 1 correct of 16: μ = 1/16 = 0.0625
    # correct: (1 - 0.0625)/(0.0625 + 1e-6) = 0.9375/0.062501 ≈ 14.99976
    # wrong:   (0 - 0.0625)/(0.0625 + 1e-6) ≈ -0.999984
    rewards = torch.zeros(1, 16)
    rewards[0, 3] = 1.0
    adv = MaxRL(LOSS, eps=1e-6).advantages(rewards.double())
    assert adv[0, 3].item() == pytest.approx(0.9375 / 0.062501, rel=1e-12)
    assert adv[0, 0].item() == pytest.approx(-0.0625 / 0.062501, rel=1e-12)


def test_maxrl_zero_mean_and_negative_mean_give_zeros():
    # all wrong: μ = 0 ≤ eps → zeros;  rewards [-1, 1, -1, -1]: μ = -0.5 ≤ eps → zeros though rewards differ
    algo = MaxRL(LOSS, eps=1e-6)
    assert algo.advantages(torch.zeros(1, 4)).abs().max() == 0
    assert algo.advantages(torch.tensor([[-1.0, 1.0, -1.0, -1.0]])).abs().max() == 0


def test_maxrl_half_correct():
    # [1,1,0,0]: μ = 0.5 → (1-0.5)/0.500001 ≈ 0.999998, (0-0.5)/0.500001 ≈ -0.999998
    adv = MaxRL(LOSS, eps=1e-6).advantages(torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(adv, torch.tensor([[1, 1, -1, -1]], dtype=torch.float64) * 0.5 / 0.500001)


def test_reinforce_pp_group_part_is_grpo():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert torch.equal(ReinforcePP(LOSS, batch_norm=True).advantages(rewards), GRPO(LOSS).advantages(rewards))


def test_reinforce_pp_batch_norm_over_nonzero_tokens():
    # non-zero values: [0.5, 0.5, -0.5, 1.5] → mean 0.5, population std sqrt((0+0+1+1)/4) = sqrt(0.5) ≈ 0.70711
    # normalised: [0, 0, -1.41421, 1.41421]; the zeros (padding, tied groups) stay exactly 0
    adv = torch.tensor([[0.5, 0.5, 0.0], [-0.5, 1.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out, metrics = ReinforcePP(LOSS, batch_norm=True).normalize(adv, mask)
    s = 0.5**0.5
    expected = torch.tensor([[0.0, 0.0, 0.0], [-1.0 / (s + 1e-8), 1.0 / (s + 1e-8), 0.0]], dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1e-12)
    assert metrics == {"batch_adv_count": 4.0, "batch_adv_mean": 0.5, "batch_adv_std": pytest.approx(s)}


def test_reinforce_pp_batch_norm_zero_std_only_centres():
    # all non-zero values equal 2.0: std 0 < 1e-8 → a - mean = 0 for each (zeros stay 0)
    adv = torch.tensor([[2.0, 2.0, 0.0]])
    out, _ = ReinforcePP(LOSS, batch_norm=True).normalize(adv, torch.ones(1, 3, dtype=torch.bool))
    assert out.abs().max() == 0


def test_reinforce_pp_without_batch_norm_is_identity():
    adv = torch.randn(3, 5)
    out, metrics = ReinforcePP(LOSS, batch_norm=False).normalize(adv, torch.ones(3, 5, dtype=torch.bool))
    assert out is adv and metrics == {}
