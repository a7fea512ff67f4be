"""Delight (transform=delight, delight_sepa, hard_delight): table tests with the arithmetic written out, the
adaptive η, hard top-k selection, degenerate rows, token advantages, state round trips, knob checks, and the
vectorised code against the per-sequence reference (tests/transform/delight_reference.py)."""

import json
import math

import pytest
import torch
from hypothesis import given, settings

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.credit import assign_credit
from rlvr.transform.delight import Delight, delight_gate
from rlvr.transform.delight_sepa import DelightSEPA
from rlvr.transform.hard_delight import HardDelight
from rlvr.transform.order_stats import highest, kth, lowest
from rlvr.transform.sepa import SEPA
from rlvr.types import TokenSignals
from tests.transform import delight_reference as ref
from tests.transform.retrain_reference import mask_of, pad, unpad
from tests.transform.transform_cases import SCHEDULE, StepCase, schedule, step_cases

ETA = dict(eta=1.0, eta_mode="fixed", eta_min=0.05, eta_max=5.0, eta_target_neutral_frac=0.5,
           eta_target_ordering_gap=0.0, eta_ema_decay=0.0)
# λ = (step − delay)/steps once the gate is open: steps=100, delay=0, gate 0 → λ = step/100
RAMP = dict(steps=100, delay_steps=0, correct_rate_gate=0.0)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def delight(**overrides) -> Delight:
    return Delight(**{"norm": "none", **ETA, **overrides})


def split(overrides: dict) -> tuple[dict, dict]:
    """(the transform's own knobs, the λ schedule's: transform.schedule.*)."""
    return ({k: v for k, v in overrides.items() if k not in SCHEDULE},
            {k: v for k, v in overrides.items() if k in SCHEDULE})


def delight_sepa(**overrides) -> DelightSEPA:
    own, ramp = split(overrides)
    return DelightSEPA(**{"norm": "none", **ETA, **own}, schedule=schedule(**{**RAMP, **ramp}))


def hard(**overrides) -> HardDelight:
    own, ramp = split(overrides)
    return HardDelight(**{"k_frac": 0.2, **own}, schedule=schedule(**{**RAMP, **ramp}))


def signals(surprisals: list[list[float]], group_size: int = 1, step: int = 0, correct_rate: float = 0.0,
            length: int | None = None) -> TokenSignals:
    """Signals whose sampled-token surprisals are `surprisals` (logprob = −s), right-padded."""
    length = length or max(1, max(len(r) for r in surprisals))
    logprobs = [[-x for x in row] for row in surprisals]
    return TokenSignals(pad(logprobs, length, torch.float64), mask_of(logprobs, length), group_size, step,
                        correct_rate)


def rows_near(got: torch.Tensor, want: list[list[float]], tol: float = 1e-12) -> bool:
    return got.tolist() == [pytest.approx(row, abs=tol) for row in want]


def run(transform, adv: list[float], surprisals: list[list[float]], group_size: int = 1, **kwargs):
    return transform(torch.tensor(adv, dtype=torch.float64), signals(surprisals, group_size, **kwargs))


# ---- the gate -------------------------------------------------------------------------------------------


def test_table_delight_gates_surprise_in_the_direction_of_the_advantage():
    # s = [0.1, 2.0], η = 1, norm none
    # A = +1: gate = [σ(0.1), σ(2.0)] = [0.52498, 0.88080] → A' = [0.52498, 0.88080] (surprising tokens credited)
    # A = −1: gate = [σ(−0.1), σ(−2.0)] = [0.47502, 0.11920] → A' = [−0.47502, −0.11920] (blame on the expected)
    adv, metrics = run(delight(), [1.0, -1.0], [[0.1, 2.0], [0.1, 2.0]], group_size=2)
    assert rows_near(adv, [[sigmoid(0.1), sigmoid(2.0)], [-sigmoid(-0.1), -sigmoid(-2.0)]])
    assert metrics["dg_gate_mean_pos"] == pytest.approx((sigmoid(0.1) + sigmoid(2.0)) / 2)
    assert metrics["dg_gate_mean_neg"] == pytest.approx((sigmoid(-0.1) + sigmoid(-2.0)) / 2)
    # 0.88080 > 0.8: 1 breakthrough of 4 gated tokens; 0.11920 < 0.2: 1 suppressed; 0.52498, 0.47502 neutral
    assert (metrics["dg_breakthrough_frac"], metrics["dg_suppressed_frac"], metrics["dg_neutral_frac"]) == (
        0.25, 0.25, 0.5)
    assert (metrics["dg_gate_min"], metrics["dg_gate_max"]) == (sigmoid(-2.0), sigmoid(2.0))
    assert metrics["dg_lambda"] == 1.0 and metrics["dg_eta"] == 1.0 and metrics["dg_eta_adaptive"] == 0.0


def test_table_eta_softens_the_gate():
    # A = 2, s = [1.5], η = 3: σ(2·1.5/3) = σ(1) = 0.73106 → A' = 1.46212
    adv, _ = run(delight(eta=3.0), [2.0], [[1.5]])
    assert adv[0].tolist() == pytest.approx([2 * sigmoid(1.0)])


