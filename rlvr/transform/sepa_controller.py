"""The SEPA controller: how strongly SEPA reshapes execution-token uncertainty at each step
(docs/algorithms.md#sepa-controller). Its settings are `LambdaSchedule`, the node `transform.schedule`
(conf/lambda_schedule.yaml) that transform=sepa*, delight_sepa and hard_delight share; below, `kind`,
`steps`, … are its keys.

    linear(step) = 0                                  if steps ≤ 0 or step − delay_steps ≤ 0
                 = min((step − delay_steps) / steps, 1)
    auto()       = 0                                  until var_0 is known
                 = 1 − min(max(0, var_ema / max(var_0, eps)) / max(var_threshold, eps), 1)
    λ(step)      = 0                                  while the correctness gate is closed
                 = max(auto(), linear(step))          kind == "auto" (linear is the floor)
                 = linear(step)                       kind == "linear"

eps = 1e-8. Gate: open from the start when `correct_rate_gate` ≤ 0; otherwise it opens the first time a
step's correct rate (fraction of completions with reward > 0.5) is ≥ the gate, and stays open (sticky);
a None/NaN/inf correct rate is ignored. retrain's defaults, which the YAML states (steps 500, delay_steps
50, correct_rate_gate 0.1), give λ = 0 up to step 50, then (step − 50)/500, reaching 1 at step 550, once
some step has reached a 10 % correct rate. `fixed_lambda` (null, or λ ∈ [0, 1]; retrain's `delight_lambda`)
is the λ a transform trains with instead of λ(step); the controller still steps, and reports λ(step).

Auto state, per completion (only with kind == "auto"): the completion's execution tokens' sampled
surprisals s = −logprob (not clipped; values that are non-finite, negative or above sqrt(float max)
are dropped; a completion with none left is skipped) give its population variance v, and

    var_ema ← v                       for the first completion ever seen
    var_ema ← d·var_ema + (1 − d)·v   after that (d = ema_decay)
    while var_0 is unset: warmup_seen += 1, and once it reaches warmup_sequences var_0 = max(var_ema, eps)

A step's completions are folded in row order (prompt-major), all of them, tied groups included. The
recursion is evaluated in closed form, var_ema_k = d^k·var_ema_0 + (1 − d)·Σ_j d^(k−j)·v_j, as one dot
product over the step's completions (no Python loop over sequences); it equals the sequential
recursion up to float64 rounding.

Predecessor quirks, decided deliberately:
  * λ for step t is resolved from the state left by steps < t, *before* step t's correct rate is
    observed and its auto state folded in (retrain resolved λ before sampling). Kept: λ is then a
    function of the past only, so a resumed or replayed run recomputes it exactly. Consequence: the step
    on which the gate opens still trains with λ = 0, and its `sepa_gate_open` metric (the gate *after*
    observing, as retrain logged it) already reads 1.
  * The auto warm-up and EMA count *sequences*, not steps (retrain called its update once per sequence).
    Kept for fidelity, and named for it: `warmup_sequences` (retrain's 50 is less than one step of 8 × 16
    completions, and d = 0.99 per sequence is a horizon of ≈ 100 sequences). Unlike retrain, `ema_decay`,
    `var_threshold` and `warmup_sequences` are YAML knobs, so a per-step horizon can be had by scaling
    them (e.g. warmup_sequences = 50·P·G, ema_decay = 0.99^(1/(P·G))).
  * The auto schedule watches sampled-token surprisal whatever `uncertainty` the transform weights by,
    as retrain did.
  * `state_dict` records the configuration next to the state (under its names of the earlier flat layout:
    "schedule" is the kind; `fixed_lambda` is not recorded); `load_state_dict` restores only the state
    (var_ema, var_0, warmup_seen, gate_open) — the resumed run's YAML is the configuration, as in retrain.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.hydra_errors import renamed
from rlvr.lazy import lazy_import
from rlvr.transform import knobs

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


SEPA_EPS = 1e-8
SCHEDULES = ("linear", "auto")
_MAX_SAFE_SURPRISAL = math.sqrt(sys.float_info.max)


def _ema_after(var_ema_0: float, v_K: Tensor, decay: float) -> float:
    """var_ema after folding v_1..v_K into var_ema_0, in closed form (float64)."""
    k = v_K.numel()
    powers_K = torch.pow(
        torch.tensor(decay, dtype=torch.float64), torch.arange(k - 1, -1, -1, dtype=torch.float64)
    )
    return float(decay**k * var_ema_0 + (1.0 - decay) * torch.dot(powers_K, v_K))


@dataclass(frozen=True)
class LambdaSchedule:
    """`transform.schedule`: the λ schedule's settings (conf/lambda_schedule.yaml, which states the defaults), shared
    by transform=sepa*, delight_sepa and hard_delight. Types and ranges are checked here, a wrong one named as it is
    overridden (`transform.schedule.steps=-1 must be >= 0`); see the module docstring for what each key does."""

    kind: str                   # linear | auto
    steps: int                  # linear ramp length in RL steps after the delay, >= 0 (0 = no ramp)
    delay_steps: int            # λ = 0 through this RL step, >= 0
    correct_rate_gate: float    # in [0, 1]; 0 = the gate is open from the start
    ema_decay: float            # auto: in [0, 1]
    var_threshold: float        # auto: > 0
    warmup_sequences: int       # auto: >= 1
    fixed_lambda: float | None  # null, or the λ ∈ [0, 1] a transform trains with instead of λ(step)

    def __post_init__(self) -> None:
        checked = dict(
            kind=knobs.choice("schedule.kind", self.kind, SCHEDULES),
            steps=knobs.integer("schedule.steps", self.steps, low=0),
            delay_steps=knobs.integer("schedule.delay_steps", self.delay_steps, low=0),
            correct_rate_gate=knobs.number("schedule.correct_rate_gate", self.correct_rate_gate, low=0.0, high=1.0),
            ema_decay=knobs.number("schedule.ema_decay", self.ema_decay, low=0.0, high=1.0),
            var_threshold=knobs.number("schedule.var_threshold", self.var_threshold, low=0.0, low_open=True),
            warmup_sequences=knobs.integer("schedule.warmup_sequences", self.warmup_sequences, low=1),
            fixed_lambda=knobs.optional_number("schedule.fixed_lambda", self.fixed_lambda, low=0.0, high=1.0),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def lambda_schedule(schedule: Any) -> LambdaSchedule:
    """A transform's `schedule` argument, which Hydra builds from the `transform.schedule` node. A scalar there is
    the schedule's kind under its name of the earlier flat layout (`transform.schedule=auto`): named so."""
    if isinstance(schedule, LambdaSchedule):
        return schedule
    hint = renamed("transform.schedule", schedule) if isinstance(schedule, str) else None
    raise ValueError(f"transform.schedule={schedule!r}: " + (
        hint or "must be the λ schedule's node (kind, steps, delay_steps, …: a LambdaSchedule)"))


