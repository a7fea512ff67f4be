import pytest
import torch
from hypothesis import given, settings

from rlvr.transform.gtpo import GTPO
from rlvr.transform.hicra import HICRA
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import mask_of, pad, reference_step, unpad
from tests.transform.transform_cases import StepCase, step_cases


def _signals(logprobs, planning, group_size=1):
    length = max(len(r) for r in logprobs)
    plan = pad([[float(m) for m in r] for r in planning], length, torch.float64).bool()
    return TokenSignals(
        pad(logprobs, length, torch.float64),
        mask_of(logprobs, length),
        group_size,
        0,
        0.0,
        planning_PG_T=plan,
    )


def test_table_planning_tokens_get_alpha_abs_a():
    # u = [1, 3] → GTPO (β = 0.1) ≈ [0.95, 1.05]·A
    # A = +2: [1.9, 2.1]; token 0 is planning → 1.9 + 0.2·1.9 = 2.28
    # A = −2: [−1.9, −2.1]; token 0 is planning → −1.9 + 0.2·1.9 = −1.52 (less blame, not more)
    signals = _signals([[-1.0, -3.0], [-1.0, -3.0]], [[1, 0], [1, 0]], group_size=2)
    adv, metrics = HICRA(beta=0.1, alpha=0.2, uncertainty="surprisal")(
        torch.tensor([2.0, -2.0]).double(), signals
    )
    assert adv.tolist() == [pytest.approx([2.28, 2.1], abs=1e-8), pytest.approx([-1.52, -2.1], abs=1e-8)]
    # 2 planning tokens of 4 completion tokens
    assert metrics["planning_token_fraction"] == 0.5
    # plan stats: planning u = [1, 1] → mean 1, var 0; exec u = [3, 3] → mean 3, var 0
    assert (metrics["plan_surprisal_mean"], metrics["exec_surprisal_mean"]) == (1.0, 3.0)


def test_alpha_zero_is_gtpo_and_no_planning_is_gtpo():
    signals = _signals([[-1.0, -2.0, -4.0]], [[0, 1, 1]])
    adv = torch.tensor([1.5]).double()
    gtpo, _ = GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)
    assert torch.equal(HICRA(beta=0.1, alpha=0.0, uncertainty="surprisal")(adv, signals)[0], gtpo)
    no_plan = _signals([[-1.0, -2.0, -4.0]], [[0, 0, 0]])
    assert torch.equal(HICRA(beta=0.1, alpha=0.2, uncertainty="surprisal")(adv, no_plan)[0], gtpo)


def test_all_planning_completion_is_gtpo_times_one_plus_alpha():
    # A > 0: every token GTPO·(1 + 0.2)
    signals = _signals([[-1.0, -2.0]], [[1, 1]])
    adv = torch.tensor([3.0]).double()
    gtpo, _ = GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)
    hicra, _ = HICRA(beta=0.1, alpha=0.2, uncertainty="surprisal")(adv, signals)
    assert hicra[0].tolist() == pytest.approx((gtpo[0] * 1.2).tolist(), rel=1e-15)


def test_missing_planning_mask_fails():
    signals = _signals([[-1.0]], [[0]])
    bare = TokenSignals(signals.logprobs_PG_T, signals.mask_PG_T, 1, 0, 0.0)
    with pytest.raises(ValueError, match="planning_PG_T"):
        HICRA(beta=0.1, alpha=0.2, uncertainty="surprisal")(torch.tensor([1.0]).double(), bare)


def test_alpha_outside_unit_interval_is_rejected():
    for alpha in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"alpha={alpha}"):
            HICRA(beta=0.1, alpha=alpha, uncertainty="surprisal")


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_only_planning_tokens_differ_from_gtpo(case: StepCase):
    signals = case.signals()
    gtpo, _ = GTPO(beta=0.2, uncertainty="surprisal")(case.adv(), signals)
    hicra, _ = HICRA(beta=0.2, alpha=0.3, uncertainty="surprisal")(case.adv(), signals)
    planning = signals.planning_PG_T & signals.mask_PG_T
    assert torch.equal(hicra[~planning], gtpo[~planning])
    assert torch.equal(hicra[planning], gtpo[planning] + 0.3 * gtpo[planning].abs())


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_matches_the_per_sequence_reference(case: StepCase):
    ref, ref_metrics = reference_step(
        "hicra", case.adv_PG, case.logprobs_PG, case.planning_PG, case.group_size, beta=0.2, alpha=0.3
    )
    adv, metrics = HICRA(beta=0.2, alpha=0.3, uncertainty="surprisal")(case.adv(), case.signals())
    for got, want in zip(unpad(adv, case.logprobs_PG), ref, strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    for name, value in ref_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
