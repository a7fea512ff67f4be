"""`backpressure=usl`: adapt the prompts per step to the throughput the machine shows (after retrain's controller).

Model (Gunther's Universal Scalability Law), with p = completions per step = batch size · group size G:

    X(p) = λ·C(p),   C(p) = p / (1 + σ(p−1) + κ·p(p−1))        (C = 0 where the denominator is ≤ 0)

σ (contention) bends the curve toward the ceiling λ/σ; κ (coherency) makes it retrograde: X peaks at

    p* = sqrt((1−σ)/κ)                                          (reported as 1.0 when κ ≤ 0 or σ ≥ 1: no peak)

and falls beyond it. The throughput x of a step is its prompt + completion tokens over its wall time
(sampling, scoring, credit, training: the row's `tokens_per_step / step_time_s`).

Fit. y = p/x is linear in three unknowns: p/X = a + b·p + c·p² with a = (1−σ)/λ, b = (σ−κ)/λ, c = κ/λ,
so a + b + c = 1/λ and

    σ = clamp((b+c)/(a+b+c), 0, 1),   κ = max(0, c/(a+b+c)),   λ = 1/(a+b+c).

(a, b, c) solve the least-squares normal equations (Cramer's rule) over the last `window` measured steps
(not skipped, x > 0). The previous fit is kept while the window holds fewer than 3 distinct p, the system
is singular, or a + b + c ≤ 0.

Steps. Steps 0 … warmup_steps−1 cycle the sweep min, 2·min, 4·min, … (doubling while ≤ max), then max:
measured, never acted on. Then the batch size is `trainer.batch_size` until the controller moves it. After
each later measured step, with p = its batch · G and EMA = the throughput's exponential moving average
(`ema_decay`, seeded with the first measurement):

    regime   retrograde     κ > 0, p* > 1 and p > throttle_margin·p*
             memory_bound   else EMA / (λ·C(p)) > 1.1        (faster than the fit predicts)
             retrograde     else EMA / (λ·C(p)) < 0.8        (slower than the fit predicts)
             optimal        otherwise, and while there is no fit
    target   safe = clamp(throttle_margin·p*, min·G, max·G);   target = clamp(⌊safe/G⌋, min, max)
    action   throttle       regime retrograde and target < batch
             increase       p < increase_margin·safe and target > batch
             hold           otherwise, and whenever the fit predicts less than `min_gain` relative
                            throughput gain at the target: X(target·G) < (1 + min_gain)·X(p)
    applied  once the same action was recommended on `patience` consecutive measured steps: the batch
             size is the latest target from the next step on.

Hysteresis: nothing moves between increase_margin·safe and throttle_margin·p*; a move lands at `safe`,
inside that band; `min_gain` ignores moves the fit says are worth little (a flat curve, a p* wandering with
noise); `patience` ignores one odd step. Skipped steps (nothing trained) are not measured: their time
lacks the training phase.

Metrics (every step row): bp_warmup, bp_action (hold | throttle | increase: applied from the next step),
bp_regime (warmup | retrograde | memory_bound | optimal), bp_p_star (in completions; /G for prompts),
bp_sigma, bp_kappa, bp_utilization = EMA / (λ·C(p*)) (0 in the sweep, 1.0 before a fit), bp_throughput = the
EMA in tokens/s.

Deliberate differences from retrain's controller (whose knobs' defaults the YAML keeps):
- the fit is recomputed from the window each step with p scaled by the window's largest p, instead of
  running sums of p⁰ … p⁴ updated incrementally: at p ~ 10³ the p⁴ sums reach 10¹⁴–10¹⁶, where adding and
  subtracting loses the digits Cramer's rule needs; re-summing ≤ `window` points costs nothing;
- no fit from fewer than 3 distinct p (retrain's |det| < 1e-8 on raw sums does not catch a rank-2 system);
- no `compute_bound` regime: retrain's peak_gflops / peak_bw_gb_s rule compared C(p), a pure number, with
  FLOP/s; those knobs are not offered;
- `safe` is bounded with the run's G, not retrain's fixed group sizes 2 … 64;
- "throttle" never raises the batch size and "increase" never lowers it (retrain could throttle upward when
  its EMA-ratio rule called a small batch retrograde); `min_gain` and `patience` are new (`min_gain: 0`,
  `patience: 1` act at once, as retrain did);
- after the sweep the run returns to `trainer.batch_size` (retrain kept whichever sweep size came last);
- the controller's state is checkpointed (retrain's was not): a resumed run decides as the uninterrupted one
  would, given the same measurements. Measurements are wall-clock times, so two runs with back pressure on
  are not identical to each other (their batch sizes, hence rollouts, follow the machine).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.protocols import Needs

EPS = 1e-8
MEMORY_BOUND_RATIO = 1.1
"""EMA throughput this much above the fit's prediction at p: memory_bound (a label; no action of its own)."""
RETROGRADE_RATIO = 0.8
"""EMA throughput this much below the fit's prediction at p: retrograde."""
ACTIONS = ("hold", "throttle", "increase")


