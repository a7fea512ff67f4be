"""The seams between config groups, as Protocols. Implementations do not inherit from these."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from torch import Tensor, nn

    from rlvr.algorithm.loss import PolicyLoss
    from rlvr.model.lora import LoraSpec
    from rlvr.types import Demonstration, Example, Rollouts, SamplingParams, Scores, TokenSignals, TrainBatch


class ModelPreset(Protocol):
    """A `model=` option: where the policy comes from and how it is adapted."""

    lora: LoraSpec | None
    """None: full fine-tuning."""

    def check_available(self) -> None:
        """Raise FileNotFoundError, naming `model.<key>`, if `load` could not find the weights."""
        ...

    def load(self, seed: int) -> tuple[nn.Module, Any]:
        """(module, tokenizer); `seed` initialises weights that are built rather than loaded."""
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


class Reward(Protocol):
    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        """One float per completion (a completion is 'correct' when its reward is > 0.5), with the
        completions it timed out on, failed on or could not parse counted (they score 0.0)."""
        ...


class Algorithm(Protocol):
    """Episode-level credit plus the policy loss it trains with."""

    loss: PolicyLoss

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        """[P, G] rewards → [P, G] episode advantages."""
        ...

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Batch-level pass over token advantages after the transform (REINFORCE++'s §2.4 batch
        normalisation); the identity for algorithms without one."""
        ...


class Transform(Protocol):
    """Token-level credit: [P·G] episode advantages → [P·G, T] token advantages."""

    needs_entropy: ClassVar[bool]
    """Needs full-distribution entropy, which only some engines can give."""
    needs_planning: ClassVar[bool]
    """Needs the planning-token mask."""

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


class Engine(Protocol):
    """Generates rollouts from the current policy."""

    provides_entropy: ClassVar[bool]
    for_remote_backend: ClassVar[bool]
    """Samples from a remote backend's policy handle (engine=tinker); absent = False (samples a local module)."""

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int,
        with_entropy: bool = False,
    ) -> Rollouts: ...

    def connect(self) -> None:
        """Reach what the engine samples with (a server: check it, push the first weights); called once by the
        trainer right after the engine is built, before the first `sync`. Construction does no such work."""
        ...

    def sync(self, policy: nn.Module) -> None:
        """Make the backend's latest weights the ones sampled from."""
        ...


class Backend(Protocol):
    """Where gradients are computed."""

    remote: ClassVar[bool]
    """The policy lives on a service (Tinker): the trainer loads only the tokenizer, builds the backend with
    `lora`/`lora_seed` alone, and `policy` is a handle its paired engine samples from. Absent = False."""

    @property
    def policy(self) -> nn.Module:
        """The trained module (a PEFT model under LoRA); for a remote backend, its sampler handle."""
        ...

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]: ...

    def save(self, path: Path) -> None:
        """Write weights (adapter or full) as safetensors plus optimizer state into `path`."""
        ...

    def load(self, path: Path) -> None:
        """Restore exactly what `save` wrote."""
        ...


class Logger(Protocol):
    """Where metrics rows go besides metrics.jsonl (W&B, …)."""

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None: ...

    def log(self, row: dict) -> None:
        """One metrics row (training or evaluation); its `step` field is the x-axis."""
        ...

    def finish(self) -> None: ...
