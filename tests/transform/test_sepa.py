import pytest
import torch
from hypothesis import given, settings

from rlvr.transform.gtpo import GTPO
from rlvr.transform.sepa import SEPA, SEPAAmp, SEPAAmpClamped, reshape_execution
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import mask_of, pad, reference_step, unpad
from tests.transform.transform_cases import StepCase, schedule, step_cases

# λ = (step − delay)/steps once the gate is open: steps=100, delay=0, gate 0 → λ = step/100
RAMP = dict(steps=100, delay_steps=0, correct_rate_gate=0.0)


def _sepa(cls=SEPA, **overrides):
    """transform=sepa (or `cls`) on RAMP; `overrides` are the λ schedule's knobs (transform.schedule.*)."""
    return cls(beta=0.1, uncertainty="surprisal", schedule=schedule(**{**RAMP, **overrides}))


def _signals(logprobs, planning, *, step, correct_rate=0.0, group_size=1):
    length = max(1, max(len(r) for r in logprobs))
    plan = pad([[float(m) for m in r] for r in planning], length, torch.float64).bool()
    return TokenSignals(
        pad(logprobs, length, torch.float64),
        mask_of(logprobs, length),
        group_size,
        step,
        correct_rate,
        planning_PG_T=plan,
    )


def test_table_pooling():
    # u = [1, 3, 5], planning [0, 0, 1], λ = 0.5 (step 50): μ_exec = (1 + 3)/2 = 2
    # exec u' = 0.5·2 + 0.5·[1, 3] = [1.5, 2.5]; planning stays 5 → u' = [1.5, 2.5, 5], mean 3
    # w = 1 + 0.1·(u'/3 − 1) = [0.95, 0.98333…, 1.06667…]; A = 1
    adv, metrics = _sepa()(torch.tensor([1.0]).double(), _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=50))
    assert adv[0].tolist() == pytest.approx([0.95, 1 - 0.1 / 6, 1 + 0.2 / 3], abs=1e-8)
    assert metrics["sepa_lambda"] == 0.5 and metrics["sepa_gate_open"] == 1.0
    # exec u [1, 3]: mean 2, var 1 → after pooling [1.5, 2.5]: mean 2, var 0.25; planning [5] untouched
    assert (metrics["exec_surprisal_mean"], metrics["exec_surprisal_var"]) == (2.0, 1.0)
    assert (metrics["post_exec_surprisal_mean"], metrics["post_exec_surprisal_var"]) == (2.0, 0.25)
    assert metrics["post_plan_surprisal_mean"] == metrics["plan_surprisal_mean"] == 5.0
    assert metrics["planning_token_fraction"] == pytest.approx(1 / 3)


def test_table_amplification():
    # u = [1, 3, 5], planning [0, 0, 1], λ = 0.5: exec u' = 1.5·[1, 3] − 0.5·2 = [0.5, 3.5]
    # u' = [0.5, 3.5, 5]
    # mean 3 → w = 1 + 0.1·([0.5, 3.5, 5]/3 − 1) = [0.91667, 1.01667, 1.06667]
    adv, _ = _sepa(SEPAAmp)(
        torch.tensor([1.0]).double(), _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=50)
    )
    assert adv[0].tolist() == pytest.approx([1 - 0.25 / 3, 1 + 0.05 / 3, 1 + 0.2 / 3], abs=1e-8)


def test_table_clamped_amplification():
    # u = [0.2, 3], no planning, λ = 1 (step 100): μ = 1.6; 2·0.2 − 1.6 = −1.2 → 0;  2·3 − 1.6 = 4.4
    u = torch.tensor([[0.2, 3.0]]).double()
    exec_ = torch.tensor([[True, True]])
    assert reshape_execution(u, exec_, 1.0, "amp_c")[0].tolist() == pytest.approx([0.0, 4.4])
    assert reshape_execution(u, exec_, 1.0, "amp")[0].tolist() == pytest.approx([-1.2, 4.4])
    # u' = [0, 4.4] → mean 2.2 → w = 1 + 0.1·([0, 4.4]/2.2 − 1) = [0.9, 1.1]
    adv, _ = _sepa(SEPAAmpClamped)(torch.tensor([1.0]).double(), _signals([[-0.2, -3.0]], [[0, 0]], step=100))
    assert adv[0].tolist() == pytest.approx([0.9, 1.1], abs=1e-8)


def test_all_planning_and_empty_completions_are_left_to_gtpo():
    # no execution tokens → u unchanged → exactly GTPO; the empty row stays 0
    signals = _signals([[-1.0, -4.0], []], [[1, 1], []], step=100, group_size=2)
    adv = torch.tensor([2.0, -1.0]).double()
    gtpo, _ = GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)
    for cls in (SEPA, SEPAAmp, SEPAAmpClamped):
        out, _ = _sepa(cls)(adv, signals)
        assert torch.equal(out, gtpo)
        assert out[1].tolist() == [0.0, 0.0]


def test_zero_advantages_give_zeros_and_no_stats():
    # all-equal rewards → episode advantages 0 → token advantages 0; λ and gate still reported
    adv, metrics = _sepa()(
        torch.zeros(2).double(), _signals([[-1.0, -2.0], [-3.0]], [[0, 1], [0]], step=50, group_size=2)
    )
    assert adv.abs().sum().item() == 0.0
    assert "exec_surprisal_mean" not in metrics and metrics["sepa_lambda"] == 0.5


