"""The episode loop: one played batch, reset → turns → branch probes (rlvr/rollout/episodes.py says what a turn is).

`Player` is built once per rollout: it finds there, once, what the engine and the environment can do beyond their
protocols (rlvr/optional.py: a `TurnSampling` engine; the environment's tools, found by its guard). Each `play`
then runs one `Batch` on a fresh event loop:

    reset   every episode's first observation (concurrently), checked to be its group's, encoded once per text
    turn    the live episodes' actions sampled in one call (or through the engine's turn sampler), then the
            environments stepped concurrently; False once no episode is live
    probe   with `branching` (turn_credit=tl_grpo), the branch probes on the forks kept before each action
            (rlvr/rollout/branch_probes.py)

Every environment call of a batch is bounded by `env.max_concurrent` where it is set, and the environments' time is
summed (`Played.env_seconds`), the probes' apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from rlvr.calls import gather_eagerly
from rlvr.chat.rewrites import TemplateView
from rlvr.chat.tools import tool_prompt_ids
from rlvr.model.prompt_encoding import encode_prompts
from rlvr.optional import TurnSampling
from rlvr.rollout.branch_probes import Probed, probe
from rlvr.rollout.observations import Observations, action_lists
from rlvr.rollout.pack import pack
from rlvr.rollout.playing import Playing
from rlvr.seeds import sub_seed

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.env.guarded import GuardedEnvironment, GuardedEpisode
    from rlvr.protocols import Engine
    from rlvr.types import Branching, Example, Played, Rollouts, SamplingParams

T = TypeVar("T")


class Player:
    """Plays batches of one environment's episodes with one engine (module docstring)."""

    def __init__(self, engine: Engine, tokenizer: Any, env: GuardedEnvironment) -> None:
        self.engine, self.tokenizer, self.env = engine, tokenizer, env
        self.turn_sampling = engine if isinstance(engine, TurnSampling) else None
        """The engine, where it samples a batch's turns through a turn sampler of its own (engine=pytorch)."""

    def play(self, examples: list[Example], group_size: int, sampling: SamplingParams, seeds: list[int],
             sample_seeds: list[int], with_entropy: bool = False, branching: Branching | None = None) -> Played:
        """Play `group_size` episodes of each example (`seeds[p]`: the game its group starts from; `sample_seeds[p]`:
        its group's sampling seed, from which each episode's are derived, rlvr/rollout/episodes.py). With
        `branching` (tl_grpo) each episode is forked before every action and the branch probes run once all are
        played."""
        played: list[Played] = []

        async def main() -> None:  # returns None: see below
            played.append(await self._play(examples, group_size, sampling, seeds, sample_seeds, with_entropy,
                                           branching))

        # Where no SIGINT handler is set (`rlvr eval`, tests; a run sets its own), asyncio.run sets one naming its
        # main task and, setting the default back, formats that task, its result included: a Played would cost
        # ~10 ms of tensor printing here.
        asyncio.run(main())
        return played[0]

    async def _play(self, examples: list[Example], G: int, sampling: SamplingParams, seeds: list[int],
                    sample_seeds: list[int], with_entropy: bool, branching: Branching | None) -> Played:
        episodes = [self.env.episode(example, seed) for example, seed in zip(examples, seeds, strict=True)
                    for _ in range(G)]
        batch = Batch(self, sampling, with_entropy, branching)
        plays: list[Playing] = []
        try:
            plays = await batch.reset(episodes, len(examples), G, sample_seeds)
            for turn in range(self.env.max_turns):
                if not await batch.turn(plays, turn):
                    break
            for p in plays:
                p.end()
            branches, probe_seconds = await batch.probe(plays)
        finally:
            await batch.close(plays, episodes)
        played = pack(plays, len(examples), G, sampling.temperature, self.tokenizer.pad_token_id, with_entropy,
                      batch.env_seconds)
        return replace(played, branch_rewards_PG_K_B=branches, probe_seconds=probe_seconds)