def test_table_the_gate_saturates_beyond_twenty():
    # A·s/η = 25 > 20 → exactly 1; −25 → exactly 0; 19.9 → σ(19.9) = 1 − 2.3e-9 (not saturated)
    adv, _ = run(delight(), [1.0, -1.0], [[25.0, 19.9], [25.0, 19.9]], group_size=2)
    assert adv[0, 0].item() == 1.0 and adv[1, 0].item() == 0.0
    assert adv[0, 1].item() == sigmoid(19.9) < 1.0 and adv[1, 1].item() == -sigmoid(-19.9)
    for dtype in (torch.float32, torch.float64):
        logit = torch.tensor([-20.5, -20.0, 0.0, 20.0, 20.5, 1e4], dtype=dtype)
        gate = delight_gate(logit.clone())
        assert gate[[0, 4, 5]].tolist() == [0.0, 1.0, 1.0]
        assert gate[[1, 2, 3]].tolist() == torch.sigmoid(logit[[1, 2, 3]]).tolist()


def test_table_scale_divides_by_the_population_std():
    # s = [1, 5]: mean 3, population std 2 (no centring) → s̃ = [0.5, 2.5]; A = 1, η = 1
    # → [σ(0.5), σ(2.5)] = [0.62246, 0.92414]
    adv, _ = run(delight(norm="scale"), [1.0], [[1.0, 5.0]])
    assert adv[0].tolist() == pytest.approx([sigmoid(0.5), sigmoid(2.5)], abs=1e-12)
    # n < 2 or std < 1e-8 → unchanged: s = [3] → σ(3); s = [2, 2] → σ(2) twice
    adv, _ = run(delight(norm="scale"), [1.0, 1.0], [[3.0], [2.0, 2.0]], group_size=2)
    assert rows_near(adv, [[sigmoid(3.0), 0.0], [sigmoid(2.0), sigmoid(2.0)]])


def test_table_mad_scale_and_its_fallback_to_scale():
    # s = [1, 2, 4, 10]: median (2 + 4)/2 = 3; |s − 3| = [2, 1, 1, 7] → median (1 + 2)/2 = 1.5
    # MAD scale = 1.4826·1.5 = 2.2239 → s̃ = [0.44966, 0.89932, 1.79864, 4.49661]; A = 0.5, η = 2
    # → gate σ(0.5·s̃/2) = [0.52810, 0.55597, 0.61056, 0.75476]; A' = 0.5·gate
    mad = 1.4826 * 1.5
    adv, _ = run(delight(norm="mad_scale", eta=2.0), [0.5], [[1.0, 2.0, 4.0, 10.0]])
    assert adv[0].tolist() == pytest.approx([0.5 * sigmoid(0.25 * x / mad) for x in (1, 2, 4, 10)], abs=1e-12)
    # s = [1, 1, 1, 5]: median 1, |s − 1| = [0, 0, 0, 4] → MAD 0 < 1e-8 → scale: mean 2, std √3 = 1.73205
    # → s̃ = [0.57735, 0.57735, 0.57735, 2.88675] → gate [0.64046, 0.64046, 0.64046, 0.94719]
    adv, _ = run(delight(norm="mad_scale"), [1.0], [[1.0, 1.0, 1.0, 5.0]])
    assert adv[0].tolist() == pytest.approx([sigmoid(x / math.sqrt(3)) for x in (1, 1, 1, 5)], abs=1e-12)
    # odd count: s = [1, 3, 8]: median 3; |s − 3| = [2, 0, 5] → median 2 → scale 2.9652 → s̃ = s/2.9652
    adv, _ = run(delight(norm="mad_scale"), [1.0], [[1.0, 3.0, 8.0]])
    assert adv[0].tolist() == pytest.approx([sigmoid(x / (1.4826 * 2)) for x in (1, 3, 8)], abs=1e-12)


def test_table_delight_sepa_blends_the_gate_by_lambda():
    # s = [0.1, 2.0], A = 1, η = 1, λ = 0.5 (step 50 of the ramp step/100)
    # → 0.5 + 0.5·[0.52498, 0.88080] = [0.76249, 0.94040]
    adv, metrics = run(delight_sepa(), [1.0], [[0.1, 2.0]], step=50)
    assert adv[0].tolist() == pytest.approx([0.5 + 0.5 * sigmoid(0.1), 0.5 + 0.5 * sigmoid(2.0)], abs=1e-12)
    assert metrics["dg_lambda"] == metrics["sepa_lambda"] == 0.5 and metrics["sepa_gate_open"] == 1.0
    # λ = 0 (step 0): 1 − 0 + 0·σ = 1 exactly → plain A on every token, padding 0
    adv, metrics = run(delight_sepa(), [-1.5, 2.0], [[0.1, 2.0], [7.0]], group_size=2, step=0)
    assert adv.tolist() == [[-1.5, -1.5], [2.0, 0.0]] and metrics["dg_net_advantage_bias"] == 0.0
    # λ = 1 is delight; fixed_lambda overrides the controller (which still reports its own λ)
    adv, metrics = run(delight_sepa(fixed_lambda=1.0), [1.0], [[0.1, 2.0]], step=30)
    assert adv.tolist() == run(delight(), [1.0], [[0.1, 2.0]])[0].tolist()
    assert (metrics["dg_lambda"], metrics["sepa_lambda"]) == (1.0, 0.3)


