"""The SEPA controller: how strongly SEPA reshapes execution-token uncertainty at each step
(docs/algorithms.md#sepa-controller).

    linear(step) = 0                                  if steps ≤ 0 or step − delay_steps ≤ 0
                 = min((step − delay_steps) / steps, 1)
    auto()       = 0                                  until var_0 is known
                 = 1 − min(max(0, var_ema / max(var_0, eps)) / max(var_threshold, eps), 1)
    λ(step)      = 0                                  while the correctness gate is closed
                 = max(auto(), linear(step))          schedule == "auto" (linear is the floor)
                 = linear(step)                       schedule == "linear"

eps = 1e-8. Gate: open from the start when `correct_rate_gate` ≤ 0; otherwise it opens the first time a
step's correct rate (fraction of completions with reward > 0.5) is ≥ the gate, and stays open (sticky);
a None/NaN/inf correct rate is ignored. retrain's defaults, which the YAML states (steps 500, delay_steps
50, correct_rate_gate 0.1), give λ = 0 up to step 50, then (step − 50)/500, reaching 1 at step 550, once
some step has reached a 10 % correct rate.

Auto state, per completion (only with schedule == "auto"): the completion's execution tokens' sampled
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
  * `state_dict` records the configuration next to the state; `load_state_dict` restores only the state
    (var_ema, var_0, warmup_seen, gate_open) — the resumed run's YAML is the configuration, as in retrain.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import

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


class SEPAController:
    """λ schedule + correctness gate + auto-schedule state; see the module docstring."""

    def __init__(
        self,
        *,
        steps: int,
        schedule: str,
        delay_steps: int,
        correct_rate_gate: float,
        ema_decay: float,
        var_threshold: float,
        warmup_sequences: int,
    ) -> None:
        if steps < 0:
            raise ValueError(f"steps={steps} must be >= 0")
        if delay_steps < 0:
            raise ValueError(f"delay_steps={delay_steps} must be >= 0")
        if not 0.0 <= correct_rate_gate <= 1.0:
            raise ValueError(f"correct_rate_gate={correct_rate_gate} must be in [0, 1]")
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"ema_decay={ema_decay} must be in [0, 1]")
        if not var_threshold > 0.0:
            raise ValueError(f"var_threshold={var_threshold} must be > 0")
        if warmup_sequences < 1:
            raise ValueError(f"warmup_sequences={warmup_sequences} must be >= 1")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is not one of {list(SCHEDULES)}")
        self.steps = int(steps)
        self.schedule = schedule
        self.delay_steps = int(delay_steps)
        self.correct_rate_gate = float(correct_rate_gate)
        self.ema_decay = float(ema_decay)
        self.var_threshold = float(var_threshold)
        self.warmup_sequences = int(warmup_sequences)
        self.var_ema: float | None = None
        self.var_0: float | None = None
        self.warmup_seen = 0
        self.gate_open = self.correct_rate_gate <= 0.0

    @property
    def enabled(self) -> bool:
        """False when λ can never leave 0 (linear schedule with steps = 0)."""
        return self.steps > 0 or self.schedule == "auto"

    def linear_lambda(self, step: int) -> float:
        if self.steps <= 0:
            return 0.0
        shifted = step - self.delay_steps
        if shifted <= 0:
            return 0.0
        return min(shifted / self.steps, 1.0)

    def auto_lambda(self) -> float:
        if self.schedule != "auto" or self.var_ema is None or self.var_0 is None:
            return 0.0
        ratio = max(0.0, self.var_ema / max(self.var_0, SEPA_EPS))
        return 1.0 - min(ratio / max(self.var_threshold, SEPA_EPS), 1.0)

    def resolve_lambda(self, step: int) -> float:
        """λ ∈ [0, 1] for RL step `step`, from the state left by earlier steps."""
        if not self.gate_open:
            return 0.0
        if self.schedule == "auto":
            return max(self.auto_lambda(), self.linear_lambda(step))
        return self.linear_lambda(step)

    def observe_correct_rate(self, correct_rate: float | None) -> None:
        """Open the gate (for good) once a step's correct rate reaches `correct_rate_gate`."""
        if self.gate_open or correct_rate is None or not math.isfinite(correct_rate):
            return
        if correct_rate >= self.correct_rate_gate:
            self.gate_open = True

    def update_auto_state(self, logprobs_PG_T: Tensor, exec_PG_T: Tensor) -> None:
        """Fold one step's completions into the auto state (a no-op unless schedule == 'auto').

        `logprobs_PG_T` are the sampled tokens' log-probabilities (surprisal s = −logprob);
        `exec_PG_T` marks execution tokens (real completion tokens outside the planning mask)."""
        if self.schedule != "auto":
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
            need = max(1, self.warmup_sequences - self.warmup_seen)
            if need <= v_K.numel():
                self.var_0 = max(_ema_after(var_ema_0, v_K[:need], self.ema_decay), SEPA_EPS)
                self.warmup_seen += need
            else:
                self.warmup_seen += v_K.numel()
        self.var_ema = _ema_after(var_ema_0, v_K, self.ema_decay)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "schedule": self.schedule,
            "delay_steps": self.delay_steps,
            "correct_rate_gate": self.correct_rate_gate,
            "ema_decay": self.ema_decay,
            "var_threshold": self.var_threshold,
            "warmup_sequences": self.warmup_sequences,
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
