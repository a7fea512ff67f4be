"""One episode while the episode loop plays it (rlvr/rollout/episode_loop.py): its row so far and what it met."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.chat.rewrites import TemplateView
    from rlvr.env.guarded import GuardedEpisode
    from rlvr.rollout.observations import Observations
    from rlvr.types import Step


@dataclass
class Playing:
    """One episode while it is played."""

    episode: GuardedEpisode
    prompt: list[int]
    seed: int
    """The episode's sampling seed: turn k samples with sub_seed(seed, "turn/<k>") (rlvr/rollout/episodes.py)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    actions: list[bool] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    body: list[bool] = field(default_factory=list)
    """True on an observation's own text tokens (rlvr/rollout/observation_body.py): ECHO's candidates."""
    rewards: list[float] = field(default_factory=list)
    transcript: list[dict] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)
    actions_text: list[str] = field(default_factory=list)
    contexts: list[list[int]] = field(default_factory=list)
    """The ids each action was sampled from (kept for branch probes only)."""
    snapshots: list = field(default_factory=list)
    """A fork before each action (branch probes only, rlvr/rollout/branch_probes.py)."""
    view: TemplateView | None = None
    """The conversation as the chat template renders it (rlvr/chat/rewrites.py); None without one."""
    rewritten: list[int] = field(default_factory=list)
    """The turns after whose observation the template's render no longer extends the row."""
    segments: list[tuple[int, list[int]]] = field(default_factory=list)
    """At each rewrite: (the row position the next action starts at, the template's re-render it is sampled from):
    the row's later sequences (`Rollouts.segments_PG`)."""
    done: bool = False
    truncated: bool = False
    failed: bool = False
    """The environment raised, hung or answered malformed (rlvr/env/guarded.py): the episode scores 0."""

    def append(self, ids: list[int], logprobs: list[float], entropy: list[float], turn: int,
               body: list[bool] | None = None) -> None:
        self.body += body if body is not None else [False] * len(ids)
        self.tokens += ids
        self.logprobs += logprobs
        self.entropy += entropy
        self.actions += [turn >= 0] * len(ids)
        self.turns += [turn] * len(ids)

    def context(self) -> list[int]:
        """The ids the next action is sampled from: the prompt and the row, or since the last rewrite the template's
        re-render and the row after it."""
        start, prompt = self.segments[-1] if self.segments else (0, self.prompt)
        return prompt + self.tokens[start:]

    def act(self, ids: list[int], logprobs: list[float], entropy: list[float], text: str, turn: int) -> None:
        """The action of turn `turn`: its sampled ids and their log-probabilities, and its text."""
        self.append(ids, logprobs, entropy, turn)
        self.actions_text.append(text)
        self.transcript.append({"role": "policy", "text": text})

    def observe(self, step: Step, turn: int, observations: Observations) -> None:
        """What the environment answered to the action of turn `turn`: its reward and info, and the observation's
        ids when the episode goes on (a new sequence where the chat template rewrites the conversation)."""
        self.rewards.append(float(step.reward))
        self.infos.append(dict(step.info))
        self.done = bool(step.done)
        self.failed = self.failed or "error" in step.info
        if self.done or not step.observation:
            return
        results = step.info.get("tool_results")
        ids, body = observations.encode(step.observation, self.tokens, results)
        self.append(ids, [0.0] * len(ids), [0.0] * len(ids), -1, body)
        if self.view is not None and not self.view.extends(self.actions_text[-1], step.observation, results):
            self.rewritten.append(turn)  # the next action follows the re-render: a new sequence
            self.segments.append((len(self.tokens), self.view.ids()))
        self.transcript.append({"role": "tool" if "tool_results" in step.info else "env", "text": step.observation})

    def end(self) -> None:
        """The batch is played: an episode still going is truncated; a failed one's earlier rewards are not trusted
        either."""
        self.truncated = self.truncated or not self.done
        if self.failed:
            self.rewards = [0.0] * len(self.rewards)