@settings(max_examples=100, deadline=None)
@given(step_cases())
def test_lambda_zero_is_exactly_gtpo(case: StepCase):
    gtpo, _ = GTPO(beta=0.1, uncertainty="surprisal")(case.adv(), case.signals())
    for cls in (SEPA, SEPAAmp, SEPAAmpClamped):
        out, metrics = _sepa(cls)(case.adv(), case.signals(step=0))  # step 0 → λ = 0
        assert metrics["sepa_lambda"] == 0.0
        assert torch.equal(out, gtpo)


@settings(max_examples=100, deadline=None)
@given(step_cases())
def test_lambda_one_gives_every_execution_token_the_same_weight(case: StepCase):
    signals = case.signals(step=100)  # λ = 1
    out, metrics = _sepa()(case.adv(), signals)
    assert metrics["sepa_lambda"] == 1.0
    exec_ = signals.mask_PG_T & ~signals.planning_PG_T
    for row in range(len(case.adv_PG)):
        values = out[row][exec_[row]]
        if values.numel():
            assert torch.all(values == values[0])  # bitwise: u' = 1·μ_exec + 0·u for every exec token


@settings(max_examples=100, deadline=None)
@given(step_cases())
def test_planning_uncertainty_is_never_reshaped(case: StepCase):
    signals = case.signals()
    u = (-signals.logprobs_PG_T).clamp(max=50) * signals.mask_PG_T
    exec_ = signals.mask_PG_T & ~signals.planning_PG_T
    for variant in ("pool", "amp", "amp_c"):
        out = reshape_execution(u, exec_, 0.7, variant)
        assert torch.equal(out[~exec_], u[~exec_])


@settings(max_examples=100, deadline=None)
@given(step_cases())
def test_pooling_and_amplification_keep_the_execution_sum(case: StepCase):
    # pool: Σ_exec (λμ + (1 − λ)v) = λnμ + (1 − λ)Σv = Σv;  amp: Σ_exec ((1 + λ)v − λμ) = Σv
    signals = case.signals()
    u = (-signals.logprobs_PG_T).clamp(max=50) * signals.mask_PG_T
    exec_ = signals.mask_PG_T & ~signals.planning_PG_T
    for variant in ("pool", "amp"):
        out = reshape_execution(u, exec_, 0.6, variant)
        assert (out * exec_).sum(-1).tolist() == pytest.approx((u * exec_).sum(-1).tolist(), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(step_cases())
def test_matches_the_per_sequence_reference(case: StepCase):
    for cls, variant in ((SEPA, "pool"), (SEPAAmp, "amp"), (SEPAAmpClamped, "amp_c")):
        ref, ref_metrics = reference_step(
            variant, case.adv_PG, case.logprobs_PG, case.planning_PG, case.group_size, beta=0.3, lam=0.37
        )
        adv, metrics = cls(beta=0.3, uncertainty="surprisal", schedule=schedule(**RAMP))(case.adv(),
                                                                                       case.signals(step=37))
        for got, want in zip(unpad(adv, case.logprobs_PG), ref, strict=True):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_gate_opened_this_step_takes_effect_next_step():
    # gate 0.1, ramp λ = step/100. Step 30: gate closed when λ is resolved → λ = 0 even though this
    # step's correct rate 0.5 ≥ 0.1 opens it; the metric shows the gate after observing (1.0).
    # Step 31: λ = 0.31.
    sepa = _sepa(correct_rate_gate=0.1)
    signals = _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=30, correct_rate=0.5)
    adv = torch.tensor([1.0]).double()
    out_30, m_30 = sepa(adv, signals)
    assert (m_30["sepa_lambda"], m_30["sepa_gate_open"]) == (0.0, 1.0)
    assert torch.equal(out_30, GTPO(beta=0.1, uncertainty="surprisal")(adv, signals)[0])
    _, m_31 = sepa(adv, _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=31, correct_rate=0.0))
    assert (m_31["sepa_lambda"], m_31["sepa_gate_open"]) == (0.31, 1.0)


def test_state_dict_is_the_controllers_and_round_trips():
    sepa = _sepa(correct_rate_gate=0.1)
    sepa(torch.tensor([1.0]).double(), _signals([[-1.0]], [[0]], step=5, correct_rate=0.2))
    restored = _sepa(correct_rate_gate=0.1)
    assert restored.state_dict()["gate_open"] is False
    restored.load_state_dict(sepa.state_dict())
    assert restored.state_dict() == sepa.state_dict() and restored.state_dict()["gate_open"] is True


def test_linear_schedule_without_steps_warns():
    with pytest.warns(UserWarning, match="λ = 0"):
        _sepa(steps=0)


def test_fixed_lambda_replaces_the_schedule():
    """transform.schedule.fixed_lambda (the λ schedule's, shared with delight_sepa and hard_delight): SEPA trains with
    it whatever the step and the gate, and reports it as sepa_lambda; the controller still steps."""
    signals = _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=0, correct_rate=0.5)  # ramp λ would be 0 here
    fixed = _sepa(fixed_lambda=0.5, correct_rate_gate=0.9, steps=0)  # gate closed, no ramp: no warning either
    adv, metrics = fixed(torch.tensor([1.0]).double(), signals)
    ramped, _ = _sepa()(torch.tensor([1.0]).double(), _signals([[-1.0, -3.0, -5.0]], [[0, 0, 1]], step=50))
    assert torch.equal(adv, ramped) and metrics["sepa_lambda"] == 0.5 and metrics["sepa_gate_open"] == 0.0