def usl_capacity(p: float, sigma: float, kappa: float) -> float:
    """C(p) = p / (1 + σ(p−1) + κ·p(p−1)); 0 where the denominator is ≤ 0."""
    denominator = 1.0 + sigma * (p - 1.0) + kappa * p * (p - 1.0)
    return p / denominator if denominator > 0 else 0.0


def usl_optimal_p(sigma: float, kappa: float) -> float:
    """p* = sqrt((1−σ)/κ), where C peaks; 1.0 when there is no interior peak (κ ≤ 0 or σ ≥ 1)."""
    if kappa <= 0 or 1.0 - sigma <= 0:
        return 1.0
    return math.sqrt((1.0 - sigma) / kappa)


def sweep_sizes(min_batch_size: int, max_batch_size: int) -> list[int]:
    """min, 2·min, 4·min, … while ≤ max, then max: (1, 64) → [1, 2, 4, 8, 16, 32, 64], (3, 20) → [3, 6, 12, 20]."""
    sizes, size = [], max(1, min_batch_size)
    while size <= max_batch_size:
        sizes.append(size)
        size *= 2
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return sizes


@dataclass(frozen=True)
class USLFit:
    sigma: float
    kappa: float
    lam: float
    """λ: throughput at p = 1 (tokens/s)."""

    @property
    def p_star(self) -> float:
        return usl_optimal_p(self.sigma, self.kappa)

    def throughput(self, p: float) -> float:
        return self.lam * usl_capacity(p, self.sigma, self.kappa)


def _det3(m: list[list[float]]) -> float:
    return (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )


def fit_usl(points: Sequence[tuple[float, float]]) -> USLFit | None:
    """Least squares of p/x = a + b·p + c·p² over (p, x) points (those with x > 0), mapped to (σ, κ, λ);
    None when fewer than 3 distinct p, a singular system, or a + b + c ≤ 0."""
    valid = [(p, x) for p, x in points if x > EPS and p > 0]
    if len({p for p, _ in valid}) < 3:
        return None
    scale = max(p for p, _ in valid)  # q = p/scale ∈ (0, 1]: keeps the normal equations' entries ≤ n
    q = [p / scale for p, _ in valid]
    y = [p / x for p, x in valid]
    s = [math.fsum(qi**k for qi in q) for k in range(5)]
    t = [math.fsum(qi**k * yi for qi, yi in zip(q, y)) for k in range(3)]
    normal = [[s[0], s[1], s[2]], [s[1], s[2], s[3]], [s[2], s[3], s[4]]]
    det = _det3(normal)
    if not abs(det) > 1e-12 * s[0] ** 3:
        return None
    coef = []
    for column in range(3):  # Cramer: replace one column by the right-hand side
        m = [[t[r] if c == column else normal[r][c] for c in range(3)] for r in range(3)]
        coef.append(_det3(m) / det)
    a, b, c = coef[0], coef[1] / scale, coef[2] / scale**2
    abc = a + b + c
    if not (abc > 0 and math.isfinite(abc)):
        return None
    sigma = min(max((b + c) / abc, 0.0), 1.0)
    kappa = max(0.0, c / abc)
    return USLFit(sigma=sigma, kappa=kappa, lam=1.0 / abc)


