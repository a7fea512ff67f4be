"""The USL back pressure without a model: the formula, the fit on synthetic throughput curves, the decisions
(throttle on a retrograde curve, hold on a flat one, increase below the knee), hysteresis, bounds and the
state a checkpoint carries. A "curve" is the true X(p) in tokens/s; a step of p completions is reported as
`tokens` = 10·p tokens in `tokens / X(p)` seconds, so the controller measures x = X(p) exactly (× noise)."""

import json
import math
import random

import pytest

from rlvr.backpressure import usl
from rlvr.backpressure.none import NoBackPressure
from rlvr.backpressure.usl import USLBackPressure, USLFit, fit_usl, sweep_sizes, usl_capacity, usl_optimal_p

METRICS = {"bp_warmup", "bp_action", "bp_regime", "bp_p_star", "bp_sigma", "bp_kappa", "bp_utilization",
           "bp_throughput"}
KNOBS = dict(warmup_steps=7, min_batch_size=1, max_batch_size=64, window=100, ema_decay=0.9, throttle_margin=0.85,
             increase_margin=0.5, min_gain=0.05, patience=2)


def controller(**changes) -> USLBackPressure:
    return USLBackPressure(**{**KNOBS, **changes})


def usl_curve(sigma: float, kappa: float, lam: float = 1000.0):
    return lambda p: lam * usl_capacity(p, sigma, kappa)


def drive(ctrl, curve, steps: int, configured: int, group_size: int = 1, noise=lambda step: 1.0, skipped=()):
    """Run `steps` steps of the trainer's protocol against `curve`; (batch size per step, metrics per step)."""
    sizes, rows = [], []
    for step in range(steps):
        b = ctrl.batch_size(step, configured)
        p = b * group_size
        tokens = 10 * p
        seconds = tokens / (curve(p) * noise(step))
        sizes.append(b)
        rows.append(ctrl.observe(step=step, batch_size=b, group_size=group_size, tokens=tokens, seconds=seconds,
                                 skipped=step in skipped))
    return sizes, rows


def changes(sizes: list[int]) -> int:
    return sum(a != b for a, b in zip(sizes, sizes[1:]))


def test_formula():
    # σ = 0.1, κ = 0.001: p* = sqrt(0.9 / 0.001) = 30; C(30) = 30 / (1 + 0.1·29 + 0.001·30·29) = 30 / 4.77
    assert usl_optimal_p(0.1, 0.001) == pytest.approx(30.0)
    assert usl_capacity(30, 0.1, 0.001) == pytest.approx(30 / 4.77)
    assert usl_capacity(1, 0.7, 0.3) == 1.0  # one unit: no contention, no coherency
    assert usl_capacity(29, 0.1, 0.001) < usl_capacity(30, 0.1, 0.001) > usl_capacity(31, 0.1, 0.001)
    assert usl_capacity(3, -1.0, 0.0) == 0.0  # denominator 1 − 2 = −1 ≤ 0
    assert usl_optimal_p(0.1, 0.0) == 1.0 and usl_optimal_p(1.0, 0.01) == 1.0  # no interior peak