class SEPAController:
    """λ schedule + correctness gate + auto-schedule state; see the module docstring."""

    def __init__(self, schedule: LambdaSchedule) -> None:
        self.schedule = lambda_schedule(schedule)
        self.var_ema: float | None = None
        self.var_0: float | None = None
        self.warmup_seen = 0
        self.gate_open = self.schedule.correct_rate_gate <= 0.0

    @property
    def enabled(self) -> bool:
        """False when λ can never leave 0 (linear schedule with steps = 0)."""
        return self.schedule.steps > 0 or self.schedule.kind == "auto"

    def linear_lambda(self, step: int) -> float:
        steps = self.schedule.steps
        if steps <= 0:
            return 0.0
        shifted = step - self.schedule.delay_steps
        if shifted <= 0:
            return 0.0
        return min(shifted / steps, 1.0)

    def auto_lambda(self) -> float:
        if self.schedule.kind != "auto" or self.var_ema is None or self.var_0 is None:
            return 0.0
        ratio = max(0.0, self.var_ema / max(self.var_0, SEPA_EPS))
        return 1.0 - min(ratio / max(self.schedule.var_threshold, SEPA_EPS), 1.0)

    def resolve_lambda(self, step: int) -> float:
        """λ ∈ [0, 1] for RL step `step`, from the state left by earlier steps."""
        if not self.gate_open:
            return 0.0
        if self.schedule.kind == "auto":
            return max(self.auto_lambda(), self.linear_lambda(step))
        return self.linear_lambda(step)

    def observe_correct_rate(self, correct_rate: float | None) -> None:
        """Open the gate (for good) once a step's correct rate reaches `correct_rate_gate`."""
        if self.gate_open or correct_rate is None or not math.isfinite(correct_rate):
            return
        if correct_rate >= self.schedule.correct_rate_gate:
            self.gate_open = True

    def update_auto_state(self, logprobs_PG_T: Tensor, exec_PG_T: Tensor) -> None:
        """Fold one step's completions into the auto state (a no-op unless kind == 'auto').

        `logprobs_PG_T` are the sampled tokens' log-probabilities (surprisal s = −logprob);
        `exec_PG_T` marks execution tokens (real completion tokens outside the planning mask)."""
        if self.schedule.kind != "auto":
            return
        s = -logprobs_PG_T.detach().to(torch.float64)
        valid = exec_PG_T & torch.isfinite(s) & (s >= 0.0) & (s <= _MAX_SAFE_SURPRISAL)
        n_PG = valid.sum(-1)
        mean_PG = torch.where(valid, s, 0.0).sum(-1) / n_PG.clamp(min=1)
        dev = torch.where(valid, s - mean_PG[:, None], 0.0)
        var_PG = (dev * dev).sum(-1) / n_PG.clamp(min=1)
        v_K = var_PG[(n_PG > 0) & torch.isfinite(var_PG)].cpu()  # [≤ P·G] on the CPU: the state is floats
        if v_K.numel() == 0:
            return
        var_ema_0 = self.var_ema if self.var_ema is not None else float(v_K[0])
        if self.var_0 is None:
            need = max(1, self.schedule.warmup_sequences - self.warmup_seen)
            if need <= v_K.numel():
                self.var_0 = max(_ema_after(var_ema_0, v_K[:need], self.schedule.ema_decay), SEPA_EPS)
                self.warmup_seen += need
            else:
                self.warmup_seen += v_K.numel()
        self.var_ema = _ema_after(var_ema_0, v_K, self.schedule.ema_decay)

    def state_dict(self) -> dict[str, Any]:
        s = self.schedule  # the configuration under its names of the earlier flat layout ("schedule" = the kind)
        return {
            "steps": s.steps,
            "schedule": s.kind,
            "delay_steps": s.delay_steps,
            "correct_rate_gate": s.correct_rate_gate,
            "ema_decay": s.ema_decay,
            "var_threshold": s.var_threshold,
            "warmup_sequences": s.warmup_sequences,
            "var_ema": self.var_ema,
            "var_0": self.var_0,
            "warmup_seen": self.warmup_seen,
            "gate_open": self.gate_open,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore var_ema, var_0, warmup_seen and gate_open; configuration keys are ignored."""
        var_ema, var_0 = (_optional_finite(state, key) for key in ("var_ema", "var_0"))
        warmup_seen = state.get("warmup_seen", 0)
        if isinstance(warmup_seen, bool) or not isinstance(warmup_seen, int) or warmup_seen < 0:
            raise ValueError(f"state['warmup_seen']={warmup_seen!r} must be an int >= 0")
        gate_open = state.get("gate_open")
        if not isinstance(gate_open, bool):
            raise ValueError(f"state['gate_open']={gate_open!r} must be a bool")
        self.var_ema, self.var_0, self.warmup_seen, self.gate_open = var_ema, var_0, warmup_seen, gate_open


def _optional_finite(state: dict[str, Any], key: str) -> float | None:
    value = state.get(key)
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"state[{key!r}]={value} must be finite or None")
    return value