def test_table_ordering_gap_and_advantage_metrics():
    # one group, s = [0.1, 2.0, 0.5] for both rows, A = [+1, −1], η = 1 (n = 3: lower half = 1 token)
    # A = +1: gates [0.52498, 0.88080, 0.62246]; lower = {s 0.1}; upper = {2.0, 0.5}
    #         gap = (0.88080 + 0.62246)/2 − 0.52498 = 0.22665
    # A = −1: ranked by −s; gates [0.47502, 0.11920, 0.37754]; lower = {s 2.0}; upper = {0.1, 0.5}
    #         gap = (0.47502 + 0.37754)/2 − 0.11920 = 0.30708 (= "top half minus bottom half", negated)
    adv, m = run(delight(), [1.0, -1.0], [[0.1, 2.0, 0.5], [0.1, 2.0, 0.5]], group_size=2)
    pos = [sigmoid(x) for x in (0.1, 2.0, 0.5)]
    neg = [sigmoid(-x) for x in (0.1, 2.0, 0.5)]
    gap_pos, gap_neg = (pos[1] + pos[2]) / 2 - pos[0], (neg[0] + neg[2]) / 2 - neg[1]
    assert (m["dg_gate_ordering_gap_pos"], m["dg_gate_ordering_gap_neg"]) == pytest.approx((gap_pos, gap_neg))
    assert m["dg_gate_ordering_gap"] == pytest.approx((gap_pos + gap_neg) / 2)
    # bias = Σ A' − Σ A·n = (0.52498 + 0.88080 + 0.62246) − (0.47502 + 0.11920 + 0.37754) − (3 − 3) = 1.05648
    assert m["dg_net_advantage_bias"] == pytest.approx(sum(pos) - sum(neg))
    assert m["dg_net_advantage_bias_per_token"] == pytest.approx((sum(pos) - sum(neg)) / 6)
    gates = pos + neg
    mean = sum(gates) / 6
    assert m["dg_gate_mean"] == pytest.approx(mean)
    assert m["dg_gate_std"] == pytest.approx(math.sqrt(sum((g - mean) ** 2 for g in gates) / 6))
    new = pos + [-g for g in neg]
    assert m["dg_token_adv_std"] == pytest.approx(math.sqrt(sum((x - sum(new) / 6) ** 2 for x in new) / 6))
    row_var = [sum((x - sum(r) / 3) ** 2 for x in r) / 3 for r in (pos, [-g for g in neg])]
    assert m["dg_within_rollout_adv_var"] == pytest.approx(sum(row_var) / 2)


def test_ties_across_the_halves_go_to_the_lower_half_by_position():
    # s = [1, 1, 1, 3], A = 1: lower half = 2 of the three s = 1 tokens → gap = (σ(1) + σ(3))/2 − σ(1)
    _, m = run(delight(), [1.0], [[1.0, 1.0, 1.0, 3.0]])
    assert m["dg_gate_ordering_gap"] == pytest.approx((sigmoid(3.0) - sigmoid(1.0)) / 2)


# ---- adaptive η -----------------------------------------------------------------------------------------


def adaptive(**overrides) -> Delight:
    return delight(eta_mode="adaptive", **overrides)


def test_table_adaptive_eta_is_a_quantile_of_the_magnitudes():
    # one group: A = [1, −1], s = [0.2, 0.4] and [1.0, 3.0] → |A·s| = [0.2, 0.4, 1.0, 3.0]
    # quantile 0.5: x = 0.5·(4 − 1) = 1.5 → 0.4 + 0.5·(1.0 − 0.4) = 0.7 → η = 0.7 / ln 1.5 = 1.72641
    # (in [0.05, 5]); gates σ(0.2/η) = 0.52893, σ(0.4/η) = 0.55767, σ(−1/η) = 0.35911, σ(−3/η) = 0.14960
    eta = 0.7 / math.log(1.5)
    transform = adaptive()
    adv, m = run(transform, [1.0, -1.0], [[0.2, 0.4], [1.0, 3.0]], group_size=2)
    assert (m["dg_eta"], m["dg_eta_raw"], m["dg_eta_adaptive"]) == pytest.approx((eta, eta, 1.0))
    assert rows_near(adv, [[sigmoid(0.2 / eta), sigmoid(0.4 / eta)], [-sigmoid(-1 / eta), -sigmoid(-3 / eta)]])
    assert "dg_eta_prev" not in m and transform.state_dict()["eta_prev"] == pytest.approx(eta)


def test_adaptive_eta_puts_the_quantile_token_on_the_neutral_edge():
    # |A·s| = [1, 2, 3]: median 2 → η = 2/ln 1.5 → the middle token's gate is σ(ln 1.5) = 1.5/2.5 = 0.6
    adv, _ = run(adaptive(), [1.0], [[1.0, 2.0, 3.0]])
    assert adv[0, 1].item() == pytest.approx(0.6, abs=1e-15)


def test_table_adaptive_eta_is_clamped_and_reports_the_raw_value():
    # |A·s| = [10, 20] → quantile 15 → raw 15/ln 1.5 = 36.995 → clamped to eta_max = 5
    _, m = run(adaptive(), [2.0], [[5.0, 10.0]])
    assert m["dg_eta"] == 5.0 and m["dg_eta_raw"] == pytest.approx(15 / math.log(1.5))
    # |A·s| = [0.001] → raw 0.00247 → eta_min = 0.05
    _, m = run(adaptive(), [1.0], [[0.001]])
    assert m["dg_eta"] == 0.05


