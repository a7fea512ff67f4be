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


def prompt_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """One sampling seed per prompt: the list given (one per prompt group, what the rollouts pass), or, from one
    int, `sub_seed(seed, "prompt/<p>")` for each."""
    if isinstance(seed, int):
        return [sub_seed(seed, f"prompt/{p}") for p in range(count)]
    if len(seed) != count:
        raise ValueError(f"{len(seed)} seeds for {count} prompts: give one per prompt")
    return list(seed)