def test_sweep_sizes():
    assert sweep_sizes(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert sweep_sizes(3, 20) == [3, 6, 12, 20]
    assert sweep_sizes(5, 5) == [5]


def test_fit_recovers_known_parameters_without_noise():
    # p/X = (1 − σ + (σ − κ)p + κp²)/λ is exactly quadratic: three distinct p determine it
    for sigma, kappa, lam in [(0.1, 0.001, 100.0), (0.0, 0.0, 5.0), (0.3, 0.02, 1e6), (0.05, 1e-5, 1e5)]:
        points = [(p, lam * usl_capacity(p, sigma, kappa)) for p in (16, 32, 64, 128, 256, 512, 1024)]
        fit = fit_usl(points)
        assert fit.sigma == pytest.approx(sigma, abs=1e-9) and fit.kappa == pytest.approx(kappa, rel=1e-7, abs=1e-12)
        assert fit.lam == pytest.approx(lam, rel=1e-9)


def test_fit_recovers_known_parameters_with_noise():
    # σ = 0.1, κ = 0.001, λ = 100 (p* = 30); 100 points over p = 1 … 64 with 2% Gaussian noise on X. Over 200
    # seeds the worst errors were |Δσ| 0.0055, |Δκ|/κ 8.7%, |Δλ|/λ 1.7%, |Δp*|/p* 4.4%; the bounds are ~2× that.
    rng = random.Random(0)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    for _ in range(20):
        points = [(p, 100.0 * usl_capacity(p, 0.1, 0.001) * (1 + rng.gauss(0, 0.02))) for p in sizes * 15][:100]
        fit = fit_usl(points)
        assert abs(fit.sigma - 0.1) < 0.012 and abs(fit.kappa - 0.001) < 0.15 * 0.001
        assert abs(fit.lam - 100.0) < 3.0 and abs(fit.p_star - 30.0) < 0.08 * 30.0


def test_no_fit_from_fewer_than_three_distinct_p():
    assert fit_usl([(8, 100.0), (16, 150.0)] * 10) is None
    assert fit_usl([(8, 100.0), (16, 150.0), (32, 0.0)]) is None  # x = 0 is no measurement
    assert fit_usl([]) is None


def test_retrograde_curve_throttles_to_a_safe_distance_below_the_peak():
    # σ = 0.05, κ = 0.0095: p* = sqrt(0.95 / 0.0095) = 10; G = 1. The sweep (steps 0–6) is 1, 2, …, 64; then
    # trainer.batch_size = 64 > 0.85·10 = 8.5 → retrograde, target ⌊8.5⌋ = 8, X(8)/X(64) = 4.1/1.4 > 1.05;
    # recommended at steps 7 and 8 (patience 2) → applied from step 9; at 8 ≤ 8.5 and 8 ≥ 0.5·8.5 it holds.
    sizes, rows = drive(controller(), usl_curve(0.05, 0.0095), 30, configured=64)
    assert sizes[:7] == [1, 2, 4, 8, 16, 32, 64] and all(r["bp_regime"] == "warmup" for r in rows[:7])
    assert sizes[7:9] == [64, 64] and sizes[9:] == [8] * 21
    assert [r["bp_action"] for r in rows[7:10]] == ["hold", "throttle", "hold"]
    assert rows[7]["bp_regime"] == "retrograde" and rows[8]["bp_p_star"] == pytest.approx(10.0)
    assert rows[8]["bp_sigma"] == pytest.approx(0.05) and rows[8]["bp_kappa"] == pytest.approx(0.0095)


def test_flat_curve_holds():
    # X(p) = 1000 for every p (σ = 1, κ = 0: no peak, p* reported as 1); with or without 2% noise nothing is
    # worth moving for: min_gain asks the fit for ≥ 5% more throughput at any target
    rng = random.Random(1)
    for noise in (lambda step: 1.0, lambda step: 1 + rng.gauss(0, 0.02)):
        sizes, rows = drive(controller(), lambda p: 1000.0, 60, configured=16, noise=noise)
        assert sizes[7:] == [16] * 53
        assert {r["bp_action"] for r in rows} == {"hold"}
    assert rows[-1]["bp_sigma"] > 0.9


def test_below_the_knee_increases_up_to_max_batch_size():
    # σ = 0.01, κ = 0.000099: p* = sqrt(0.99 / 0.000099) = 100 > 64 = max → safe = min(85, 64) = 64; configured 8
    # < 0.5·64 → increase to 64 (X(64)/X(8) ≈ 5.3), applied after 2 recommendations; never above 64
    sizes, rows = drive(controller(), usl_curve(0.01, 0.000099), 20, configured=8)
    assert sizes[7:9] == [8, 8] and sizes[9:] == [64] * 11
    assert rows[8]["bp_action"] == "increase"


def test_bounds_are_respected():
    # p* = 2 (σ = 0.2, κ = 0.2) below min_batch_size = 4: throttled to 4, not below; p* = 100 above max = 16:
    # increased to 16, not above; and over random curves every batch size stays in [4, 16]
    bounded = dict(min_batch_size=4, max_batch_size=16, warmup_steps=3)
    sizes, _ = drive(controller(**bounded), usl_curve(0.2, 0.2), 20, configured=16)
    assert sizes[:3] == [4, 8, 16] and sizes[-1] == 4
    sizes, _ = drive(controller(**bounded), usl_curve(0.01, 0.000099), 20, configured=4)
    assert sizes[-1] == 16
    rng = random.Random(2)
    for _ in range(50):
        sigma, kappa = rng.uniform(0, 0.5), 10 ** rng.uniform(-5, 0)
        sizes, rows = drive(controller(**bounded), usl_curve(sigma, kappa), 40, configured=rng.randint(4, 16),
                            group_size=rng.choice([1, 4, 16]), noise=lambda step: 1 + rng.gauss(0, 0.05))
        assert all(4 <= s <= 16 for s in sizes)
        assert all(math.isfinite(r[k]) for r in rows for k in METRICS - {"bp_action", "bp_regime", "bp_warmup"})


def test_hysteresis_no_flip_flop_when_the_fitted_peak_alternates(monkeypatch):
    # The fit alternates between p* = 22 and p* = 26 (σ = 0.05, κ = 0.95/p*²): noise around a knee at 24, with
    # the batch at 24 (G = 1). Without hysteresis (margins 1, min_gain 0, patience 1) the batch chases each fit:
    # 24 > 22 → throttle to 22; 22 < 26 → increase to 26; 26 > 22 → … With the defaults, 0.85·p* is 18.7 or
    # 22.1 (< 24: retrograde) but X(18)/X(24) = 7.35/7.42 and X(22)/X(24) = 8.15/8.21 promise no gain: hold.
    fits = [USLFit(0.05, 0.95 / 22**2, 100.0), USLFit(0.05, 0.95 / 26**2, 100.0)]
    calls = iter(range(10**6))
    monkeypatch.setattr(usl, "fit_usl", lambda points: fits[next(calls) % 2])
    naive = controller(throttle_margin=1.0, increase_margin=1.0, min_gain=0.0, patience=1)
    sizes, _ = drive(naive, usl_curve(0.05, 0.95 / 24**2), 27, configured=24)
    assert changes(sizes[7:]) >= 15, sizes
    sizes, rows = drive(controller(), usl_curve(0.05, 0.95 / 24**2), 27, configured=24)
    assert sizes[7:] == [24] * 20 and {r["bp_action"] for r in rows} == {"hold"}


def test_patience_ignores_a_recommendation_that_does_not_repeat():
    # with patience 2, throttle → hold → throttle applies nothing (a hold breaks the streak); a second
    # consecutive throttle applies its target
    ctrl = controller()
    drive(ctrl, usl_curve(0.05, 0.0095), 7, configured=64)  # the sweep
    assert ctrl._confirm("throttle", 8) == "hold" and ctrl._confirm("hold", 64) == "hold"
    assert ctrl._confirm("throttle", 8) == "hold" and ctrl.current is None
    assert ctrl._confirm("throttle", 8) == "throttle" and ctrl.current == 8


def test_alternating_measurement_noise_moves_the_batch_at_most_once():
    # the true knee p* = 24 (G = 1), every measurement × 1.05 or × 0.95 in turn, 100 steps after the sweep at
    # batch 32: the fitted p* stays ≈ 22.5, so 32 is retrograde, but ⌊0.85·22.5⌋ = 19 promises X(19)/X(32) ≈ 1.01
    # (the curve is flat near its peak): it holds. (Margins 1, min_gain 0, patience 1 move 4 times here.)
    sizes, rows = drive(controller(), usl_curve(0.05, 0.95 / 24**2), 107, configured=32,
                        noise=lambda step: 1.05 if step % 2 else 0.95)
    assert changes(sizes[7:]) <= 1, sizes[7:]
    assert all(math.isfinite(r["bp_p_star"]) for r in rows)


def test_skipped_steps_are_not_measured():
    ctrl = controller()
    _, rows = drive(ctrl, usl_curve(0.05, 0.0095), 10, configured=64, skipped={0, 3, 8})
    assert len(ctrl.points) == 7 and rows[8]["bp_action"] == "hold"


def test_state_dict_round_trip_continues_identically():
    # stop mid-streak (throttle recommended once, step 7) and continue a copy from the JSON of its state
    curve, noise = usl_curve(0.05, 0.0095), (lambda step: 1 + 0.03 * math.sin(step))
    a = controller()
    drive(a, curve, 8, configured=64, noise=noise)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["pending"] == "throttle" and state["streak"] == 1
    b = controller()
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()

    def rest(ctrl):
        out = []
        for step in range(8, 30):
            size = ctrl.batch_size(step, 64)
            x = curve(size) * noise(step)
            out.append((size, ctrl.observe(step=step, batch_size=size, group_size=1, tokens=10 * size,
                                           seconds=10 * size / x, skipped=False)))
        return out

    assert rest(a) == rest(b)
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="pending"):
        controller().load_state_dict({**state, "pending": "panic"})
    with pytest.raises(ValueError, match="points"):
        controller().load_state_dict({**state, "points": [[8, float("nan")]]})