def test_table_ordering_gap_correction():
    # A = 1, s = [1, 3]: |A·s| = [1, 3] → quantile 2 → η₁ = 2/ln 1.5 = 4.93261
    # gap at η₁ = σ(3/η₁) − σ(1/η₁) = 0.64755 − 0.55063 = 0.09692 < target 0.2
    # → η₂ = η₁·max(0.09692/0.2, 0.25) = 4.93261·0.48461 = 2.39038
    eta_1 = 2 / math.log(1.5)
    gap = sigmoid(3 / eta_1) - sigmoid(1 / eta_1)
    _, m = run(adaptive(eta_target_ordering_gap=0.2), [1.0], [[1.0, 3.0]])
    assert m["dg_eta"] == pytest.approx(eta_1 * gap / 0.2)
    # target 0.9: gap/target = 0.10769 < 0.25 → η₂ = 0.25·η₁ = 1.23315
    _, m = run(adaptive(eta_target_ordering_gap=0.9), [1.0], [[1.0, 3.0]])
    assert m["dg_eta"] == pytest.approx(0.25 * eta_1)
    # the gap already above the target: unchanged
    _, m = run(adaptive(eta_target_ordering_gap=0.05), [1.0], [[1.0, 3.0]])
    assert m["dg_eta"] == pytest.approx(eta_1)


def test_table_eta_ema_with_the_previous_step():
    # step 1: |A·s| = [1, 3] → η = 2/ln 1.5 = 4.93261 (no previous η: no EMA)
    # step 2: |A·s| = [0.5, 1.5] → η₂ = 1/ln 1.5 = 2.46630; d = 0.75 → 0.75·4.93261 + 0.25·2.46630 = 4.31603
    transform = adaptive(eta_ema_decay=0.75)
    _, m1 = run(transform, [1.0], [[1.0, 3.0]])
    _, m2 = run(transform, [1.0], [[0.5, 1.5]])
    assert m1["dg_eta"] == pytest.approx(2 / math.log(1.5)) and "dg_eta_prev" not in m1
    assert m2["dg_eta_prev"] == m1["dg_eta"]
    assert m2["dg_eta"] == pytest.approx(0.75 * 2 / math.log(1.5) + 0.25 / math.log(1.5))
    assert m2["dg_eta_raw"] == pytest.approx(1 / math.log(1.5))


def test_eta_stays_in_its_bounds_after_the_ema_a_departure_from_retrain():
    # η_prev = 10 (e.g. from a checkpoint written with eta_max 20), d = 0.5, this step's η₂ = 4.93261:
    # retrain: 0.5·10 + 0.5·4.93261 = 7.46630 > eta_max 5; here clamped to 5
    transform = adaptive(eta_ema_decay=0.5)
    transform.load_state_dict({"transform": "delight", "eta_prev": 10.0})
    _, m = run(transform, [1.0], [[1.0, 3.0]])
    assert m["dg_eta"] == 5.0 and m["dg_eta_prev"] == 10.0


def test_eta_is_per_group_and_the_state_is_their_mean():
    # group 0: |A·s| = [1, 3] → η = 2/ln 1.5; group 1: |A·s| = [0.5] → η = 0.5/ln 1.5; group 2 ties (A = 0)
    # dg_eta = mean over the groups with signal = 1.25/ln 1.5 = 3.08288; that is the next step's η_prev
    transform = adaptive()
    adv, m = run(transform, [1.0, 0.0, -0.5, 0.0, 0.0, 0.0], [[1.0, 3.0], [], [1.0], [2.0], [1.0], [4.0]],
                 group_size=2)
    assert m["dg_eta"] == pytest.approx(1.25 / math.log(1.5)) == transform.state_dict()["eta_prev"]
    assert adv[2, 0].item() == pytest.approx(-0.5 * sigmoid(-0.5 / (0.5 / math.log(1.5))))  # σ(−ln 1.5) = 0.4
    assert adv[3:].abs().sum().item() == 0.0


def test_a_group_without_magnitudes_takes_the_previous_eta():
    # the only non-zero advantage sits on an empty completion: no |A·s| → η = clamp(η_prev), no raw value
    transform = adaptive()
    transform.load_state_dict({"transform": "delight", "eta_prev": 0.7})
    _, m = run(transform, [1.0, 0.0], [[], [1.0]], group_size=2)
    assert m["dg_eta"] == 0.7 and "dg_eta_raw" not in m and "dg_gate_mean" not in m


# ---- hard_delight ---------------------------------------------------------------------------------------

S10 = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0]


def test_table_hard_delight_keeps_the_top_k_by_surprisal_for_positive_advantages():
    # n = 10, k_frac 0.2 → k = 2; A > 0 keeps the two largest s: 9 (position 5) and 6 (position 7); λ = 1
    adv, m = run(hard(fixed_lambda=1.0), [2.0], [S10])
    assert adv[0].nonzero().flatten().tolist() == [5, 7] and adv[0, [5, 7]].tolist() == [2.0, 2.0]
    assert (m["hard_dg_active_frac"], m["hard_dg_k_frac"], m["hard_dg_lambda"]) == (0.2, 0.2, 1.0)
    assert m["hard_dg_net_bias"] == 2 * 2 - 2 * 10  # Σ A' − Σ A·n = 4 − 20


