"""What a run is made of once built: the light components built from the composed config (`Components`, by
rlvr/build.py) and the loop's working set once the policy is loaded (`Live`, by rlvr/start.py). Every stage of the
step (rlvr/stages/) reads them; none builds them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlvr.distributed import World

if TYPE_CHECKING:
    from rlvr.backpressure import BackPressure
    from rlvr.checkpoint import Checkpoints
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
    from rlvr.stages import Stage


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
