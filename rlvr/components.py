"""What a run is made of once built: the light components built from the composed config (`Components`, by
rlvr/build.py), the loop's working set once the policy is loaded (`Live`, by rlvr/start.py), and one step's data as
it flows through the step's stages (`StepState`, each `Stage`: rlvr/stages/). The stages read them; none builds
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rlvr.distributed import World

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.backpressure import BackPressure
    from rlvr.checkpoint import Checkpoints
    from rlvr.credit import Credit
    from rlvr.distill.distill import Distill
    from rlvr.echo.echo import Echo
    from rlvr.env.guarded import GuardedEnvironment
    from rlvr.outputs import RunDir
    from rlvr.overlap import Job, SampleAhead, SampleInline
    from rlvr.preemption import StopSignals
    from rlvr.protocols import (
        Algorithm,
        Backend,
        DataSource,
        Engine,
        Logger,
        ModelPreset,
        Needs,
        PlanningDetector,
        Reward,
        Rollout,
        Transform,
        TurnCredit,
    )
    from rlvr.seeds import Seeds
    from rlvr.telemetry import StepCounts, StepTimes, Stopwatch
    from rlvr.types import Example, StepBatch, TokenSignals


@dataclass
class Components:
    """What rlvr/build.py builds from the config and hands to the loop."""

    preset: ModelPreset
    data: DataSource
    reward: Reward
    algorithm: Algorithm
    transform: Transform
    planning: PlanningDetector
    logger: Logger
    backpressure: BackPressure
    """How many prompts each step draws (backpressure=none: trainer.batch_size)."""
    make_backend: Callable[..., Backend]
    make_engine: Callable[..., Engine]
    condition: str
    """The condition label, from the composed config (rlvr/labels.py: maxrl+sepa, grpo+none,loss=kl_cov); it names
    the run everywhere: metrics rows, summary.json, logger runs, `rlvr status/compare/plot`."""
    uncertainty_kind: str | None
    """The token signal the transform reads (surprisal, …), logged with every row."""
    seeds: Seeds
    config: dict
    """The composed config, resolved (stored in checkpoints: a resume compares against it)."""
    config_sha256: str
    needs: dict[str, Needs]
    """Each group's declared needs (rlvr/protocols.py), as rlvr.run checked them."""
    env: GuardedEnvironment | None = None
    """Multi-turn: the environment episodes are played in (bounded, rlvr/env/guarded.py); None: single turn."""
    turn_credit: TurnCredit | None = None
    """Multi-turn: how an episode's reward becomes token advantages (rlvr/turn_credit/)."""
    world: World = field(default_factory=World.single)
    """This process's place in the run's processes (rlvr/distributed.py); one process is a world of size 1."""
    echo: Echo | None = None
    """echo=on: the auxiliary loss on observation tokens (rlvr/echo/echo.py); None: echo=none."""
    distill: Distill | None = None
    """distill=teacher|server: the frozen teacher whose per-token log-ratio joins the credit (rlvr/distill/)."""
    stages: list[Stage] = field(default_factory=list)
    """The step, as the ordered stages it runs (rlvr/stages/), built once with the trainer."""

    @property
    def remote(self) -> bool:
        """The backend keeps the policy on a service (Tinker): only the tokenizer is loaded here."""
        return "remote_policy" in self.needs["backend"].provides

    @property
    def distributed(self) -> bool:
        """The backend trains over a process group (backend=fsdp), which the run joins first."""
        return "distributed" in self.needs["backend"].provides

    @property
    def wants_entropy(self) -> bool:
        """The transform reads the full-distribution entropy at each sampled token."""
        return "entropy" in self.needs["transform"].requires

    @property
    def engine_entropy(self) -> bool:
        """The engine gives those entropies while it samples; when it cannot, the backend does (`EntropyBackend`)."""
        return self.wants_entropy and "entropy" in self.needs["engine"].provides

    @property
    def wants_self_teacher(self) -> bool:
        """The transform reads the self-teacher's log-probabilities (transform=sdpo|sdft)."""
        return "self_scoring" in self.needs["transform"].requires

    @property
    def wants_planning(self) -> bool:
        """The transform reads the planning-token marks."""
        return "planning_mask" in self.needs["transform"].requires


@dataclass
class Live:
    """The loop's working set once the policy is built (rlvr/start.py `start`)."""

    c: Components
    tokenizer: object
    backend: Backend
    engine: Engine
    rollout: Rollout
    """How a step's examples become scored rows (rlvr/rollout/)."""
    out: RunDir
    warmup: dict | None
    checkpoints: Checkpoints
    totals: dict = field(
        default_factory=lambda: {"correct": 0, "completions": 0, "tokens": 0, "nonfinite": 0, "prompts": 0}
    )
    """Running counters; saved in every checkpoint. `prompts`: training examples drawn so far (the position of
    the next step's first prompt in the data stream)."""
    evals: list[dict] = field(default_factory=list)
    """Every evaluation row so far; saved in every checkpoint (summary.json's initial/best read it)."""
    stop: StopSignals | None = None
    clock: dict = field(default_factory=lambda: {"wall": 0.0, "rl": 0.0, "t_start": 0.0, "t_rl": None})
    """Seconds of the run's earlier segments (a resumed run's summary covers them all) and this one's starts."""
    sampler: SampleInline | SampleAhead | None = None
    """Where each step's rollouts come from (rlvr/overlap.py), from the first RL step on."""
    restored_jobs: list[Job] = field(default_factory=list)
    """A checkpoint's steps sampled but not yet trained (trainer.off_policy_steps ≥ 1)."""


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