def test_table_hard_delight_keeps_the_least_surprising_for_negative_advantages():
    # A < 0 keeps the two smallest s: the two s = 1 (positions 1 and 3); λ = 0.5 (step 50):
    # kept −1·(0.5 + 0.5) = −1, others −1·0.5 = −0.5
    adv, m = run(hard(), [-1.0], [S10], step=50)
    expected = [-0.5] * 10
    expected[1] = expected[3] = -1.0
    assert adv[0].tolist() == expected and m["hard_dg_lambda"] == 0.5 and m["sepa_lambda"] == 0.5


def test_hard_delight_ties_and_small_completions():
    # s = [2, 2, 2, 2, 2], k_frac 0.5 → k = ⌊2.5⌋ = 2: the earliest two tied tokens (a stable sort's order)
    adv, _ = run(hard(k_frac=0.5, fixed_lambda=1.0), [1.0, -1.0], [[2.0] * 5, [2.0] * 5], group_size=2)
    assert adv.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, 0.0, 0.0, 0.0]]
    # n = 3, k_frac 0.2 → k = max(1, ⌊0.6⌋) = 1; k_frac 0 → k = 1 too
    for k_frac in (0.2, 0.0):
        adv, _ = run(hard(k_frac=k_frac, fixed_lambda=1.0), [1.0], [[0.5, 7.0, 2.0]])
        assert adv[0].tolist() == [0.0, 1.0, 0.0]
    # λ = 0 (step 0 of the ramp): plain A
    adv, _ = run(hard(), [3.0], [[0.5, 7.0, 2.0]])
    assert adv[0].tolist() == [3.0, 3.0, 3.0]


# ---- degenerate inputs, padding, token advantages -------------------------------------------------------


ALL = [delight, lambda: delight(norm="scale"), lambda: delight(norm="mad_scale"), lambda: adaptive(
    eta_target_ordering_gap=0.3, eta_ema_decay=0.5), lambda: delight_sepa(fixed_lambda=0.6), lambda: hard(
    fixed_lambda=0.7)]


@pytest.mark.parametrize("make", ALL)
def test_zero_advantages_and_empty_completions_give_zeros_and_padding_is_zero(make):
    # group 0 ties (A = 0); group 1: an empty completion and A = 0.5 on 1 token; length 4 → padding everywhere
    adv, metrics = run(make(), [0.0, 0.0, 1.5, 0.5], [[1.0, 2.0], [3.0], [], [0.7]], group_size=2, step=60,
                       length=4)
    assert adv[:3].abs().sum().item() == 0.0 and adv[3, 1:].tolist() == [0.0, 0.0, 0.0]
    assert adv[3, 0].item() > 0
    _, none = run(make(), [0.0, 0.0], [[1.0, 2.0], [3.0]], group_size=2)
    # no group with signal: no Delight metrics, no uncertainty statistics
    assert not any(k.startswith(("dg_", "hard_dg_", "exec_", "plan_", "post_")) for k in none)


@pytest.mark.parametrize("make", [lambda: delight(norm="scale"), lambda: delight_sepa(fixed_lambda=0.5),
                                  lambda: hard(fixed_lambda=1.0)])
def test_table_each_arm_reports_the_uncertainty_statistics_of_the_surprisal(make):
    # group 0: s = [1, 3] and [2] (A = +1, −1) → mean 2, population var ((1 − 2)² + (3 − 2)² + 0²)/3 = 2/3;
    # group 1: s = [60] (clipped at 50) and [4] (A = 0.5, 0) → mean 27, var 23² = 529; group 2 ties (A = 0): left out.
    # Step values: the mean over the counted groups, (2 + 27)/2 = 14.5 and (2/3 + 529)/2. Delight reads no planning
    # mask, so every token is exec and plan_* is 0; post = pre; the legacy names alias them. They are statistics
    # of s itself: norm = scale, which divides s for the gate, leaves them alone.
    _, m = run(make(), [1.0, -1.0, 0.5, 0.0, 0.0, 0.0], [[1.0, 3.0], [2.0], [60.0], [4.0], [9.0], [7.0]],
               group_size=2)
    want = {"exec_surprisal_mean": 14.5, "exec_surprisal_var": (2 / 3 + 529) / 2, "plan_surprisal_mean": 0.0,
            "plan_surprisal_var": 0.0}
    want |= {f"post_{k}": v for k, v in want.items()} | {k.replace("surprisal", "entropy"): v for k, v in want.items()}
    assert {k: m.get(k) for k in want} == pytest.approx(want, rel=1e-12)


def token_signals(case: StepCase) -> tuple[torch.Tensor, TokenSignals]:
    return case.turn_adv(), case.signals(step=60, correct_rate=0.5)


