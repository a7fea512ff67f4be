"""The "memory" block of a TTT-Discover prompt: what the policy sees of the archive when it expands a start entry
(rlvr/discover/archive.py).

    prompt = memory.prompt.format(statement=<the problem>, start=<start block>, others=<other blocks, joined>)
    start block  = memory.start.format(text=<start's text, first start_chars (1,200) characters>, reward=…, …)
    other blocks = memory.other.format(…) for each of the `context_k` (3) highest-reward entries other than the
                   start and the root (the empty answer), highest first, texts cut to other_chars (600) characters

Each entry format gets `text`, `reward` (float), `percent` (round(100·reward), an integer) and `depth`. The
defaults are a plain-text block for a language model; conf/data/discover.yaml sets a compact one for the tiny
model, whose alphabet is "0123456789+=" and which has 32 positions ("{text}+{percent}+" per other entry,
"{text}=" for the start). Texts are cut from the end (their beginning is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.discover.archive import Archive, Entry
from rlvr.errors import ConfigError


@dataclass(frozen=True)
class Memory:
    prompt: str = ("{statement}\n\n## Memory\n{start}{others}\n"
                   "Write an answer that scores higher than the current one.\n")
    start: str = "Current answer (reward {reward:.4f}):\n{text}\n"
    other: str = "Another answer (reward {reward:.4f}):\n{text}\n"
    context_k: int = 3
    """Other entries shown besides the start (the highest-reward ones)."""
    start_chars: int = 1200
    """The start's text is cut to this many characters."""
    other_chars: int = 600
    """Each other entry's text is cut to this many characters."""

    def __post_init__(self) -> None:
        for key in ("context_k", "start_chars", "other_chars"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.memory.{key}={getattr(self, key)} must be >= 0")
        probe = Entry(1, "1", 0.5, 0, 1)
        for key in ("start", "other"):
            try:
                self._entry(getattr(self, key), probe, 10)
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(f"data.memory.{key}={getattr(self, key)!r} is not a format of text, reward, "
                                  f"percent and depth: {err!r}") from None
        try:
            self.prompt.format(statement="", start="", others="")
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(f"data.memory.prompt={self.prompt!r} is not a format of statement, start and others: "
                              f"{err!r}") from None

    def render(self, statement: str, archive: Archive, start: int) -> str:
        """The prompt that expands entry `start` of `archive`."""
        others = [e for e in archive.ranked() if e.id != start and e.parent is not None][: self.context_k]
        return self.prompt.format(
            statement=statement,
            start=self._entry(self.start, archive.entries[start], self.start_chars),
            others="".join(self._entry(self.other, e, self.other_chars) for e in others),
        )

    @staticmethod
    def _entry(template: str, entry: Entry, chars: int) -> str:
        return template.format(text=entry.text[:chars], reward=entry.reward, percent=round(100 * entry.reward),
                               depth=entry.depth)
