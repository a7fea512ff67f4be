"""The TTT-Discover archive: a tree of candidate answers to one problem, and how a step picks where to start
(docs/algorithms.md#ttt-discover-archive; "Learning to Discover at Test Time", arXiv 2601.16175; the predecessor's
`trainer = "ttt_discover"`, docs/predecessor.md).

The root is the empty answer (reward `root_reward`, 0.0). Every other entry is a completion sampled from a prompt
built on its parent, with its reward. Each entry keeps

    text, reward, parent (id; None for the root), depth (root 0, a child its parent's + 1),
    n = expansions (times it was picked as a start), children (how many are in the archive),
    best_descendant (the highest reward ever added below it; None before any)
    q = max(reward, best_descendant)

A step picks B distinct starts by PUCT:

    score(e) = q(e) + c · prior(e) · √(1 + N) / (1 + n(e))      N = Σ n over the archive, c = `puct_c` (1.0)
    prior(e) = (M − rank(e)) / (M·(M + 1)/2)                    linear rank prior: the M entries ordered by
                                                                reward, highest first (rank 0 .. M−1), ties by id
                                                                (older first); Σ prior = 1

the B highest scores, ties to the lower id (older). Each pick adds 1 to its n. While the archive holds fewer than
B entries (the first step: the root alone) the picks repeat it in score order: the step still has B prompts.

Adding a child raises `best_descendant` of every ancestor it beats. After a step's children are added the archive
is cut to its cap, max(64, 2·B·G, `archive_max_entries`): while it is over, the leaf (an entry without children;
never the root) with the lowest reward leaves, ties to the newest. Leaves only, so every entry's parent is in the
archive. `best_descendant` is a record of what was found below an entry and is not lowered when that descendant is
pruned: an entry that once led to a good answer keeps its q.

`best_reward` is the highest reward ever added (never decreasing); the archive is plain data (`state_dict`) and
goes into every checkpoint, so a resumed run continues with the same tree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MIN_CAP = 64
"""The archive holds at least this many entries before pruning (and at least 2·B·G)."""


@dataclass
class Entry:
    """One candidate answer in the archive."""

    id: int
    text: str
    reward: float
    parent: int | None
    """The entry whose prompt sampled this one (None: the root)."""
    depth: int
    expansions: int = 0
    """n: times this entry was picked as a step's start."""
    children: int = 0
    """Entries in the archive whose parent this is (0: a leaf)."""
    best_descendant: float | None = None
    """The highest reward ever added below this entry (kept when that descendant is pruned); None before any."""

    @property
    def q(self) -> float:
        """The entry's value for PUCT: its own reward or its best descendant's, whichever is higher."""
        return self.reward if self.best_descendant is None else max(self.reward, self.best_descendant)


class Archive:
    """The tree of candidates (module docstring): PUCT selection, children, pruning, state."""

    def __init__(self, root_reward: float = 0.0) -> None:
        self.entries: dict[int, Entry] = {0: Entry(0, "", float(root_reward), None, 0)}
        self.next_id = 1
        self.best_reward = float(root_reward)
        """The highest reward ever added (the root's to start with); never decreases."""

    def __len__(self) -> int:
        return len(self.entries)

    def ranked(self) -> list[Entry]:
        """Every entry, highest reward first, ties by id (older first)."""
        return sorted(self.entries.values(), key=lambda e: (-e.reward, e.id))

    def priors(self) -> dict[int, float]:
        """The linear rank prior by reward: rank r of M (0 = best) gets (M − r) / (M(M+1)/2)."""
        ranked = self.ranked()
        M = len(ranked)
        total = M * (M + 1) / 2
        return {e.id: (M - r) / total for r, e in enumerate(ranked)}

    def scores(self, c: float) -> dict[int, float]:
        """Each entry's PUCT score q + c·prior·√(1 + N)/(1 + n)."""
        N = sum(e.expansions for e in self.entries.values())
        priors = self.priors()
        return {i: e.q + c * priors[i] * math.sqrt(1 + N) / (1 + e.expansions) for i, e in self.entries.items()}

    def select(self, count: int, c: float) -> list[int]:
        """The ids of `count` starts: the highest PUCT scores, distinct while the archive has that many entries
        (fewer: repeated in score order); each pick's expansions + 1."""
        if count < 1:
            raise ValueError(f"cannot pick {count} start entries (need >= 1)")
        scores = self.scores(c)
        order = sorted(scores, key=lambda i: (-scores[i], i))
        picks = [order[k % len(order)] for k in range(count)]
        for i in picks:
            self.entries[i].expansions += 1
        return picks

    def add(self, parent: int, text: str, reward: float) -> int:
        """A child of `parent` with its reward; returns its id. Ancestors it beats record it as best descendant."""
        up = self.entries[parent]
        child = Entry(self.next_id, text, float(reward), parent, up.depth + 1)
        self.entries[child.id] = child
        self.next_id += 1
        up.children += 1
        self.best_reward = max(self.best_reward, child.reward)
        node: Entry | None = up
        while node is not None:
            if node.best_descendant is None or child.reward > node.best_descendant:
                node.best_descendant = child.reward
            node = self.entries[node.parent] if node.parent is not None else None
        return child.id

    def prune(self, cap: int) -> list[int]:
        """While over `cap` entries, remove the lowest-reward leaf (ties: the newest; never the root); returns the
        ids removed, in order."""
        removed = []
        while len(self.entries) > cap:
            leaves = [e for e in self.entries.values() if e.children == 0 and e.parent is not None]
            if not leaves:  # the root alone: cap < 1 is refused by the caller
                break
            worst = min(leaves, key=lambda e: (e.reward, -e.id))
            del self.entries[worst.id]
            assert worst.parent is not None  # leaves exclude the root
            self.entries[worst.parent].children -= 1
            removed.append(worst.id)
        return removed

    def top(self, k: int) -> list[Entry]:
        """The k highest-reward entries (ties: older first)."""
        return self.ranked()[:k]

    def state_dict(self) -> dict:
        """Plain data (JSON) holding the whole archive."""
        return {"entries": [asdict(e) for e in self.entries.values()], "next_id": self.next_id,
                "best_reward": self.best_reward}

    def load_state_dict(self, state: dict) -> None:
        self.entries = {e["id"]: Entry(**e) for e in state["entries"]}
        self.next_id = state["next_id"]
        self.best_reward = state["best_reward"]


def capacity(batch_size: int, group_size: int, archive_max_entries: int) -> int:
    """The archive's cap: max(64, 2·B·G, archive_max_entries)."""
    return max(MIN_CAP, 2 * batch_size * group_size, archive_max_entries)
