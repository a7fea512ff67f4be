"""observe: what watches a trained step. A data source that learns from the scored rows (data=discover), the
guards (a non-applied update, scoring failures, a stale engine, a run that cannot learn), samples/, and back
pressure's choice of the next step's prompts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from rlvr.backpressure import BackPressure
from rlvr.engine.sync_check import SyncCheck, SyncWatch
from rlvr.outputs import RunDir
from rlvr.stages import Stateless, StepState
from rlvr.telemetry import sample_groups
from rlvr.types import StepBatch

log = logging.getLogger("rlvr")


class ObservingSource(Protocol):
    """A data source whose next prompts depend on the rows scored so far (its `needs` provides `observes_steps`)."""

    def observe_step(self, batch: StepBatch, out: RunDir) -> dict[str, float]: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


class DataObserver:
    """The step's scored rows given to such a source; its state (data=discover: the archive) is checkpointed."""

    fields: ClassVar[tuple[str, ...]] = ("discover/*",)

    def __init__(self, data: ObservingSource) -> None:
        self.data = data

    def apply(self, s: StepState) -> None:
        s.fields.update(self.data.observe_step(s.scored, s.live.out))

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.data.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.load_state(state.get("data", {}))


class NonfiniteGuard(Stateless):
    """A step the backend did not apply is counted (`train/nonfinite_skips`): its loss or gradient norm was not
    finite (skipped), or its update made a trainable weight non-finite (rolled back, rlvr/backend/local.py `Undo`);
    `max_skips` in a row stop the run, on the last good step's weights."""

    fields: ClassVar[tuple[str, ...]] = ("train/nonfinite_skips",)

    def __init__(self, max_skips: int) -> None:
        self.max_skips, self.in_a_row = max_skips, 0

    def apply(self, s: StepState) -> None:
        train, totals = s.train, s.live.totals
        if train.get("train/nonfinite_skip"):
            totals["nonfinite"] += 1
            self.in_a_row += 1
            what = ("the update made a trainable weight non-finite (loss %s, grad norm %s): rolled back to the step's "
                    "starting weights and optimizer state") if train.get("train/nonfinite_weights") else (
                "loss %s, grad norm %s: optimizer step skipped")
            log.warning("step %d: " + what, s.step, train["loss"], train["grad_norm"])
            if self.in_a_row >= self.max_skips:
                raise FloatingPointError(
                    f"{self.in_a_row} consecutive steps (up to step {s.step}) had a non-finite loss, gradient or "
                    f"updated weights (trainer.max_nonfinite_skips={self.max_skips}); the weights are those of the "
                    "last good step. Lower trainer.lr, set backend.grad_clip_norm, or check the model's dtype (AdamW "
                    "in float16 divides by its eps, 0 in float16).")
        else:
            self.in_a_row = 0
        s.fields["train/nonfinite_skips"] = float(totals["nonfinite"])


class FailureWarning(Stateless):
    """A warning when a failure fraction (reward/timeout_frac, env/error_frac, …) exceeds trainer.reward_warn_frac:
    those completions or episodes scored 0.0; the batch says where to look."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, warn_frac: float) -> None:
        self.warn_frac = warn_frac

    def apply(self, s: StepState) -> None:
        batch = s.scored
        over = {k: v for k, v in batch.failures.items() if v > self.warn_frac}
        if over:
            log.warning(
                "step %d: %s above trainer.reward_warn_frac=%g: those %s scored 0.0, so the rewards (and the "
                "advantages) are wrong; check %s",
                s.step, ", ".join(f"{k}={v:.2f}" for k, v in over.items()), self.warn_frac, batch.what, batch.check,
            )


class Samples(Stateless):
    """samples/: the step's first `groups` groups, with rewards, advantages and the signals the transform read."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, groups: int) -> None:
        self.groups = groups

    def apply(self, s: StepState) -> None:
        batch = s.scored
        assert s.credit is not None and s.signals is not None, "credit runs first"
        s.live.out.write_samples(s.step, sample_groups(s.examples[: self.groups], batch.completions,
                                                       batch.rewards_P_G, s.credit, s.signals, s.pieces_PG,
                                                       batch.turns))