def classify(p: float, fit: USLFit | None, ema: float, throttle_margin: float) -> str:
    """The regime of concurrency p under `fit`, given the throughput EMA (see the module docstring)."""
    if fit is None:
        return "optimal"
    p_star = fit.p_star
    if fit.kappa > EPS and p_star > 1.0 and p > throttle_margin * p_star:
        return "retrograde"
    predicted = fit.throughput(p)
    ratio = ema / predicted if predicted > EPS else 1.0
    if ratio > MEMORY_BOUND_RATIO:
        return "memory_bound"
    if ratio < RETROGRADE_RATIO:
        return "retrograde"
    return "optimal"


class USLBackPressure:
    """Warm-up sweep, windowed USL fit, throttle/increase with hysteresis; see the module docstring."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(excludes={"sampled_ahead": "backpressure=usl chooses each step's batch size from the steps "
                                                "before it, which have not trained when a step is sampled ahead: use "
                                                "backpressure=none"})

    def __init__(
        self,
        *,
        warmup_steps: int,
        min_batch_size: int,
        max_batch_size: int,
        window: int,
        ema_decay: float,
        throttle_margin: float,
        increase_margin: float,
        min_gain: float,
        patience: int,
    ) -> None:
        problems = []
        if min_batch_size < 1 or max_batch_size < min_batch_size:
            problems.append(f"backpressure.min_batch_size={min_batch_size}, max_batch_size={max_batch_size}: "
                            "need 1 <= min_batch_size <= max_batch_size")
        if window < 3:
            problems.append(f"backpressure.window={window} must be >= 3 (the fit has 3 unknowns)")
        if not 0.0 <= ema_decay < 1.0:
            problems.append(f"backpressure.ema_decay={ema_decay} must be in [0, 1)")
        if not 0.0 < throttle_margin <= 1.0:
            problems.append(f"backpressure.throttle_margin={throttle_margin} must be in (0, 1]")
        if not 0.0 < increase_margin <= 1.0:
            problems.append(f"backpressure.increase_margin={increase_margin} must be in (0, 1]")
        if not min_gain >= 0.0:
            problems.append(f"backpressure.min_gain={min_gain} must be >= 0")
        if patience < 1:
            problems.append(f"backpressure.patience={patience} must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        self.sweep = sweep_sizes(min_batch_size, max_batch_size)
        swept = sorted({self.sweep[s % len(self.sweep)] for s in range(warmup_steps)})
        if len(swept) < 3:
            raise ValueError(
                f"backpressure.warmup_steps={warmup_steps} sweeps {len(swept)} batch size(s) {swept} of {self.sweep}; "
                "the fit needs 3: raise warmup_steps or widen min_batch_size .. max_batch_size"
            )
        self.warmup_steps = warmup_steps
        self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
        self.window, self.ema_decay = window, ema_decay
        self.throttle_margin, self.increase_margin = throttle_margin, increase_margin
        self.min_gain, self.patience = min_gain, patience
        # state (state_dict): measurements, their fit, the batch size after the sweep, the pending action
        self.points: deque[tuple[float, float]] = deque(maxlen=window)
        self.ema: float | None = None
        self.fit: USLFit | None = None
        self.current: int | None = None
        """The batch size after the sweep once the controller has moved it (None: trainer.batch_size)."""
        self.pending, self.streak = "hold", 0

    def _clamp(self, batch_size: int) -> int:
        return min(max(batch_size, self.min_batch_size), self.max_batch_size)

    def batch_size(self, step: int, configured: int) -> int:
        if step < self.warmup_steps:
            return self.sweep[step % len(self.sweep)]
        return self.current if self.current is not None else self._clamp(configured)

    def observe(
        self, *, step: int, batch_size: int, group_size: int, tokens: int, seconds: float, skipped: bool
    ) -> dict[str, Any]:
        x = tokens / seconds if seconds > EPS else 0.0
        measured = not skipped and x > EPS
        if measured:
            self.ema = x if self.ema is None else self.ema_decay * self.ema + (1.0 - self.ema_decay) * x
            self.points.append((float(batch_size * group_size), x))
            self.fit = fit_usl(self.points) or self.fit
        warmup = step < self.warmup_steps
        if warmup:
            regime, applied = "warmup", "hold"
        else:
            regime, action, target = self.recommend(batch_size, group_size)
            applied = self._confirm(action, target) if measured else "hold"
        return self._metrics(warmup, applied, regime)

    def recommend(self, batch_size: int, group_size: int) -> tuple[str, str, int]:
        """(regime, action, target batch size) for a step of `batch_size` prompts, from the current fit."""
        fit, p = self.fit, batch_size * group_size
        regime = classify(p, fit, self.ema or 0.0, self.throttle_margin)
        if fit is None:
            return regime, "hold", batch_size
        lo, hi = self.min_batch_size * group_size, self.max_batch_size * group_size
        safe = min(max(self.throttle_margin * fit.p_star, lo), hi)
        target = self._clamp(int(safe // group_size))
        action = "hold"
        if regime == "retrograde" and target < batch_size:
            action = "throttle"
        elif p < self.increase_margin * safe and target > batch_size:
            action = "increase"
        if action != "hold" and not fit.throughput(target * group_size) >= (1.0 + self.min_gain) * fit.throughput(p):
            action = "hold"  # the fit promises too little for a move
        return regime, action, target

    def _confirm(self, action: str, target: int) -> str:
        """Apply `action` once it was recommended on `patience` consecutive measured steps; returns the
        action applied ("hold" while waiting)."""
        if action == "hold":
            self.pending, self.streak = "hold", 0
            return "hold"
        self.streak = self.streak + 1 if action == self.pending else 1
        self.pending = action
        if self.streak < self.patience:
            return "hold"
        self.current, self.pending, self.streak = target, "hold", 0
        return action

    def _metrics(self, warmup: bool, action: str, regime: str) -> dict[str, Any]:
        fit, ema = self.fit, self.ema or 0.0
        peak = fit.throughput(fit.p_star) if fit else 0.0
        utilization = 0.0 if warmup else (ema / peak if peak > EPS else 1.0)
        return {
            "bp_warmup": warmup,
            "bp_action": action,
            "bp_regime": regime,
            "bp_p_star": fit.p_star if fit else 1.0,
            "bp_sigma": fit.sigma if fit else 0.0,
            "bp_kappa": fit.kappa if fit else 0.0,
            "bp_utilization": utilization,
            "bp_throughput": ema,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "points": [list(point) for point in self.points],
            "ema": self.ema,
            "fit": None if self.fit is None else [self.fit.sigma, self.fit.kappa, self.fit.lam],
            "current": self.current,
            "pending": self.pending,
            "streak": self.streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the measurements, fit, batch size and pending action; a state from a run with a smaller
        `window` is fine, a larger one keeps its newest `window` points."""
        points = [(float(p), float(x)) for p, x in state.get("points", [])]
        if not all(math.isfinite(p) and math.isfinite(x) for p, x in points):
            raise ValueError(f"state['points'] must be finite (p, x) pairs, got {points}")
        fit = state.get("fit")
        if fit is not None and (len(fit) != 3 or not all(math.isfinite(float(v)) for v in fit)):
            raise ValueError(f"state['fit']={fit!r} must be null or three finite numbers")
        current = state.get("current")
        if current is not None and (isinstance(current, bool) or not isinstance(current, int) or current < 1):
            raise ValueError(f"state['current']={current!r} must be null or an int >= 1")
        pending, streak = state.get("pending", "hold"), state.get("streak", 0)
        if pending not in ACTIONS or isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
            raise ValueError(f"state['pending']={pending!r}, state['streak']={streak!r}: expected one of {ACTIONS} "
                             "and an int >= 0")
        ema = state.get("ema")
        self.points = deque(points, maxlen=self.window)
        self.ema = None if ema is None else float(ema)
        self.fit = None if fit is None else USLFit(*(float(v) for v in fit))
        self.current = None if current is None else self._clamp(current)
        self.pending, self.streak = pending, streak
