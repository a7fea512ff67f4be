import pytest
import torch
from hypothesis import given, settings

from rlvr.transform.gtpo import GTPO, gtpo_token_advantages
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import gtpo, mask_of, pad, reference_step, unpad
from tests.transform.transform_cases import StepCase, step_cases


def _run(transform, adv: list[float], logprobs: list[list[float]], group_size: int = 1):
    length = max(1, max(len(r) for r in logprobs))
    signals = TokenSignals(
        pad(logprobs, length, torch.float64), mask_of(logprobs, length), group_size, 0, 0.0
    )
    return transform(torch.tensor(adv, dtype=torch.float64), signals)


def test_table_weights_follow_relative_surprisal():
    # surprisal u = [1, 3] → mean 2; β = 0.1
    # w = 1 + 0.1·(1/(2+1e-8) − 1) ≈ 0.95,  1 + 0.1·(3/(2+1e-8) − 1) ≈ 1.05;  A = 2 → [1.9, 2.1]
    adv, _ = _run(GTPO(beta=0.1, uncertainty="surprisal"), [2.0], [[-1.0, -3.0]])
    assert adv[0].tolist() == pytest.approx([1.9, 2.1], abs=1e-8)


def test_table_weight_clamped_at_zero():
    # u = [0, 0, 30] → mean 10; β = 2: w = 1 + 2·(0/10 − 1) = −1 → 0 (twice),  1 + 2·(30/10 − 1) = 5
    adv, _ = _run(GTPO(beta=2.0, uncertainty="surprisal"), [1.0], [[0.0, 0.0, -30.0]])
    assert adv[0].tolist() == pytest.approx([0.0, 0.0, 5.0], abs=1e-8)


def test_table_surprisal_above_50_is_clipped_before_the_mean():
    # u = [10, min(90, 50) = 50] → mean 30; β = 0.5: w = 1 + 0.5·(10/30 − 1) = 2/3, 1 + 0.5·(50/30 − 1) = 4/3
    adv, _ = _run(GTPO(beta=0.5, uncertainty="surprisal"), [3.0], [[-10.0, -90.0]])
    assert adv[0].tolist() == pytest.approx([2.0, 4.0], abs=1e-7)


def test_beta_zero_broadcasts():
    adv, _ = _run(GTPO(beta=0.0, uncertainty="surprisal"), [1.5], [[-1.0, -9.0, -0.1]])
    assert adv[0].tolist() == [1.5, 1.5, 1.5]


def test_certain_completion_gets_uniform_weights():
    # all logprobs 0 → mean surprisal 0 < 1e-7 → w = 1 (no division by ~0)
    adv, _ = _run(GTPO(beta=0.1, uncertainty="surprisal"), [-1.0], [[0.0, 0.0]])
    assert adv[0].tolist() == [-1.0, -1.0]
    # u = [1e-8, 3e-8] → mean 2e-8 < 1e-7 → w = 1; without the guard w ≈ 1 + 0.1·(u/(2e-8 + 1e-8) − 1)
    adv, _ = _run(GTPO(beta=0.1, uncertainty="surprisal"), [2.0], [[-1e-8, -3e-8]])
    assert adv[0].tolist() == [2.0, 2.0]
    # just above the guard, u = [1e-7, 3e-7] → mean 2e-7
    # → w = 1 + 0.1·([1, 3]e-7/(2e-7 + 1e-8) − 1) ≈ [0.948, 1.043]
    adv, _ = _run(GTPO(beta=0.1, uncertainty="surprisal"), [1.0], [[-1e-7, -3e-7]])
    assert adv[0].tolist() == pytest.approx([1 + 0.1 * (1 / 2.1 - 1), 1 + 0.1 * (3 / 2.1 - 1)], rel=1e-6)


def test_degenerate_rows_empty_and_zero_advantage():
    # row 0 empty (no tokens), row 1 advantage 0 (tied group) → all zeros; padding zeros
    adv, metrics = _run(GTPO(beta=0.1, uncertainty="surprisal"), [0.0, 0.0], [[], [-1.0, -2.0]], group_size=2)
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert metrics == {}  # no group carries signal → no stats (the trainer skips such a step)


def test_constructor_rejects_bad_beta():
    with pytest.raises(ValueError, match="beta=-0.1"):
        GTPO(beta=-0.1, uncertainty="surprisal")
    with pytest.raises(ValueError, match="beta=nan"):
        GTPO(beta=float("nan"), uncertainty="surprisal")


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_matches_the_per_sequence_reference(case: StepCase):
    for kind in ("surprisal", "predictive_variance", "shannon_entropy"):
        ref, ref_metrics = reference_step(
            "gtpo",
            case.adv_PG,
            case.logprobs_PG,
            case.planning_PG,
            case.group_size,
            beta=0.3,
            uncertainty_kind=kind,
            entropies_PG=case.entropies_PG,
        )
        adv, metrics = GTPO(beta=0.3, uncertainty=kind)(case.adv(), case.signals())
        for got, want in zip(unpad(adv, case.logprobs_PG), ref, strict=True):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_mean_weight_is_one_when_nothing_is_clamped(case: StepCase):
    # Σ_t w_t = Σ_t (1 + β(u_t/(μ+1e-8) − 1)) = n + β·n·(μ/(μ+1e-8) − 1)  ⇒  mean w = 1 − β·1e-8/(μ+1e-8) ≈ 1
    beta = 0.4
    signals = case.signals()
    u = (-signals.logprobs_PG_T).clamp(max=50)
    ones = torch.ones(len(case.adv_PG), dtype=torch.float64)
    weights = gtpo_token_advantages(ones, u, signals.mask_PG_T, beta)
    for row, lps in enumerate(case.logprobs_PG):
        n = len(lps)
        if n == 0:
            continue
        w = weights[row, :n]
        mu = u[row, :n].mean().item()
        if mu < 1e-7 or (w == 0).any():
            continue
        assert w.mean().item() == pytest.approx(1 - beta * 1e-8 / (mu + 1e-8), abs=1e-12)


def test_reference_guards_match_spec_table():
    # the reference itself, on retrain's guards: empty → [], β = 0 → [A]·n, mean < 1e-7 → [A]·n
    assert gtpo(1.0, [], 0.1) == []
    assert gtpo(2.0, [1.0, 3.0], 0.0) == [2.0, 2.0]
    assert gtpo(2.0, [0.0, 0.0], 0.1) == [2.0, 2.0]