class SyncGuard(Stateless):
    """On a step sampled at its own version (on-policy) whose backend compared the engine's log-probabilities of its
    sampled tokens with its own (`mismatch/abs_log_ratio`): the row's `engine/sync_*`, or StaleEngineError
    (rlvr/engine/sync_check.py)."""

    fields: ClassVar[tuple[str, ...]] = ("engine/sync_delta", "engine/sync_allowed")

    def __init__(self, check: SyncCheck) -> None:
        self.check = check
        self.watch: SyncWatch | None = None

    def apply(self, s: StepState) -> None:
        delta = s.train.get("mismatch/abs_log_ratio")
        assert s.job is not None, "collect runs first"
        if s.job.version != s.step or delta is None:
            return
        if self.watch is None:
            self.watch = SyncWatch(self.check, type(s.live.engine).__name__)
        s.fields.update(self.watch.observe(s.step, delta))


class BackPressureStage:
    """How many prompts the next step draws, from this one's tokens and seconds (backpressure=usl)."""

    fields: ClassVar[tuple[str, ...]] = ("backpressure/*",)

    def __init__(self, backpressure: BackPressure, group_size: int) -> None:
        self.backpressure, self.group_size = backpressure, group_size

    def apply(self, s: StepState) -> None:
        assert s.counts is not None and s.times is not None and s.credit is not None, "train runs first"
        s.fields.update(self.backpressure.observe(  # its decision applies from the next step
            step=s.step, batch_size=s.prompts, group_size=self.group_size, tokens=s.counts.tokens,
            seconds=s.times.total, skipped=s.credit.skipped))

    def state_dict(self) -> dict[str, Any]:
        return {"backpressure": self.backpressure.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.backpressure.load_state_dict(state.get("backpressure", {}))


class LearningGuard:
    """Counts the steps in a row with nothing to train and those on which every item's scoring failed; past their
    limits, `s.failure` says why (the trainer checkpoints and fails the run once the step's row is written)."""

    fields: ClassVar[tuple[str, ...]] = ("skip_cause",)

    def __init__(self, max_skipped: int, max_failed: int) -> None:
        self.max_skipped, self.max_failed = max_skipped, max_failed
        self.skipped, self.failed = 0, 0

    def apply(self, s: StepState) -> None:
        metrics, credit = s.scored.metrics, s.credit
        assert credit is not None, "credit runs first"
        failed = any(metrics.get(f"{p}/error_frac", 0.0) + metrics.get(f"{p}/timeout_frac", 0.0) >= 1.0
                     for p in ("reward", "env"))  # single turn: the verifier; episodes: the environment
        self.failed = self.failed + 1 if failed else 0
        self.skipped = self.skipped + 1 if credit.skipped else 0
        if credit.skipped:
            s.fields["skip_cause"] = skip_cause(s.scored.rewards_P_G)
        if self.max_failed and self.failed >= self.max_failed:
            s.failure = (f"every item's scoring failed (errors or timeouts) on {self.failed} consecutive steps "
                         f"(trainer.max_failed_steps={self.max_failed}): the verifier cannot score this run's "
                         "completions; check it (train.log names its first error of each step)")
        elif self.max_skipped and self.skipped >= self.max_skipped:
            s.failure = (f"nothing to train on {self.skipped} consecutive steps "
                         f"(trainer.max_skipped_steps={self.max_skipped}): {s.fields['skip_cause']}")

    def state_dict(self) -> dict[str, Any]:
        return {"progress": {"consecutive_skipped": self.skipped, "consecutive_failed": self.failed}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        progress = state.get("progress", {})  # absent in checkpoints written before it was saved
        self.skipped = progress.get("consecutive_skipped", 0)
        self.failed = progress.get("consecutive_failed", 0)


def skip_cause(rewards_P_G: Any) -> str:
    """Why a step had nothing to train, in words: its groups' rewards tied (at which values), or the credit
    gave no token a non-zero advantage."""
    tied = bool((rewards_P_G == rewards_P_G[:, :1]).all())
    if not tied:
        return "the rewards differed within some group, but the credit gave no token a non-zero advantage"
    values = sorted({round(float(v), 6) for v in rewards_P_G[:, 0]})
    if values == [0.0]:
        return ("every completion scored 0.0: the policy solves none of the prompts it draws (an easier task, a "
                "warm-up with trainer.warmup.steps, a larger trainer.group_size, or a check of the reward)")
    if len(values) == 1:
        return f"every completion scored {values[0]:g}: nothing left to tell apart (a harder task?)"
    return (f"every group's completions scored alike (rewards {', '.join(f'{v:g}' for v in values[:5])} by group): "
            "sampling gives no variety (trainer.sampling.temperature, top_p) or the reward is too coarse")