def test_metrics_are_the_spec_names_and_finite():
    _, rows = drive(controller(), usl_curve(0.05, 0.0095), 12, configured=64)
    for r in rows:
        assert r.keys() == METRICS
        assert r["bp_action"] in usl.ACTIONS and r["bp_regime"] in {"warmup", "retrograde", "memory_bound", "optimal"}
        assert all(math.isfinite(r[k]) for k in METRICS - {"bp_action", "bp_regime", "bp_warmup"})
    assert rows[0]["bp_warmup"] and not rows[-1]["bp_warmup"] and rows[0]["bp_utilization"] == 0.0


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"min_batch_size": 0}, "backpressure.min_batch_size=0"),
        ({"min_batch_size": 8, "max_batch_size": 4}, "need 1 <= min_batch_size <= max_batch_size"),
        ({"warmup_steps": 2}, "backpressure.warmup_steps=2 sweeps 2 batch size(s) [1, 2]"),
        ({"min_batch_size": 4, "max_batch_size": 6}, "sweeps 2 batch size(s) [4, 6]"),
        ({"window": 2}, "backpressure.window=2"),
        ({"ema_decay": 1.0}, "backpressure.ema_decay=1.0"),
        ({"throttle_margin": 0.0}, "backpressure.throttle_margin=0.0"),
        ({"patience": 0}, "backpressure.patience=0"),
        ({"min_gain": -0.1}, "backpressure.min_gain=-0.1"),
    ],
)
def test_bad_knobs_name_the_key(changes, message):
    with pytest.raises(ValueError) as err:
        controller(**changes)
    assert message in str(err.value)


def test_none_keeps_the_configured_batch_and_logs_nothing():
    off = NoBackPressure()
    assert [off.batch_size(step, 8) for step in range(3)] == [8, 8, 8]
    assert off.observe(step=0, batch_size=8, group_size=8, tokens=100, seconds=1.0, skipped=False) == {}
    assert off.state_dict() == {}
