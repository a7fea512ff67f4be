"""`trainer=discover`'s data source: test-time training on one problem, its examples drawn from an archive of
candidate answers (rlvr/discover/archive.py) instead of a dataset. The trainer's step is unchanged:

    examples = data.batch(step, B)        PUCT picks B distinct start entries; each example is the problem's
                                          statement with the start's memory block (rlvr/discover/memory.py), its
                                          reference the problem's
    (sampled, G per example; scored by the run's reward against the reference; rlvr/trainer.py)
    observe(data, batch, out)             each row joins the archive as a child of its start, with its reward;
                                          the archive is cut to its cap; the metrics row gets discover/*;
                                          archive_top.json in the run folder lists the best entries
    (credited by the configured algorithm, discover_entropic, and trained)

The archive is checkpoint state (`state`/`load_state`, the trainer's `data` entry of trainer_state.json): a run
killed and continued has the same archive. Starts picked by `batch` wait in order until `observe` takes them,
so a step drawn as several calls (back pressure's one prompt at a time) still pairs each row with its start.

Refused: trainer.off_policy_steps ≥ 1 (steps sampled ahead would pick their starts before the previous step's
children join) and trainer.dynamic_sampling other than off (dropped groups would lose their children).

Metrics per step: discover/best_reward (the highest reward ever added; never decreasing), discover/archive_size,
discover/start_state_mean_reward (the mean reward of the step's start entries), discover/max_depth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlvr.discover.archive import Archive, capacity
from rlvr.discover.memory import Memory
from rlvr.errors import ConfigError
from rlvr.protocols import Needs
from rlvr.types import Demonstration, Example

if TYPE_CHECKING:
    from rlvr.outputs import RunDir
    from rlvr.types import StepBatch

TOP_FILE = "archive_top.json"


@dataclass
class Discover:
    seed: int
    """The run's data sub-seed (passed by the runner); PUCT is deterministic and does not read it."""
    statement: str
    """The problem, as the prompt states it (the tiny model's demo: empty, its alphabet has no words)."""
    reference: str
    """What the run's reward scores every completion against (closeness: the target number)."""
    batch_size: int
    """B: start entries per step (${trainer.batch_size})."""
    group_size: int
    """G: completions per start (${trainer.group_size}); the cap reads B·G."""
    off_policy_steps: int = 0
    dynamic_sampling: str = "off"
    puct_c: float = 1.0
    archive_max_entries: int = 4096
    """The cap is max(64, 2·B·G, this)."""
    root_reward: float = 0.0
    """The root's (the empty answer's) reward."""
    top_entries: int = 20
    """Entries listed in the run folder's archive_top.json."""
    memory: Memory = field(default_factory=Memory)

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"observes_steps"}))

    def __post_init__(self) -> None:
        if self.off_policy_steps:
            raise ConfigError(f"trainer.off_policy_steps={self.off_policy_steps} with data <discover>: a step sampled "
                              "ahead would pick its starts before the previous step's children join the archive; "
                              "use trainer.off_policy_steps=0")
        if self.dynamic_sampling != "off":
            raise ConfigError(f"trainer.dynamic_sampling={self.dynamic_sampling} with data <discover>: every row "
                              "joins the archive, so no group may be dropped or drawn again; use "
                              "trainer.dynamic_sampling=off")
        if self.puct_c < 0:
            raise ConfigError(f"data.puct_c={self.puct_c} must be >= 0")
        if self.archive_max_entries < 1:
            raise ConfigError(f"data.archive_max_entries={self.archive_max_entries} must be >= 1")
        self.archive = Archive(self.root_reward)
        self.cap = capacity(self.batch_size, self.group_size, self.archive_max_entries)
        self._starts: list[int] = []

    def batch(self, step: int, size: int) -> list[Example]:
        starts = self.archive.select(size, self.puct_c)
        self._starts += starts
        return [Example(self.memory.render(self.statement, self.archive, s), self.reference) for s in starts]

    def eval_examples(self) -> list[Example]:
        """The root's prompt (the problem with an empty memory): a greedy answer from scratch."""
        return [Example(self.memory.render(self.statement, self.archive, 0), self.reference)]

    def demonstrations(self) -> list[Demonstration]:
        return []

    def observe(self, completions: list[str], rewards_P_G: Any) -> dict[str, float]:
        """The step's P×G scored rows join the archive (row p·G + g under the p-th start waiting), then the
        archive is cut to its cap; returns the step's discover/* metrics."""
        P, G = rewards_P_G.shape
        if len(self._starts) < P:
            raise RuntimeError(f"{P} groups scored but only {len(self._starts)} start entries were drawn")
        starts, self._starts = self._starts[:P], self._starts[P:]
        start_rewards = [self.archive.entries[s].reward for s in starts]
        for p, start in enumerate(starts):
            for g in range(G):
                self.archive.add(start, completions[p * G + g], float(rewards_P_G[p, g]))
        self.archive.prune(self.cap)
        return {
            "discover/best_reward": self.archive.best_reward,
            "discover/archive_size": float(len(self.archive)),
            "discover/start_state_mean_reward": sum(start_rewards) / P,
            "discover/max_depth": float(max(e.depth for e in self.archive.entries.values())),
        }

    def observe_step(self, batch: StepBatch, out: RunDir) -> dict[str, float]:
        """A trained step's rows join the archive (the run folder's archive_top.json rewritten); the row's
        discover/* (rlvr/stages/observe.py `DataObserver`)."""
        fields = self.observe(batch.completions, batch.rewards_P_G)
        out.write_json(TOP_FILE, self.top())
        return fields

    def top(self) -> dict:
        """archive_top.json's data: the best entries with their place in the tree."""
        return {"best_reward": self.archive.best_reward, "archive_size": len(self.archive),
                "entries": [{"id": e.id, "text": e.text, "reward": e.reward, "q": e.q, "parent": e.parent,
                             "depth": e.depth, "expansions": e.expansions}
                            for e in self.archive.top(self.top_entries)]}

    def state(self) -> dict:
        return self.archive.state_dict()

    def load_state(self, state: dict) -> None:
        if not state:
            raise ConfigError("the checkpoint holds no discover archive (written by a run of another data source)")
        self.archive.load_state_dict(state)
        self._starts = []