@pytest.mark.parametrize("make", ALL)
def test_token_advantages_equal_to_the_episode_ones_give_the_same_result(make):
    # [P·G, T] advantages that repeat each completion's A on its tokens (0 at padding) are the episode case
    case = StepCase(group_size=2, length=4, adv_PG=[1.0, -0.5, 0.0, 0.0],
                    logprobs_PG=[[-1.0, -0.2, -3.0], [-0.5, -2.5, -0.1, -4.0], [-1.0], []],
                    entropies_PG=[[0.0] * 3, [0.0] * 4, [0.0], []], planning_PG=[[0] * 3, [0] * 4, [0], []])
    broadcast = case.adv()[:, None] * case.signals().mask_PG_T
    episode, m_episode = make()(case.adv(), case.signals(step=60))
    token, m_token = make()(broadcast, case.signals(step=60))
    assert torch.allclose(token, episode, rtol=0, atol=1e-15)
    assert m_token.keys() == m_episode.keys()
    assert all(m_token[k] == pytest.approx(m_episode[k], rel=1e-12, abs=1e-15) for k in m_episode)


def test_table_token_advantages_are_gated_with_their_own_a_t():
    # one completion, s = [1, 2, 1, 3], per-token A = [1, 1, −2, 0] (two turns and an unscored token)
    # delight, η = 1: [1·σ(1), 1·σ(2), −2·σ(−2), 0] = [0.73106, 0.88080, −0.23841, 0]
    adv_T = torch.tensor([[1.0, 1.0, -2.0, 0.0]], dtype=torch.float64)
    out, m = delight()(adv_T, signals([[1.0, 2.0, 1.0, 3.0]]))
    assert out[0].tolist() == pytest.approx([sigmoid(1), sigmoid(2), -2 * sigmoid(-2), 0.0], abs=1e-12)
    assert m["dg_gate_mean"] == pytest.approx((sigmoid(1) + sigmoid(2) + sigmoid(-2)) / 3)  # 3 gated tokens
    # units: A > 0 tokens {s 1, 2} → gap σ(2) − σ(1); the A < 0 token alone (n = 1) has no gap
    assert m["dg_gate_ordering_gap"] == m["dg_gate_ordering_gap_pos"] == pytest.approx(sigmoid(2) - sigmoid(1))
    assert "dg_gate_ordering_gap_neg" not in m
    # hard, k_frac 0.5, λ = 1: A > 0 tokens (n₊ = 2, k = 1) keep s = 2; A < 0 tokens (n₋ = 1, k = 1) keep the one
    out, m = hard(k_frac=0.5, fixed_lambda=1.0)(adv_T, signals([[1.0, 2.0, 1.0, 3.0]]))
    assert out[0].tolist() == [0.0, 1.0, -2.0, 0.0] and m["hard_dg_active_frac"] == 2 / 3


# ---- against the per-sequence reference -----------------------------------------------------------------


def close(got: dict[str, float], want: dict[str, float], skip: tuple[str, ...] = ()) -> list[str]:
    """Metric names that differ (keys compared exactly, values to 1e-9)."""
    bad = sorted(set(got) ^ set(want))
    return bad + [k for k in want if k in got and k not in skip
                  and not math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-12)]


VARIANTS = [  # (rlvr transform, reference η, norm, λ); two steps each, so η_prev and the EMA are exercised
    (lambda: delight(), lambda: ref.Eta(), "none", None),
    (lambda: delight(norm="scale", eta=0.7), lambda: ref.Eta(eta=0.7), "scale", None),
    (lambda: delight(norm="mad_scale"), lambda: ref.Eta(), "mad_scale", None),
    (lambda: adaptive(norm="scale", eta_target_ordering_gap=0.3, eta_ema_decay=0.5),
     lambda: ref.Eta(mode="adaptive", gap=0.3, ema=0.5), "scale", None),
    (lambda: adaptive(eta_target_neutral_frac=0.3, eta_max=2.0), lambda: ref.Eta(mode="adaptive", neutral=0.3,
                                                                                 eta_max=2.0), "none", None),
    (lambda: delight_sepa(fixed_lambda=0.4), lambda: ref.Eta(), "none", 0.4),
]


@settings(max_examples=60, deadline=None)
@given(step_cases())
def test_matches_the_reference(case: StepCase):
    logprobs = case.logprobs_PG
    for make, make_eta, norm, lam in VARIANTS:
        transform, eta = make(), make_eta()
        for adv_PG, as_tensor in ((case.adv_PG, case.adv()), (unpad(case.turn_adv(), logprobs), case.turn_adv())):
            for _ in range(2):
                got, metrics = transform(as_tensor, case.signals(step=40))
                want, want_metrics = ref.delight_step(adv_PG, logprobs, case.group_size, norm=norm, eta=eta, lam=lam)
                for row, expected in zip(unpad(got, logprobs), want, strict=True):
                    assert row == pytest.approx(expected, rel=1e-9, abs=1e-12)
                # adaptive η puts the quantile token's gate on the neutral band's edge (σ(ln 1.5) = 0.6), where
                # torch's and math's sigmoid may round to either side
                skip = ("dg_neutral_frac",) if eta.mode == "adaptive" else ()
                assert not close({k: v for k, v in metrics.items() if not k.startswith("sepa_")}, want_metrics, skip)
    for k_frac, lam in ((0.2, 1.0), (0.5, 0.3), (0.0, 0.8)):
        for adv_PG, as_tensor in ((case.adv_PG, case.adv()), (unpad(case.turn_adv(), logprobs), case.turn_adv())):
            got, metrics = hard(k_frac=k_frac, fixed_lambda=lam)(as_tensor, case.signals())
            want, want_metrics = ref.hard_delight_step(adv_PG, logprobs, case.group_size, k_frac=k_frac, lam=lam)
            for row, expected in zip(unpad(got, logprobs), want, strict=True):
                assert row == pytest.approx(expected, rel=1e-12, abs=1e-15)
            assert not close({k: v for k, v in metrics.items() if not k.startswith("sepa_")}, want_metrics)


