"""The seams between config groups, as Protocols. Implementations do not inherit from these.

Every component class (the `_target_` of a config group's option) also says what it needs and gives, in one
shape: `needs(settings) -> Needs`, a classmethod of its YAML settings, read before anything is built.
`rlvr/config_check.py` pairs the chosen components by it (every capability one of them requires must be provided by
another) and checks the machine requirements marked `at_start` before any model loads; `rlvr doctor` checks
every requirement. A new component with a new requirement declares it in its own `needs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PreTrainedModel

    from rlvr.types import (
        Branching,
        Demonstration,
        Example,
        LoraSpec,
        Rollouts,
        Sampled,
        SamplingParams,
        Scores,
        Step,
        StepBatch,
        TokenSignals,
        TrainBatch,
        TurnSignals,
    )


@dataclass(frozen=True)
class Capability:
    """Something one chosen component gives the others."""

    meaning: str
    how: str = ""
    """What to do when nothing chosen gives it: after the options that do (`groups`), or alone when they depend on
    values (a setting to change)."""
    groups: tuple[str, ...] = ()
    """The config groups whose options may give it by their own values: the options that do are read from their
    files when it is missing (rlvr/providers.py), so an option added to conf/ or a search-path folder is named."""


CAPABILITIES: dict[str, Capability] = {
    "entropy": Capability("full-distribution entropy at each sampled position",
                          "(the backend computes them in a no-grad pass)", ("engine", "backend")),
    "local_policy": Capability("the policy as a module in this process", "(and an engine that samples from it)",
                               ("backend",)),
    "remote_policy": Capability("a policy held by a service to sample from", "(with its engine of the same name)",
                                ("backend",)),
    "lora": Capability("a LoRA adapter to train", "choose a model preset with model.lora set"),
    "ratio_clipping": Capability("PPO ratio clipping in the loss",
                                 "(or backend=tinker with backend.loss_fn=ppo or cispo)", ("backend",)),
    "local_loss": Capability("the local loss, computed token by token in this process",
                             "(a service computes its loss with its own loss_fn: no kl_cov or clip_cov, no gspo, no "
                             "entropy bonus; Tinker's own cispo is backend.loss_fn=cispo)", ("backend",)),
    "token_correction": Capability("the mismatch correction's per-token weights and masks, from π_train before the "
                                   "update",
                                   "(backend=tinker: with backend.loss_fn=importance_sampling, ppo or cispo, a "
                                   "loss per token linear in its advantage)", ("backend",)),
    "reference_model": Capability("the reference model's log-probabilities (the base: the policy with its LoRA "
                                  "adapter disabled, or a frozen copy under full fine-tuning)",
                                  "(a service scores no reference model: set algorithm.kl.coef=0)", ("backend",)),
    "distributed": Capability("training over several processes (torchrun, SLURM tasks)", groups=("backend",)),
    "group_seeds": Capability("sampling that draws each prompt group from its own seeded generator",
                              groups=("engine",)),
    "self_scoring": Capability("the policy's log-probabilities of given rows under other prompts, no grad (the "
                               "self-teacher of transform=sdpo|sdft)", "(choose backend=local)", ("backend",)),
    "teacher": Capability("a frozen teacher that scores the sampled tokens",
                          "with distill.teacher.path=<an rlvr run folder, its export, or a transformers model> "
                          "(distill=teacher) or distill.teacher.base_url=… and distill.teacher.model=… "
                          "(distill=server)",
                          ("distill",)),
    "planning_mask": Capability("which completion tokens are planning tokens", groups=("planning",)),
    "fork": Capability("episodes that copy themselves mid-play (branch probes)", groups=("env",)),
    "legal_actions": Capability("episodes that list the actions legal in their state",
                                "(or turn_credit.branch_mode=llm: alternatives sampled from the policy)", ("env",)),
    "reasoning_gym_entries": Capability("references that name each example's reasoning-gym entry",
                                        groups=("data",)),
    "episodes": Capability("multi-turn episodes (turns, observations between them)", groups=("env",)),
    "capture": Capability("an update written down exactly (its starting state and its result, for rlvr replay)",
                          groups=("backend",)),
    "off_policy_loss": Capability("a loss for rollouts sampled by an older policy: the decoupled correction (π_old "
                                  "recomputed by the trainer, weighted by π_old/π_engine), or PRIME-RL's own loss "
                                  "(each token's ratio to its inference log-probability, backend=prime_rl)",
                                  "add correction=token_tis algorithm.loss.correction.pi_old=decoupled"),
    "masked_token_mean": Capability("a correction that masks tokens under algorithm.loss.aggregation=token_mean "
                                    "(the kept tokens rescale the step's gradients, rlvr/backend/local.py "
                                    "`kept_scale`)"),
    "sampled_ahead": Capability("rollouts sampled ahead of training (trainer.off_policy_steps >= 1)",
                                "set trainer.off_policy_steps=0"),
    "observes_steps": Capability("a data source whose next prompts depend on the rows scored so far (its state "
                                 "is checkpointed)", groups=("data",)),
    "partial_rollouts": Capability("sequences continued under new weights (trainer.partial_rollouts)",
                                   "(or set trainer.partial_rollouts=false)", ("engine",)),
    "trainer_module": Capability("sampling with the trainer's own module (a copy of its own when it samples "
                                 "ahead of training)", groups=("engine",)),
    "engine_gpu_memory": Capability("an engine holding GPU memory of its own beside the trainer",
                                    groups=("engine",)),
    "multi_lora": Capability("an engine that samples several LoRA adapters of one base in one call (packed grids)",
                             groups=("engine",)),
    "staged_sync": Capability("an engine that takes a version's weights while it still samples an older one",
                              groups=("engine",)),
}
"""Every capability a component may provide or require, by name."""

Status = Literal["ok", "missing", "warning"]


@dataclass(frozen=True)
class Finding:
    """The outcome of checking one requirement on this machine."""

    status: Status
    """missing: the run cannot run here; warning: it can, but not as the choice suggests."""
    detail: str


class Requirement(Protocol):
    """One thing a component needs from this machine: a package, a variable, a device, a server, a file."""

    @property
    def item(self) -> str:
        """What the report names ("$TINKER_API_KEY", "vllm", "cuda")."""
        ...

    @property
    def at_start(self) -> bool:
        """Checked by every run before anything loads (cheap: a variable, a file). Otherwise only `rlvr doctor`
        checks it (a child process, a request) and the run finds out when it gets there."""
        ...

    def check(self) -> Finding: ...


@dataclass(frozen=True)
class Needs:
    """What a component gives the other chosen components, what it requires of them, and of the machine."""

    provides: frozenset[str] = frozenset()
    """Names in CAPABILITIES."""
    requires: Mapping[str, str] = field(default_factory=dict)
    """Capability name → why (the setting or fact that makes it needed), said when nothing chosen provides it."""
    excludes: Mapping[str, str] = field(default_factory=dict)
    """Capability name → why this component cannot act with it and what to do instead, said when another chosen
    component provides it (an option that would silently do nothing, or go wrong, beside it)."""
    machine: tuple[Requirement, ...] = ()
    errors: tuple[str, ...] = ()
    """What is wrong with the component's own values (`key=value` and what is expected), reported with every other
    problem of the config before anything is built."""


class Component(Protocol):
    """Every `_target_` of a config group's option."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """From the option's YAML values (plain, resolved), before the component is built."""
        ...


class ModelPreset(Protocol):
    """A `model=` option: where the policy comes from and how it is adapted."""

    lora: LoraSpec | None
    """None: full fine-tuning."""

    seeded: ClassVar[bool]
    """`load` draws the weights from its seed (a built model), so runs of other seeds start from other weights."""

    @property
    def name(self) -> str:
        """The model as messages name it: its hub id or path, `tiny` for the built-in one."""
        ...

    def load(self, seed: int) -> tuple[PreTrainedModel, Any]:
        """(module, tokenizer); `seed` initialises weights that are built rather than loaded."""
        ...

    def skeleton(self) -> PreTrainedModel:
        """The module on the meta device: its shapes and dtype without weights or memory (a pack's memory plan)."""
        ...

    def load_tokenizer(self) -> tuple[Any, list[int]]:
        """(tokenizer, every id that ends a completion) without the weights, for a backend whose policy lives
        on a service (Tinker)."""
        ...


class DataSource(Protocol):
    """Prompts with references. Training order is a function of (seed, step) only, so a resumed run
    sees the same prompts it would have seen."""

    def batch(self, step: int, size: int) -> list[Example]: ...

    def eval_examples(self) -> list[Example]:
        """The held-out set, identical for every seed."""
        ...

    def demonstrations(self) -> list[Demonstration]:
        """Supervised pairs for the SFT warm-up ([] when the source has none)."""
        ...


class Episode(Protocol):
    """One play of an environment, from `Environment.episode`. Async, so that a group's episodes (and those of
    a server-backed environment) are stepped concurrently; an in-process game simply does not await."""

    async def reset(self) -> str:
        """The first observation: the episode's prompt."""
        ...

    async def step(self, action: str) -> Step:
        """The policy's action text (one turn's decoded completion) → the next observation, reward, done, info."""
        ...

    def fork(self) -> Episode:
        """An independent copy in the current state (for branching credit, turn_credit=tl_grpo); environments
        that cannot copy themselves raise NotImplementedError and declare no `fork` capability."""
        ...

    def legal_actions(self) -> list[str]:
        """Every action legal in the current state, as texts (for turn_credit=tl_grpo branch_mode=action_space);
        environments without a finite action set raise NotImplementedError and declare no `legal_actions`
        capability."""
        ...

    async def close(self) -> None:
        """Release what the episode holds (a server session); called once, whatever happened."""
        ...


class Environment(Protocol):
    """What `env=<option>` builds: episodes from a data example and a seed (the game's state is a function of
    the seed, so a resumed run replays the same episodes). `env=none` builds none: single-turn, as always."""

    max_turns: int
    """Actions per episode at most; an episode still going after them is kept and marked truncated."""
    max_context_tokens: int
    """Prompt plus every action and observation, in tokens, at most; past it the episode is truncated."""
    step_timeout_s: float
    """Wall seconds one `reset` or `step` may take; past it the episode ends as an environment error (reward 0)."""

    def episode(self, example: Example, seed: int) -> Episode: ...


class TurnCredit(Protocol):
    """How a multi-turn episode's reward becomes one advantage per action token (`turn_credit=`,
    rlvr/turn_credit/): observation and padding tokens get 0."""

    branching: Branching | None
    """What the rollout must probe for it (tl_grpo's branches, rlvr/rollout/branch_probes.py); None: nothing."""

    def __call__(self, adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> tuple[Tensor, dict[str, float]]:
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Reward(Protocol):
    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        """One float per completion (a completion is 'correct' when its reward is > 0.5), with the
        completions it timed out on, failed on or could not parse counted (they score 0.0)."""
        ...


@runtime_checkable
class AnswerReward(Reward, Protocol):
    """A reward that can say which answer a completion gives, as it compares it with the reference (reward=exact,
    match, math, reasoning_gym): a sampled evaluation's majority vote (`eval/maj@k`, rlvr/rollout/sampled_eval.py)
    reads it. Rewards without it (function, judge) get no maj@k."""

    def answer(self, completion: str) -> str | None:
        """The answer as the reward reads it (None: no answer to read); equal strings are the same answer."""
        ...


class Loss(Protocol):
    """The policy loss an algorithm trains with (`algorithm.loss`, rlvr/algorithm/loss.py: PolicyLoss), as a
    backend computes it token by token (backend=local, fsdp) or hands its settings to a service (backend=tinker)."""

    clip_eps: float
    """Ratio clipping ε (0: none)."""
    clip_eps_high: float
    """The upper ε (0: `clip_eps`)."""
    mode: str
    """`standard`, `kl_cov` or `clip_cov`."""

    @property
    def selects_tokens(self) -> bool:
        """Whether `token_losses` needs `select_tokens`' mask, chosen over the whole step."""
        ...

    def cap(self, adv_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Token advantages with their magnitude capped (`adv_clip_max`), and what the cap did."""
        ...

    def select_tokens(self, new_lp_N_T: Tensor, old_lp_N_T: Tensor, adv_N_T: Tensor, mask_N_T: Tensor,
                      generator: Any = None) -> Tensor:
        """bool [N, T]: the tokens kl_cov penalises or clip_cov zeroes, chosen among the whole step's."""
        ...

    def token_losses(self, new_lp: Tensor, old_lp: Tensor, adv: Tensor,
                     selected: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Per-token loss and a bool per token counted in `clip_fraction`."""
        ...


class Algorithm(Protocol):
    """Episode-level credit plus the policy loss it trains with."""

    loss: Loss

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        """[P, G] rewards → [P, G] episode advantages."""
        ...

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        """What the advantages measure per group (discover_entropic's solved β and KL), averaged over the step's
        groups whose rewards do not tie (`rewards_P_G` holds only those, possibly none); rlvr/credit.py merges it
        into the step's metrics. {} for an algorithm that measures nothing."""
        ...

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Batch-level pass over token advantages after the transform (REINFORCE++'s z-score of the step's
        non-zero token advantages, docs/algorithms.md#reinforce_pp); the identity for algorithms without one."""
        ...


class Transform(Protocol):
    """Token-level credit: [P·G] episode advantages → [P·G, T] token advantages. Multi-turn episodes whose turns
    have advantages of their own pass [P·G, T] already (0 off action tokens); the transform weights them token
    by token as it would weight the episode's (rlvr/transform/signals.py)."""

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]: ...

    def state_dict(self) -> dict[str, Any]:
        """Controller state that must survive a resume ({} for stateless transforms)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PlanningDetector(Protocol):
    def mask(self, token_strings_PG: Sequence[Sequence[str]], length: int) -> Tensor:
        """bool [P·G, length]: which completion tokens are planning tokens, from each completion's raw
        token pieces (`tokenizer.convert_ids_to_tokens`)."""
        ...


class Rollout(Protocol):
    """How a step's examples become scored rows (rlvr/rollout/): single-turn completions or episodes."""

    def sample(self, examples: list[Example], step: int, position: int, group_size: int,
               sampling: SamplingParams) -> Sampled:
        """This process's share of the step's rows: `group_size` of each example (the data stream's from `position`
        on). Only the engine (and an environment) is used: an overlapped run calls it in its sampler thread."""
        ...

    def finish(self, sampled: Sampled) -> StepBatch:
        """The step's rows scored and gathered over the run's processes (the training thread: scoring may need the
        main thread, and gathering is a collective)."""
        ...

    def evaluate(self, examples: list[Example], max_tokens: int, samples: int = 1,
                 temperature: float = 0.0, first: int = 0) -> StepBatch:
        """One greedy row of each held-out example, scored; with `temperature` > 0, `samples` rows of each (top_p
        1, each example's group from rlvr/seeds.py's eval_sampling_seeds, `examples` being the held-out set's from
        place `first` on), plus the rollout's own `eval/…`
        metrics (single turn: `eval/maj@k` where the reward reads answers, rlvr/rollout/sampled_eval.py)."""
        ...


class Engine(Protocol):
    """Generates rollouts from the current policy."""

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        """`group_size` completions of each prompt, row p·G + g. `seeds`: one per prompt group, so a group's
        completions depend on its seed (and the weights) alone, not on the other prompts of the call
        (rlvr/seeds.py: prompt_seeds derives them from one int)."""
        ...

    def connect(self) -> None:
        """Reach what the engine samples with (a server: check it, push the first weights); called once by the
        trainer right after the engine is built, before the first `sync`. Construction does no such work."""
        ...

    def sync(self, policy: nn.Module) -> int:
        """Make the backend's latest weights the ones sampled from (waking the engine if it sleeps). Returns the
        bytes this sync wrote to files, whatever the file system (a folder under /dev/shm counts: it is written
        like any other); 0 when the weights went in memory or nothing was sent. The step row's
        `engine/sync_bytes_written`."""
        ...

    def sleep(self) -> None:
        """Sampling is over until the next `sync` (the trainer is about to train): give back the memory the trainer
        could use (engine=vllm with `sleep_level`: vLLM's GPU weights and KV cache). The next `sync`, or a `sample`,
        takes it again. Nothing for an engine that holds no such memory."""
        ...

    def sample_beside_training(self, beside: bool) -> None:
        """True: from now on `sample` is called in the trainer's sampler thread while the trainer trains
        (trainer.off_policy_steps ≥ 1, rlvr/overlap.py). An engine whose sampling would hold Python's GIL moves it
        out of the trainer's process (engine=pytorch on a CPU); nothing for one that waits on kernels or a server.
        False: the sampler thread has ended (it may move back)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a vLLM instance, its weight folders, a worker process); nothing for an
        engine that holds only the policy."""
        ...


@dataclass(frozen=True)
class Staged:
    """One version's weights, copied for an engine to load later (`StagesSync.stage`)."""

    load: Callable[[], None]
    """Make them the weights sampled from (called in the sampler thread, between jobs, whatever the policy's weights
    are by then)."""
    bytes_written: int
    """What `sync` would return: the bytes written to files (the row's `engine/sync_bytes_written`)."""


class StagesSync(Engine, Protocol):
    """An engine whose `needs` provide `staged_sync`: it can take a version's weights while it still samples from
    an older one (rlvr/overlap.py: sampling k ≥ 2 steps ahead in `fixed` mode)."""

    def stage(self, policy: nn.Module) -> Staged | None:
        """`sync(policy)` in two halves: now, a copy of what the engine needs of `policy`'s weights (in the trainer's
        main thread, sampling going on); `load()` later. The copy's memory is held until it is loaded. None where
        this policy's weights cannot be staged (engine=openai under full fine-tuning): the trainer syncs instead."""
        ...


class TurnSampler(Protocol):
    """Optional, for multi-turn episodes: what an engine's `turn_sampler()` returns (engine=pytorch's keeps each
    episode's KV cache between its turns, rlvr/engine/pytorch.py "Turns"). The episode loop (rlvr/rollout/episodes.py)
    makes one per played batch where the engine has `turn_sampler`; for every other engine each turn is one
    `Engine.sample(contexts, 1, …)` call on the whole context."""

    def sample(self, keys: list[int], contexts: list[list[int]], params: SamplingParams, seeds: Sequence[int],
               with_entropy: bool = False) -> Rollouts:
        """What `Engine.sample(contexts, 1, params, seeds, with_entropy)` samples (the same draws and tokens, the
        log-probabilities to float summation order); `keys[i]` names context i's episode, whose context at its next
        turn extends this one."""
        ...

    def close(self) -> None:
        """The batch is played: free what is kept."""
        ...


class Backend(Protocol):
    """Where gradients are computed. A backend whose `needs` provide `remote_policy` (Tinker) keeps the policy on a
    service: the trainer loads only the tokenizer, builds it with `lora`/`lora_seed` alone, and its `policy` is a
    handle its paired engine samples from."""

    @property
    def policy(self) -> nn.Module:
        """The trained module (a PEFT model under LoRA); for a remote backend, its sampler handle. A plain read:
        nothing collective happens here."""
        ...

    @property
    def trainable_parameters(self) -> int:
        """Parameters the optimizer updates (0 where a service does not report them)."""
        ...

    def prepare_sampling(self) -> None:
        """Make `policy` whole for the engine and evaluation. Called on every process of a run before each
        sampling and evaluation: backend=fsdp all-gathers its shards (a collective); the others do nothing."""
        ...

    def train_step(self, batch: TrainBatch, loss: Loss, lr: float) -> dict[str, float]: ...

    def save(self, path: Path) -> None:
        """Write weights (adapter or full) as safetensors plus optimizer state into `path`."""
        ...

    def load(self, path: Path) -> None:
        """Restore exactly what `save` wrote."""
        ...


class EntropyBackend(Backend, Protocol):
    """A backend whose `needs` provide `entropy`: it computes the policy's entropies for a transform that reads them
    when the engine cannot (engine=vllm)."""

    def entropies(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] entropy of the temperature-scaled distribution at each completion position (0 on padding)."""
        ...


class Logger(Protocol):
    """Where metrics rows go besides metrics.jsonl (W&B, …)."""

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None: ...

    def log(self, row: dict) -> None:
        """One metrics row (training or evaluation); its `step` field is the x-axis."""
        ...

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` to the summary of the finished run in `folder` (a campaign's squeeze result); loggers that
        keep no summary do nothing."""
        ...

    def finish(self) -> None: ...
