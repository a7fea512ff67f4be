"""REINFORCE++'s batch normalisation (rlvr/algorithm/reinforce_pp.py, spec §2.4) on its edge cases: no value, a
single value, all-equal values, a spread below 1e-8, values equal to the batch mean; and through
rlvr.credit.assign_credit. (The general z-score and batch_norm=false: tests/algorithm/test_episode_advantages.py.)"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.reinforce_pp import ReinforcePP
from rlvr.credit import assign_credit
from rlvr.transform.none import NoTransform
from rlvr.types import TokenSignals

LOSS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)
RPP = ReinforcePP(LOSS, batch_norm=True)


def normalize(rows, mask=None):
    adv = torch.tensor(rows, dtype=torch.float64)
    return RPP.normalize(adv, torch.ones(adv.shape, dtype=torch.bool) if mask is None else torch.tensor(mask))


def test_no_nonzero_value_leaves_the_step_unchanged():
    # values = [] → n = 0: unchanged; metrics count 0, mean 0, std 0 (as the predecessor reports them)
    out, metrics = normalize([[0.0, 0.0], [0.0, 0.0]])
    assert out.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert metrics == {"batch_adv_count": 0.0, "batch_adv_mean": 0.0, "batch_adv_std": 0.0}


def test_a_single_value_is_centred_to_zero():
    # values = [1.5] → mean 1.5, std 0 < 1e−8 → a − mean = 1.5 − 1.5 = 0; the zeros stay 0
    out, metrics = normalize([[0.0, 0.0, 1.5]])
    assert out.tolist() == [[0.0, 0.0, 0.0]]
    assert metrics == {"batch_adv_count": 1.0, "batch_adv_mean": 1.5, "batch_adv_std": 0.0}


@pytest.mark.parametrize("value", [0.5, -0.25, 3.0])
def test_all_equal_values_are_centred_not_divided(value):
    # values = [v, v, v] → mean v, std 0 < 1e−8 → v − v = 0 each (dividing by std + 1e−8 would also give 0 here,
    # but only the centring is the spec's); the zeros (padding) stay 0
    out, metrics = normalize([[0.0, value, value], [0.0, value, 0.0]])
    assert out.abs().max() == 0
    assert metrics == {"batch_adv_count": 3.0, "batch_adv_mean": value, "batch_adv_std": 0.0}


def test_equal_values_whose_mean_rounds_are_centred_by_the_rounded_mean():
    # float64 [0.1, 0.1, 0.1]: (0.1 + 0.1 + 0.1)/3 = 0.30000000000000004/3 = 0.10000000000000002 ≠ 0.1
    # → std ≈ 1.4e−17 < 1e−8 → a − mean ≈ −1.4e−17 each: what the predecessor's Python arithmetic gives, bit for bit
    out, metrics = normalize([[0.1, 0.1, 0.1]])
    mean = (0.1 + 0.1 + 0.1) / 3
    assert out.tolist() == [[0.1 - mean] * 3] and metrics["batch_adv_mean"] == mean
    assert 0 < abs(0.1 - mean) < 1e-16


def test_a_spread_below_1e_8_is_centred_not_divided():
    # values = [1, 1 + 1e−9] → mean 1 + 5e−10, population std 5e−10 < 1e−8 → a − mean = [−5e−10, +5e−10]
    # (the z-score would give [−0.0476, +0.0476]: 5e−10/(5e−10 + 1e−8))
    out, metrics = normalize([[1.0, 1.0 + 1e-9, 0.0]])
    assert out.tolist()[0] == pytest.approx([-5e-10, 5e-10, 0.0], abs=1e-16)
    assert metrics["batch_adv_std"] == pytest.approx(5e-10, rel=1e-6) and metrics["batch_adv_count"] == 2.0


def test_a_value_equal_to_the_batch_mean_becomes_zero():
    # values = [1, 2, 3] → mean 2, population std sqrt((1 + 0 + 1)/3) = sqrt(2/3) ≈ 0.816497 ≥ 1e−8
    # → (a − 2)/(0.816497 + 1e−8) = [−1.224745, 0, +1.224745]: the token at the mean ends with no signal
    out, metrics = normalize([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    s = math.sqrt(2 / 3)
    assert out.tolist() == [[-1 / (s + 1e-8), 0.0, 0.0], [1 / (s + 1e-8), 0.0, 0.0]]
    assert metrics == {"batch_adv_count": 3.0, "batch_adv_mean": 2.0, "batch_adv_std": pytest.approx(s, abs=1e-15)}


def test_float32_in_float32_out():
    # values = [0.5, −0.5] → mean 0, std 0.5 → ±0.5/(0.5 + 1e−8) ≈ ±0.99999998 (float32: ±1.0)
    out, _ = RPP.normalize(torch.tensor([[0.5, -0.5, 0.0]]), torch.ones(1, 3, dtype=torch.bool))
    assert out.dtype == torch.float32 and out.tolist() == [[1.0, -1.0, 0.0]]


# ---- through the public credit function ----

def signals(lengths: list[int], tokens: int) -> TokenSignals:
    mask = torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]
    return TokenSignals(logprobs_PG_T=torch.full((len(lengths), tokens), -0.5), mask_PG_T=mask,
                        group_size=len(lengths), step=0, correct_rate=0.5)


def test_assign_credit_z_scores_one_token_per_completion():
    # rewards [1, 0, 0, 0] → GRPO [0.75, −0.25, −0.25, −0.25], one token each
    # values: mean 0, population std sqrt((0.5625 + 3·0.0625)/4) = sqrt(0.1875) ≈ 0.433013
    # → 0.75/0.433013 ≈ 1.732051 and −0.25/0.433013 ≈ −0.577350 (the + 1e−8 shifts the 8th digit)
    credit = assign_credit(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), signals([1, 1, 1, 1], 2), RPP, NoTransform())
    s = math.sqrt(0.1875)
    assert credit.adv_PG_T[:, 0].tolist() == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], rel=1e-6)
    assert credit.adv_PG_T[:, 1].abs().max() == 0
    assert credit.metrics["batch_adv_count"] == 4.0 and credit.metrics["batch_adv_std"] == pytest.approx(s)


def test_assign_credit_a_step_with_one_signal_token_trains_nothing():
    # rewards [1, 0] → GRPO [0.5, −0.5]; the second completion is empty, so one token carries a value: 0.5 → centred
    # to 0.5 − 0.5 = 0 (single value); no token is left with a non-zero advantage and the step is skipped
    credit = assign_credit(torch.tensor([[1.0, 0.0]]), signals([1, 0], 2), RPP, NoTransform())
    assert credit.adv_PG_T.abs().max() == 0 and credit.skipped
    assert credit.metrics["batch_adv_count"] == 1.0 and credit.metrics["batch_adv_mean"] == 0.5


# ---- properties ----

VALUES = st.lists(st.lists(st.sampled_from([0.0, 0.0, -1.5, -0.5, 0.25, 1.0, 2.0]), min_size=3, max_size=3),
                  min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(rows=VALUES)
def test_zeros_stay_zero_and_the_values_are_standardised(rows):
    adv = torch.tensor(rows, dtype=torch.float64)
    out, metrics = RPP.normalize(adv, torch.ones(adv.shape, dtype=torch.bool))
    values = adv[adv != 0]
    assert torch.all(out[adv == 0] == 0) and metrics["batch_adv_count"] == values.numel()
    if values.numel() == 0:
        assert torch.equal(out, adv)
        return
    mean, std = values.mean(), values.sub(values.mean()).pow(2).mean().sqrt()
    kept = out[adv != 0]
    assert abs(float(kept.mean())) < 1e-9  # (a − mean), divided or not, averages 0 over the values
    if std >= 1e-8:
        assert float(kept.pow(2).mean().sqrt()) == pytest.approx(float(std / (std + 1e-8)), rel=1e-9)
    else:
        assert torch.allclose(kept, values - mean, atol=0)
