import math

import pytest
import torch
from hypothesis import given, settings

from rlvr.transform.entropy_mask import EntropyMask, group_thresholds
from rlvr.transform.gtpo import GTPO
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import entropy_mask_threshold, mask_of, pad, reference_step, unpad
from tests.transform.transform_cases import StepCase, step_cases


def _signals(logprobs, group_size):
    length = max(1, max(len(r) for r in logprobs))
    return TokenSignals(pad(logprobs, length, torch.float64), mask_of(logprobs, length), group_size, 0, 0.0)


def test_table_threshold_is_per_group():
    # group 0: u = [5, 1 | 3, 4] → n = 4, ρ = 0.5 → k = max(1, ⌊4·0.5⌋) = 2
    #          → sorted desc [5, 4, 3, 1] → threshold 4
    #          kept: 5 and 4; masked: 1 and 3 → fraction 2/4
    # group 1: u = [2 | 2, 9] → n = 3 → k = max(1, ⌊1.5⌋) = 1 → threshold 9 → masked 2, 2 → fraction 2/3
    signals = _signals([[-5.0, -1.0], [-3.0, -4.0], [-2.0], [-2.0, -9.0]], group_size=2)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0]).double()
    out, metrics = EntropyMask(beta=0.0, rho=0.5, uncertainty="surprisal")(adv, signals)
    # β = 0 → GTPO is the broadcast A; the mask then zeroes the low-surprisal tokens
    assert out.tolist() == [[1.0, 0.0], [0.0, -1.0], [0.0, 0.0], [0.0, -1.0]]
    # metrics: mean over the two groups of threshold (4 + 9)/2 and fraction (1/2 + 2/3)/2
    assert metrics["entropy_mask_threshold"] == 6.5
    assert metrics["entropy_mask_fraction"] == pytest.approx((0.5 + 2 / 3) / 2)


def test_ties_at_the_threshold_are_all_kept():
    # u = [3, 3, 3, 1], ρ = 0.25 → k = 1 → threshold 3 → all three 3s kept
    out, _ = EntropyMask(beta=0.0, rho=0.25, uncertainty="surprisal")(
        torch.tensor([1.0]).double(), _signals([[-3.0, -3.0, -3.0, -1.0]], group_size=1)
    )
    assert out.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_rho_zero_is_gtpo_without_mask_metrics():
    signals = _signals([[-1.0, -2.0]], group_size=1)
    adv = torch.tensor([1.0]).double()
    out, metrics = EntropyMask(beta=0.1, rho=0.0, uncertainty="surprisal")(adv, signals)
    assert torch.equal(out, GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)[0])
    assert not any(k.startswith("entropy_mask") for k in metrics)


def test_rho_one_keeps_everything():
    signals = _signals([[-1.0, -2.0]], group_size=1)
    adv = torch.tensor([1.0]).double()
    out, metrics = EntropyMask(beta=0.1, rho=1.0, uncertainty="surprisal")(adv, signals)
    assert torch.equal(out, GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)[0])
    assert metrics["entropy_mask_threshold"] == -math.inf and metrics["entropy_mask_fraction"] == 0.0


def test_group_without_tokens_has_threshold_zero():
    # both completions empty → n = 0 → threshold 0.0 (retrain's value)
    assert group_thresholds(
        torch.zeros(2, 3).double(), torch.zeros(2, 3, dtype=torch.bool), 2, 0.5
    ).tolist() == [0.0]
    assert entropy_mask_threshold([], 0.5) == 0.0


def test_rho_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="rho=1.5"):
        EntropyMask(beta=0.1, rho=1.5, uncertainty="surprisal")


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_matches_the_per_sequence_reference(case: StepCase):
    for rho in (0.2, 0.5, 1.0):
        ref, ref_metrics = reference_step(
            "entropy_mask",
            case.adv_PG,
            case.logprobs_PG,
            case.planning_PG,
            case.group_size,
            beta=0.2,
            rho=rho,
        )
        adv, metrics = EntropyMask(beta=0.2, rho=rho, uncertainty="surprisal")(case.adv(), case.signals())
        for got, want in zip(unpad(adv, case.logprobs_PG), ref, strict=True):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert set(ref_metrics) <= set(metrics)
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
