"""Invariants every token-level transform of this package keeps, on random steps."""

import pytest
import torch
from hypothesis import given, settings

from rlvr.transform.delight import Delight
from rlvr.transform.delight_sepa import DelightSEPA
from rlvr.transform.entropy_mask import EntropyMask
from rlvr.transform.gtpo import GTPO
from rlvr.transform.hard_delight import HardDelight
from rlvr.transform.hicra import HICRA
from rlvr.transform.sepa import SEPA, SEPAAmp, SEPAAmpClamped
from tests.transform.transform_cases import StepCase, schedule, step_cases

CONTROLLER = dict(schedule=schedule(kind="auto", steps=10, delay_steps=2, correct_rate_gate=0.0, ema_decay=0.9,
                                    warmup_sequences=3))


ETA = dict(eta=0.8, eta_mode="fixed", eta_min=0.05, eta_max=5.0, eta_target_neutral_frac=0.5,
           eta_target_ordering_gap=0.0, eta_ema_decay=0.0)
ADAPTIVE = {**ETA, "eta_mode": "adaptive", "eta_target_ordering_gap": 0.3, "eta_ema_decay": 0.5}


def _delight_transforms():
    """Delight reads surprisal only (no `uncertainty` knob); the controller ones with the auto schedule."""
    return [
        Delight(norm="none", **ETA),
        Delight(norm="mad_scale", **ADAPTIVE),
        DelightSEPA(norm="scale", **ADAPTIVE, **CONTROLLER),
        HardDelight(k_frac=0.3, **CONTROLLER),
    ]


def _transforms(uncertainty: str):
    return [
        GTPO(beta=0.5, uncertainty=uncertainty),
        HICRA(beta=0.5, alpha=1.0, uncertainty=uncertainty),
        SEPA(beta=0.5, uncertainty=uncertainty, **CONTROLLER),
        SEPAAmp(beta=0.5, uncertainty=uncertainty, **CONTROLLER),
        SEPAAmpClamped(beta=0.5, uncertainty=uncertainty, **CONTROLLER),
        EntropyMask(beta=0.5, rho=0.3, uncertainty=uncertainty),
        *(_delight_transforms() if uncertainty == "surprisal" else []),
    ]


@settings(max_examples=40, deadline=None)
@given(step_cases())
def test_padding_never_leaks_and_garbage_padding_changes_nothing(case: StepCase):
    # padding holds NaN / −inf logprobs and entropies and a True planning mask: the output is exactly the
    # same as with clean padding, and exactly 0 there
    for uncertainty in ("surprisal", "predictive_variance", "shannon_entropy"):
        for clean, dirty in zip(_transforms(uncertainty), _transforms(uncertainty), strict=True):
            for step in (0, 7):  # λ = 0, then λ = (7 − 2)/10
                want, want_metrics = clean(case.adv(), case.signals(step=step, correct_rate=0.5))
                got, got_metrics = dirty(
                    case.adv(), case.signals(step=step, correct_rate=0.5, garbage_padding=True)
                )
                assert torch.equal(got, want), type(clean).__name__
                assert got[~case.signals().mask_PG_T].abs().sum().item() == 0.0
                assert got_metrics.keys() == want_metrics.keys()
                for name, value in want_metrics.items():
                    assert got_metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-300), name
                assert dirty.state_dict() == clean.state_dict()  # the auto state ignores padding too


@settings(max_examples=100, deadline=None)
@given(step_cases())
def test_sign_of_the_episode_advantage_is_preserved(case: StepCase):
    # every token advantage is 0 or has the sign of its completion's A (HICRA at the largest α = 1 included;
    # Delight's gates and blends lie in [0, 1])
    adv_PG = case.adv()
    for transform in _transforms("surprisal"):
        out, _ = transform(adv_PG, case.signals(step=9))
        assert torch.all(out * adv_PG[:, None] >= 0), type(transform).__name__
        assert torch.all(out[adv_PG == 0] == 0)


@settings(max_examples=60, deadline=None)
@given(step_cases())
def test_sign_of_each_token_advantage_is_preserved(case: StepCase):
    # [P·G, T] token advantages (multi-turn turn credit, mixed signs within a completion): every output token is 0
    # or has its own A_t's sign, A_t = 0 stays 0, padding stays 0 — with garbage in the padding of the signals
    adv_PG_T = case.turn_adv()
    mask = case.signals().mask_PG_T
    for transform in _transforms("surprisal"):
        out, _ = transform(adv_PG_T, case.signals(step=9, correct_rate=0.5, garbage_padding=True))
        assert torch.all(out * adv_PG_T >= 0), type(transform).__name__
        assert torch.all(out[adv_PG_T == 0] == 0) and out[~mask].abs().sum().item() == 0.0


@settings(max_examples=50, deadline=None)
@given(step_cases())
def test_float32_in_float32_out(case: StepCase):
    for transform in _transforms("surprisal"):
        out, metrics = transform(case.adv(torch.float32), case.signals(torch.float32, step=9))
        assert out.dtype == torch.float32 and out.shape == case.signals().mask_PG_T.shape
        assert all(isinstance(v, float) for v in metrics.values())


def test_row_count_must_match_group_size():
    case = StepCase(
        group_size=2,
        length=1,
        adv_PG=[1.0, 0.0, 1.0],
        logprobs_PG=[[-1.0]] * 3,
        entropies_PG=[[0.0]] * 3,
        planning_PG=[[0]] * 3,
    )
    with pytest.raises(ValueError, match="3 rows are not divisible by group_size=2"):
        GTPO(beta=0.1, uncertainty="surprisal")(case.adv(), case.signals())
    with pytest.raises(ValueError, match=r"adv_PG has shape \(2,\), expected \(3,\)"):
        GTPO(beta=0.1, uncertainty="surprisal")(case.adv()[:2], case.signals())