# ---- the selections without sorting ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(step_cases(max_len=12))
def test_order_statistics_match_sorting(case: StepCase):
    signals_ = case.signals()
    values = -signals_.logprobs_PG_T
    valid = signals_.mask_PG_T.double()
    positions = [[t for t in range(values.shape[1]) if signals_.mask_PG_T[r, t]] for r in range(values.shape[0])]
    n = [len(p) for p in positions]
    half = torch.tensor([m // 2 for m in n])
    top = torch.tensor([max(1, m // 3) if m else 0 for m in n])
    middle = torch.tensor([(m + 1) // 2 for m in n])
    got_half = kth(values, valid, half)
    got_low, got_high = lowest(values, valid, half), highest(values, valid, top)
    got_middle, got_next = kth(values, valid, middle, with_next=True)
    for r, row in enumerate(positions):
        ordered = sorted(values[r, t].item() for t in row)
        if half[r]:
            assert got_half[r].item() == ordered[half[r] - 1]
        if middle[r]:
            assert got_middle[r].item() == ordered[middle[r] - 1]
            if middle[r] < n[r]:
                assert got_next[r].item() == ordered[middle[r]]
        low = sorted(row, key=lambda t, r=r: values[r, t].item())[: half[r]]  # stable: earliest first among ties
        high = sorted(row, key=lambda t, r=r: values[r, t].item(), reverse=True)[: top[r]]
        assert got_low[r].nonzero().flatten().tolist() == sorted(low)
        assert got_high[r].nonzero().flatten().tolist() == sorted(high)


def test_the_torch_kthvalue_path_gives_the_numpy_one(monkeypatch):
    # GPU tensors select with torch.kthvalue instead of numpy: the same values and masks (forced here on CPU)
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 6, (16, 12), generator=gen).double()  # many ties
    valid = (torch.arange(12)[None, :] < torch.randint(0, 13, (16, 1), generator=gen)).double()
    n = valid.sum(-1).long()
    wanted = [kth(values, valid, (n + 1) // 2, with_next=True), lowest(values, valid, n // 2),
              highest(values, valid, (n * 0.3).floor().clamp(min=1).long() * (n > 0))]
    from rlvr.transform import order_stats

    monkeypatch.setattr(order_stats, "on_numpy", lambda tensor: False)
    got = [kth(values, valid, (n + 1) // 2, with_next=True), lowest(values, valid, n // 2),
           highest(values, valid, (n * 0.3).floor().clamp(min=1).long() * (n > 0))]
    middle = (n + 1) // 2 > 0
    following = (n + 1) // 2 < n
    assert torch.equal(got[0][0][middle], wanted[0][0][middle])
    assert torch.equal(got[0][1][following], wanted[0][1][following])
    assert torch.equal(got[1], wanted[1]) and torch.equal(got[2], wanted[2])


def test_ranks_that_cannot_share_one_selection_are_refused():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    valid = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert kth(values, valid, torch.tensor([4, 1])).tolist() == [4.0, 5.0]
    with pytest.raises(ValueError, match="outside"):
        kth(values, valid, torch.tensor([1, 2]))
    full = torch.ones(2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="cannot share"):  # both rows full: ranks 4 and 1 leave no padding to shift
        kth(values, full, torch.tensor([4, 1]))


# ---- state ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ALL)
def test_state_round_trips_through_json_and_resumes_exactly(make):
    case = StepCase(group_size=2, length=3, adv_PG=[1.0, -1.0, 0.5, -0.5],
                    logprobs_PG=[[-1.0, -0.3], [-2.0, -0.1, -0.7], [-0.4], [-3.0, -1.0]],
                    entropies_PG=[[0.0] * 2, [0.0] * 3, [0.0], [0.0] * 2], planning_PG=[[0] * 2, [0] * 3, [0], [0] * 2])
    whole = make()
    for step in (0, 1):
        whole(case.adv(), case.signals(step=step, correct_rate=0.5))
    state = json.loads(json.dumps(whole.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == whole.state_dict()
    want, want_m = whole(case.adv(), case.signals(step=2, correct_rate=0.5))
    got, got_m = resumed(case.adv(), case.signals(step=2, correct_rate=0.5))
    assert torch.equal(got, want) and got_m == want_m


def test_delight_sepa_state_carries_the_controller():
    transform = delight_sepa(correct_rate_gate=0.5)
    run(transform, [1.0], [[1.0]], correct_rate=0.7)
    state = transform.state_dict()
    assert state["transform"] == "delight_sepa" and state["sepa"]["gate_open"] is True and state["eta_prev"] == 1.0


@pytest.mark.parametrize(("make", "state", "match"), [
    (delight, {}, "written by another transform"),
    (delight, {"transform": "delight_sepa", "eta_prev": 1.0, "sepa": {}}, "transform=delight_sepa"),
    (delight_sepa, {"transform": "delight", "eta_prev": 1.0}, "into transform=delight_sepa"),
    (hard, SEPA(beta=0.1, uncertainty="surprisal", schedule=schedule(**RAMP)).state_dict(),
     "into transform=hard_delight"),
    (delight, {"transform": "delight", "eta_prev": -1.0}, "eta_prev"),
])
def test_a_state_of_another_transform_is_refused(make, state, match):
    with pytest.raises(ValueError, match=match):
        make().load_state_dict(state)


# ---- knobs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "knob", "value"), [
    (delight, "norm", "zscore"), (delight, "eta", 0.0), (delight, "eta", "1.0"), (delight, "eta", True),
    (delight, "eta_mode", "auto"), (delight, "eta_min", 0.0), (delight, "eta_max", 0.01),
    (delight, "eta_target_neutral_frac", 1.5), (delight, "eta_target_ordering_gap", -0.1),
    (delight, "eta_ema_decay", 1.0), (delight, "eta", float("nan")), (delight_sepa, "fixed_lambda", 1.5),
    (delight_sepa, "steps", -1), (delight_sepa, "steps", 2.5), (delight_sepa, "kind", "cosine"),
    (delight_sepa, "correct_rate_gate", 2.0), (hard, "k_frac", 1.2), (hard, "k_frac", None),
    (hard, "warmup_sequences", 0), (hard, "var_threshold", 0.0), (hard, "fixed_lambda", "half"),
])
def test_bad_knobs_fail_at_construction_naming_the_key(make, knob, value):
    key = f"schedule.{knob}" if knob in SCHEDULE else knob  # the λ schedule's knobs: transform.schedule.*
    with pytest.raises(ValueError, match=f"transform.{key}="):
        make(**{knob: value})


# ---- through the public credit function ----------------------------------------------------------------


@pytest.mark.parametrize("make", [delight, lambda: delight_sepa(fixed_lambda=0.5), lambda: hard(fixed_lambda=1.0)])
def test_assign_credit_runs_each_delight_arm(make):
    # GRPO: rewards [1, 0, 0, 1] → [0.5, −0.5, −0.5, 0.5]; group 1 ties (all 1) → 0. Surprisals s = [0.5, 2.0]
    # on every completion, η = 1 (delight, delight_sepa), k = max(1, ⌊2·0.2⌋) = 1 (hard): the credit is the
    # transform applied to those episode advantages, zero on the tied group, and nothing is capped.
    rewards_P_G = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    sig = signals([[0.5, 2.0]] * 8, group_size=4, step=70, correct_rate=0.5)
    credit = assign_credit(rewards_P_G, sig, GRPO(PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)),
                           make())
    assert credit.adv_P_G.tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0] * 4]
    direct, metrics = make()(credit.adv_P_G.flatten().double(), sig)
    assert torch.allclose(credit.adv_PG_T.double(), direct, atol=1e-7)
    assert credit.adv_PG_T[4:].abs().sum() == 0 and not credit.skipped
    assert credit.metrics.keys() >= metrics.keys()
    assert torch.all(credit.adv_PG_T[:4] * credit.adv_P_G.flatten()[:4, None] >= 0)


@pytest.mark.parametrize("make", [delight, lambda: hard(k_frac=0.5, fixed_lambda=1.0)])
def test_assign_credit_with_a_turn_credit_gates_each_turn_advantage(make):
    """Multi-turn: reward_to_go gives row 0's turns [0.5, 0] and row 1's [−0.5] (tests/test_credit.py's example);
    Delight gates each action token with its own turn's advantage; the observation token stays 0."""
    from rlvr.turn_credit.reward_to_go import RewardToGo
    from tests.turn_credit.rows import turn_signals

    turns = turn_signals(["00o1", "0..."], 2, turn_rewards_PG_K=[[0.0, 1.0], [0.0, float("nan")]])
    logprobs = torch.tensor([[-1.0, -3.0, -7.0, -2.0], [-4.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    sig = TokenSignals(logprobs_PG_T=logprobs, mask_PG_T=turns.actions_PG_T, group_size=2, step=0, correct_rate=0.5)
    credit = assign_credit(torch.tensor([[1.0, 0.0]]), sig, GRPO(PolicyLoss(clip_eps=0.0, clip_eps_high=0.0,
                                                                           adv_clip_max=0.0)),
                           make(), RewardToGo(discount=1.0, std_normalize=False), turns)
    if isinstance(make(), Delight):
        # row 0: A = 0.5 on s = 1, 3 → 0.5·σ(0.5), 0.5·σ(1.5); turn 1's A = 0 → 0; row 1: −0.5·σ(−0.5·4) = −0.5·σ(−2)
        expected = [[0.5 * sigmoid(0.5), 0.5 * sigmoid(1.5), 0.0, 0.0], [-0.5 * sigmoid(-2.0), 0.0, 0.0, 0.0]]
    else:  # row 0's A > 0 tokens {s 1, 3}: k = 1 keeps s = 3; row 1's single A < 0 token is kept
        expected = [[0.0, 0.5, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0]]
    assert rows_near(credit.adv_PG_T.double(), expected, 1e-7)