class Batch:
    """One played batch's state: its environment calls' bound and time, its turn sampler, what it has encoded."""

    def __init__(self, player: Player, sampling: SamplingParams, with_entropy: bool,
                 branching: Branching | None) -> None:
        self.player, self.sampling, self.with_entropy, self.branching = player, sampling, with_entropy, branching
        bound = player.env.max_concurrent
        self.limit = asyncio.Semaphore(bound) if bound else None
        self.env_seconds = 0.0
        self.turns = player.turn_sampling.turn_sampler() if player.turn_sampling is not None else None
        self.observations = Observations(player.tokenizer)
        self.prompts: dict[str, list[int]] = {}
        """Each distinct first observation's ids, encoded once."""

    def calls(self, awaitables: Iterable[Coroutine[Any, Any, T]]) -> Iterable[Coroutine[Any, Any, T]]:
        """The calls, each bounded by `env.max_concurrent` where it is set."""
        return awaitables if self.limit is None else (self._bounded(a) for a in awaitables)

    async def _bounded(self, awaitable: Awaitable[T]) -> T:
        assert self.limit is not None
        async with self.limit:
            return await awaitable

    async def timed(self, awaitables: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
        """Every episode's call at once (at most `env.max_concurrent` in flight), timed together."""
        t0 = time.perf_counter()
        out = await gather_eagerly(self.calls(awaitables))
        self.env_seconds += time.perf_counter() - t0
        return out

    async def reset(self, episodes: list[GuardedEpisode], groups: int, G: int, sample_seeds: list[int]
                    ) -> list[Playing]:
        """Every episode started, G to a group: a group's episodes must start from one observation."""
        firsts = await self.timed(e.reset() for e in episodes)
        plays: list[Playing] = []
        for group_index in range(groups):
            group_seed = sample_seeds[group_index]
            group = range(group_index * G, (group_index + 1) * G)
            started = [r for r in group if episodes[r].ended is None]  # a failed guarded reset: not
            first = firsts[started[0]] if started else ""
            if any(firsts[r] != first for r in started):
                raise ValueError(f"the episodes of group {group_index} started from different observations: an "
                                 "environment's episodes must be a function of (example, seed)")
            prompt, view = self._prompt(first), TemplateView.start(self.player.tokenizer, first, self._tools)
            plays += [Playing(episodes[r], prompt, sub_seed(group_seed, f"episode/{r - group_index * G}"),
                              done=r not in started, failed=r not in started,
                              transcript=[{"role": "env", "text": first}], view=view and view.copy()) for r in group]
        return plays

    @property
    def _tools(self) -> list[dict] | None:
        return self.player.env.tool_schemas

    def _prompt(self, first: str) -> list[int]:
        """A group's prompt ids: its first observation encoded as a prompt (with the tools' schemas where the
        environment has tools)."""
        tokenizer, tools = self.player.tokenizer, self._tools
        if first not in self.prompts:
            self.prompts[first] = (tool_prompt_ids(tokenizer, first, tools) if tools
                                   else encode_prompts(tokenizer, [first])[0])
        return list(self.prompts[first])

    async def turn(self, plays: list[Playing], turn: int) -> bool:
        """Turn `turn` of every live episode (an episode whose next turn could not fit the context is truncated);
        False when none was live."""
        live, contexts = self._fitting([p for p in plays if not p.done and not p.truncated])
        if not live:
            return False
        rows = action_lists(self._sample(live, contexts, turn))
        actions = self.observations.decode([ids for ids, _, _ in rows])
        for p, context, (ids, logprobs, entropy), action in zip(live, contexts, rows, actions, strict=True):
            if self.branching is not None:  # s_k, before the environment sees the action
                p.snapshots.append(p.episode.fork())
                p.contexts.append(context)
            p.act(ids, logprobs, entropy, action, turn)
        steps = await self.timed(p.episode.step(a) for p, a in zip(live, actions, strict=True))
        for p, step in zip(live, steps, strict=True):
            p.observe(step, turn, self.observations)
        return True

    def _fitting(self, live: list[Playing]) -> tuple[list[Playing], list[list[int]]]:
        """The live episodes whose next turn fits `env.max_context_tokens` (context plus `max_tokens` new ones), and
        their contexts; the others are truncated."""
        contexts = [p.context() for p in live]
        for p, context in zip(live, contexts, strict=True):
            if len(context) + self.sampling.max_tokens > self.player.env.max_context_tokens:
                p.truncated = True
        return [p for p in live if not p.truncated], [c for p, c in zip(live, contexts, strict=True) if not p.truncated]

    def _sample(self, live: list[Playing], contexts: list[list[int]], turn: int) -> Rollouts:
        """One action of each live episode, each from its own turn seed."""
        seeds = [sub_seed(p.seed, f"turn/{turn}") for p in live]
        if self.turns is not None:  # the engine keeps each episode's KV cache between its turns (keyed by episode)
            return self.turns.sample([id(p) for p in live], contexts, self.sampling, seeds, self.with_entropy)
        return self.player.engine.sample(contexts, 1, self.sampling, seeds=seeds, with_entropy=self.with_entropy)

    async def probe(self, plays: list[Playing]) -> tuple[Tensor | None, float]:
        """The branch probes' values and seconds (None, 0.0 without `branching`)."""
        if self.branching is None:
            return None, 0.0
        t0 = time.perf_counter()
        probed = [Probed(p.snapshots, p.contexts, p.actions_text, p.rewards, not (p.truncated or p.failed), p.seed)
                  for p in plays]
        branches = await probe(self.player.engine, self.player.tokenizer, probed, self.branching,
                               max([1, *(len(p.rewards) for p in plays)]), self.sampling, self.gather)
        return branches, time.perf_counter() - t0

    def gather(self, calls: Sequence[Any]) -> Awaitable[list]:
        """The calls gathered (`gather_eagerly`), within the environment's bound: how the probes are stepped."""
        return gather_eagerly(self.calls(calls))

    async def close(self, plays: list[Playing], episodes: list[GuardedEpisode]) -> None:
        """Free the turn sampler's caches and close every episode and fork, whatever happened."""
        if self.turns is not None:
            self.turns.close()
        await gather_eagerly([*(e.close() for p in plays for e in p.snapshots), *(e.close() for e in episodes)])
