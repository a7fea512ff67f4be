"""One root seed, split into named sub-seeds.

    sub_seed(root, name) = int.from_bytes(sha256(f"{root}/{name}").digest()[:8], "big") mod 2**63

Named streams are independent: changing how many numbers one consumer draws never shifts another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def sub_seed(root: int, name: str) -> int:
    digest = hashlib.sha256(f"{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


@dataclass(frozen=True)
class Seeds:
    root: int
    data: int
    """Training-prompt order."""
    sampler: int
    """Rollout sampling (combined with the step index, so step k's draws do not depend on step k−1's)."""
    init: int
    """Model construction (tiny model weights) and the SFT warm-up's batch order."""
    lora: int
    """LoRA adapter initialisation."""

    @classmethod
    def from_root(cls, root: int) -> Seeds:
        return cls(root, *(sub_seed(root, name) for name in ("data", "sampler", "init", "lora")))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def group_sampling_seeds(sampler: int, step: int, position: int, count: int) -> list[int]:
    """The sampling seeds of a step's `count` groups whose prompts start at `position` of the data stream:
    `sub_seed(sub_seed(sampler, "step/<step>"), "group/<position + i>")`, a function of the run seed, the step and
    the group's place alone (not of the other groups, nor of how many processes share the step)."""
    step_seed = sub_seed(sampler, f"step/{step}")
    return [sub_seed(step_seed, f"group/{position + i}") for i in range(count)]


def eval_sampling_seeds(sampler: int, count: int) -> list[int]:
    """The sampling seeds of the held-out set's `count` groups in a sampled evaluation (trainer.eval_samples ≥ 2):
    `sub_seed(sub_seed(sampler, "eval"), "example/<i>")`, the same at every evaluation of a run (the weights alone
    change the draws) and in `rlvr eval` of its checkpoints, apart from every training step's."""
    eval_seed = sub_seed(sampler, "eval")
    return [sub_seed(eval_seed, f"example/{i}") for i in range(count)]


def prompt_seeds(seed: int, count: int) -> list[int]:
    """`count` prompts' sampling seeds from one int (`rlvr sample --seed`, the benchmarks): `sub_seed(seed,
    "prompt/<p>")` for prompt p."""
    return [sub_seed(seed, f"prompt/{p}") for p in range(count)]


def group_seeds(seeds: Sequence[int], count: int) -> list[int]:
    """An engine's check of what `Engine.sample` is given: one seed per prompt group."""
    if isinstance(seeds, int) or len(seeds) != count:
        given = "one int" if isinstance(seeds, int) else f"{len(seeds)} seeds"
        raise ValueError(f"{given} for {count} prompts: Engine.sample takes one seed per prompt group "
                         "(rlvr.seeds.prompt_seeds derives them from one int)")
    return list(seeds)
