"""One RL step as an ordered list of stages over one `StepState`, built once per run (rlvr/build.py `stages`):

    collect   Collect          the step's examples sampled (now, or ahead: rlvr/overlap.py) and scored
    shape     OverlongShaping  DAPO's soft overlong punishment on the rewards (trainer.overlong)
    select    Select           dynamic sampling: tied groups kept, dropped, or refilled (trainer.dynamic_sampling)
    shape     RewardKL         the reference KL folded into the rewards (algorithm.loss.kl_in_reward)
    credit    CreditStage      token signals → advantages (algorithm, transform, turn credit), overlong filter,
                               echo's targets
    train     Train            the backend's update (trainer.capture_steps: written down for `rlvr replay`)
    observe   DataObserver     a data source that learns from the scored rows (data=discover's archive)
              NonfiniteGuard   a step whose update was not applied is counted; too many in a row stop the run
              FailureWarning   scoring failures over trainer.reward_warn_frac are said
              Samples          samples/: the first groups of the step
              SyncGuard        is the engine sampling from the trainer's weights? (trainer.sync_check)
              BackPressureStage how many prompts the next step draws (backpressure=usl)
              LearningGuard    a run that cannot learn fails (trainer.max_skipped_steps, max_failed_steps)
    record    Record           the metrics row: metrics.jsonl and the logger

Each stage owns its config node (the component or settings it is built from), one `apply`, the row fields it
writes (`fields`, declared: docs/metrics.md lists them) and its checkpoint state (`state_dict`, whose keys are
top-level keys of the checkpoint's state). A stage reads what earlier stages left in the `StepState` and adds its
own; the trainer (rlvr/trainer.py) runs them in order and never asks what they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.components import Live
    from rlvr.credit import Credit
    from rlvr.overlap import Job
    from rlvr.telemetry import StepCounts, StepTimes, Stopwatch
    from rlvr.types import Example, StepBatch, TokenSignals


class Stage(Protocol):
    fields: ClassVar[tuple[str, ...]]
    """The row fields this stage writes (a trailing `*`: a family, e.g. `dynamic/*`)."""

    def apply(self, s: StepState) -> None:
        """Read what the earlier stages left in `s`, add this stage's part."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """This stage's part of the checkpoint (top-level keys of its state), {} when it keeps none."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (the whole state: each stage reads its own keys)."""
        ...


class Stateless:
    """A stage that keeps nothing across steps."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class StepState:
    """One step's data as it flows through the stages (each field written by the stage named)."""

    live: Live
    step: int
    clock: Stopwatch
    examples: list[Example] = field(default_factory=list)
    """collect (select: the kept groups' examples)."""
    prompts: int = 0
    """collect: the prompts the step drew first (dynamic sampling may keep fewer, or refill more)."""
    job: Job | None = None
    """collect: the sampled job (its version: the weights it was sampled from)."""
    wait_s: float = 0.0
    """collect: seconds the step waited for its rollouts (syncs and sampling)."""
    batch: StepBatch | None = None
    """collect, shaped and selected by the stages after it."""
    rewards_P_G: Tensor | None = None
    """shape (RewardKL): the rewards credit reads (the batch's, less the KL when folded in)."""
    signals: TokenSignals | None = None
    """credit: what the transform read."""
    pieces_PG: list[list[str]] | None = None
    """credit: the token pieces the planning marks were read from (None without them)."""
    credit: Credit | None = None
    """credit."""
    credit_s: float = 0.0
    train: dict[str, Any] = field(default_factory=dict)
    """train: the backend's statistics ({} on a skipped step)."""
    times: StepTimes | None = None
    """train."""
    counts: StepCounts | None = None
    """record (Samples): what the step adds to the running totals."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Row fields of the stages, in the order they ran."""
    failure: str | None = None
    """observe (LearningGuard): why the run cannot learn, after this step's row is written."""
    row: dict[str, Any] = field(default_factory=dict)
    """record: the step's metrics row."""

    @property
    def scored(self) -> StepBatch:
        assert self.batch is not None, "collect runs first"
        return self.batch


def run(stages: list[Stage], s: StepState) -> StepState:
    for stage in stages:
        stage.apply(s)
    return s


def declared_fields(stages: list[Stage]) -> list[str]:
    """Every row field the stages write, in the order they run."""
    return [name for stage in stages for name in stage.fields]
