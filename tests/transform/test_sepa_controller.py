import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.transform.sepa_controller import LambdaSchedule, SEPAController
from tests.transform.retrain_reference import SequentialAutoState, mask_of, pad

DEFAULTS = dict(  # conf/lambda_schedule.yaml's
    kind="linear",
    steps=500,
    delay_steps=50,
    correct_rate_gate=0.1,
    ema_decay=0.99,
    var_threshold=0.2,
    warmup_sequences=50,
    fixed_lambda=None,
)


def _controller(**overrides) -> SEPAController:
    return SEPAController(LambdaSchedule(**{**DEFAULTS, **overrides}))


def _logprobs(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(−surprisal rows as padded logprobs, all-execution mask)."""
    length = max(1, max(len(r) for r in rows))
    return pad([[-s for s in r] for r in rows], length, torch.float64), mask_of(rows, length)


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 0.0),  # before the delay
        (50, 0.0),  # step − delay = 0 → still 0
        (51, 0.002),  # (51 − 50)/500
        (300, 0.5),  # (300 − 50)/500
        (499, 0.898),  # the last step of a 500-step run: (499 − 50)/500
        (550, 1.0),  # (550 − 50)/500 = 1
        (10_000, 1.0),  # capped
    ],
)
def test_linear_ramp_with_delay(step, expected):
    assert _controller(correct_rate_gate=0.0).resolve_lambda(step) == pytest.approx(expected, abs=1e-15)


def test_no_steps_means_no_ramp():
    controller = _controller(steps=0, correct_rate_gate=0.0)
    assert not controller.enabled and controller.resolve_lambda(10_000) == 0.0


def test_gate_is_sticky_and_ignores_non_finite_rates():
    controller = _controller()  # gate 0.1
    assert controller.resolve_lambda(300) == 0.0  # closed
    for rate in (0.05, float("nan"), float("inf"), None):
        controller.observe_correct_rate(rate)
        assert not controller.gate_open
    controller.observe_correct_rate(0.1)  # ≥ gate → open
    controller.observe_correct_rate(0.0)  # stays open
    assert controller.gate_open and controller.resolve_lambda(300) == 0.5


def test_gate_zero_is_open_from_the_start():
    assert _controller(correct_rate_gate=0.0).gate_open


def test_auto_warmup_counts_sequences_not_steps():
    # d = 0.5, warm-up 3 sequences, threshold 0.5. One step of three completions, exec surprisals
    #   [1, 3] → var 1;  [2, 2] → var 0;  [0, 4] → var 4
    # var_ema: 1 → 0.5·1 + 0.5·0 = 0.5 → 0.5·0.5 + 0.5·4 = 2.25
    # the 3rd sequence ends the warm-up: var_0 = 2.25
    controller = _controller(
        kind="auto", correct_rate_gate=0.0, ema_decay=0.5, warmup_sequences=3, var_threshold=0.5, steps=0
    )
    controller.update_auto_state(*_logprobs([[1, 3], [2, 2], [0, 4]]))
    assert (controller.var_ema, controller.var_0, controller.warmup_seen) == (2.25, 2.25, 3)
    # λ = 1 − min((2.25/2.25)/0.5, 1) = 0
    assert controller.resolve_lambda(0) == 0.0
    # next step: two zero-variance completions → var_ema 2.25 → 1.125 → 0.5625
    # λ = 1 − min((0.5625/2.25)/0.5, 1) = 1 − 0.5 = 0.5
    controller.update_auto_state(*_logprobs([[2, 2], [3, 3]]))
    assert controller.var_ema == 0.5625 and controller.resolve_lambda(0) == 0.5


def test_auto_warmup_spans_steps_when_steps_are_small():
    # warm-up 5 sequences, 3 per step: after step 1 var_0 is unknown (λ = linear floor = 0);
    # it is set at the 5th sequence
    controller = _controller(kind="auto", correct_rate_gate=0.0, ema_decay=0.5, warmup_sequences=5)
    controller.update_auto_state(*_logprobs([[1, 3]] * 3))
    assert (controller.var_0, controller.warmup_seen) == (None, 3)
    assert controller.resolve_lambda(0) == 0.0
    controller.update_auto_state(*_logprobs([[1, 3]] * 3))
    assert (controller.var_0, controller.warmup_seen) == (1.0, 5)


def test_auto_skips_sequences_without_valid_execution_tokens():
    # rows: empty; all planning; surprisal inf (logprob −inf) and −0.5 (logprob +0.5) only → none counted;
    # the last row [1, 3] (var 1) is the only sequence seen
    controller = _controller(kind="auto", ema_decay=0.5, warmup_sequences=50)
    logprobs, mask = _logprobs([[], [1.0, 2.0], [math.inf, -0.5], [1.0, 3.0]])
    exec_ = mask.clone()
    exec_[1] = False
    controller.update_auto_state(logprobs, exec_)
    assert (controller.var_ema, controller.warmup_seen) == (1.0, 1)


def test_linear_schedule_keeps_no_auto_state():
    controller = _controller()
    controller.update_auto_state(*_logprobs([[1, 3]]))
    assert (controller.var_ema, controller.warmup_seen) == (None, 0)


def test_auto_uses_linear_as_floor():
    # no auto state yet → auto λ = 0 → λ = linear = (300 − 50)/500
    assert _controller(kind="auto", correct_rate_gate=0.0).resolve_lambda(300) == 0.5


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(
            st.lists(st.integers(0, 20_000).map(lambda k: k / 1000), max_size=6), min_size=1, max_size=5
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    st.integers(1, 8),
)
def test_vectorised_auto_state_equals_per_sequence_updates(steps_rows, decay, warmup):
    controller = _controller(kind="auto", ema_decay=decay, warmup_sequences=warmup)
    reference = SequentialAutoState(decay, warmup)
    for rows in steps_rows:
        controller.update_auto_state(*_logprobs(rows))
        for row in rows:
            reference.update(row)
        assert controller.warmup_seen == reference.warmup_seen
        for got, want in ((controller.var_ema, reference.var_ema), (controller.var_0, reference.var_0)):
            assert (got is None) == (want is None)
            if want is not None:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_state_round_trips_through_json():
    controller = _controller(kind="auto", ema_decay=0.5, warmup_sequences=2)
    controller.observe_correct_rate(0.3)
    controller.update_auto_state(*_logprobs([[1, 3], [0, 4], [2, 2]]))
    restored = _controller(kind="auto", ema_decay=0.5, warmup_sequences=2)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.state_dict() == controller.state_dict()
    for c in (controller, restored):  # both continue identically
        c.update_auto_state(*_logprobs([[5, 1]]))
    assert restored.state_dict() == controller.state_dict()
    assert restored.resolve_lambda(60) == controller.resolve_lambda(60)


def test_load_restores_state_not_configuration():
    source = _controller(steps=10)
    source.observe_correct_rate(1.0)
    target = _controller(steps=500)
    target.load_state_dict(source.state_dict())
    assert target.schedule.steps == 500 and target.gate_open


@pytest.mark.parametrize(
    "state, message",
    [
        ({"var_ema": float("nan"), "gate_open": True}, "var_ema"),
        ({"warmup_seen": -1, "gate_open": True}, "warmup_seen"),
        ({"warmup_seen": 0, "gate_open": "yes"}, "gate_open"),
    ],
)
def test_load_rejects_bad_state(state, message):
    with pytest.raises(ValueError, match=message):
        _controller().load_state_dict(state)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"steps": -1}, "steps=-1"),
        ({"delay_steps": -1}, "delay_steps=-1"),
        ({"correct_rate_gate": 1.5}, "correct_rate_gate=1.5"),
        ({"ema_decay": 1.5}, "ema_decay=1.5"),
        ({"var_threshold": 0.0}, "var_threshold=0.0"),
        ({"warmup_sequences": 0}, "warmup_sequences=0"),
        ({"kind": "cosine"}, "'cosine'.*linear.*auto"),
        ({"steps": 2.5}, r"transform\.schedule\.steps=2\.5 must be an integer"),
        ({"fixed_lambda": 1.5}, r"transform\.schedule\.fixed_lambda=1\.5 must be <= 1"),
        ({"fixed_lambda": "half"}, "fixed_lambda='half' must be a number"),
    ],
)
def test_constructor_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        _controller(**overrides)


def test_state_dict_keeps_its_keys_and_meaning():
    """Checkpoints written before the knobs moved under transform.schedule (issue 22) load, and new ones read the
    same: the configuration under its old flat names ("schedule" is the kind), then the state."""
    controller = _controller(kind="auto", fixed_lambda=0.3)
    assert controller.state_dict() == {
        "steps": 500, "schedule": "auto", "delay_steps": 50, "correct_rate_gate": 0.1, "ema_decay": 0.99,
        "var_threshold": 0.2, "warmup_sequences": 50, "var_ema": None, "var_0": None, "warmup_seen": 0,
        "gate_open": False,
    }
    old = {**controller.state_dict(), "schedule": "linear", "var_ema": 2.0, "var_0": 4.0, "warmup_seen": 50,
           "gate_open": True}  # as an earlier version wrote it, from another configuration
    controller.load_state_dict(old)
    assert (controller.var_ema, controller.var_0, controller.warmup_seen, controller.gate_open) == (2.0, 4.0, 50, True)
    assert controller.schedule.kind == "auto"  # the YAML is the configuration


@pytest.mark.parametrize("value", ["auto", "linear", "cosine"])
def test_a_kind_where_the_node_is_names_the_new_key(value):
    with pytest.raises(ValueError, match=rf"transform\.schedule is now transform\.schedule\.kind \(say "
                                         rf"transform\.schedule\.kind={value}\)"):
        SEPAController(value)
    with pytest.raises(ValueError, match="must be the λ schedule's node"):
        SEPAController({"kind": "auto"})
