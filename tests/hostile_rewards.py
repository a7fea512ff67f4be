"""A reward that puts hostile text through the trainer's real scoring path (tests/reward/hostile.py)."""

from collections.abc import Mapping, Sequence
from typing import Any

from reward.hostile import CORPUS

SCORED: list[str] = []
"""Ids of the corpus items graded so far in this process, in order."""


class HostileText:
    """Wraps a real reward: each batch's completions and references are replaced by the next corpus items
    (cycling), then graded by `reward` in one call, as the trainer grades a step."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]):
        """What the wrapped reward needs."""
        from hydra.utils import get_class

        inner = settings["reward"]
        return get_class(inner["_target_"]).needs(inner)

    def __init__(self, reward: object) -> None:
        self.reward = reward

    def score(self, completions: Sequence[str], references: Sequence[str]):
        start = len(SCORED)
        items = [CORPUS[(start + i) % len(CORPUS)] for i in range(len(completions))]
        SCORED.extend(h.id for h in items)
        return self.reward.score([h.completion for h in items], [h.reference for h in items])

    def close(self) -> None:
        getattr(self.reward, "close", lambda: None)()
