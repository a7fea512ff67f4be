"""TL-GRPO's branch probes (turn_credit=tl_grpo, docs/algorithms.md#tl_grpo): once a batch of episodes is
played, the value of each turn's action beside alternatives tried from the same state.

While it plays, the episode loop (rlvr/rollout/episodes.py) keeps a fork of every episode before each of its actions:
s_k, the state before action a_k. Afterwards, for every turn k of every episode that ended on its own
(neither truncated nor failed: those are not probed, and tl_grpo gives them the episode advantage):

    c        = a_{k+1} … a_{k+L}: the primary's next L = `lookahead` actions (fewer near its end)
    v_0      = r_k + r_{k+1} + … + r_{k+|c|}                   the primary's own turn rewards: a_k then c
    v_b      = reward collected on a fork of s_k by alternative b, then c replayed (not resampled) until
               the fork ends; b = 1 … B − 1
    a probe whose environment failed (raised, hung, malformed answer) is worth 0.0, the predecessor's rule

Alternatives (B = `size`):

    action_space  up to B − 1 distinct legal actions of s_k (`Episode.legal_actions()`) other than a_k (both
                  stripped of surrounding whitespace), drawn by random.Random(sub_seed(s, "branch/k"));
                  none when a_k is not legal (an invalid action carries v_0 alone), as in the predecessor,
                  which drew them unseeded
    llm           B − 1 samples of the policy at turn k's context (the exact ids the primary was sampled
                  from): one Engine.sample over every probed turn, turn k's seeded by sub_seed(s, "branch/k")

where s is the episode's own sampling seed (rlvr/rollout/episodes.py). So an episode's probes are a function of
its seed alone: a resumed run probes what the uninterrupted one did, and so does a run over several processes. The
probes are stepped concurrently within the environment's bound, as the episodes are.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.seeds import sub_seed

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.protocols import Engine, Episode
    from rlvr.types import Branching, SamplingParams

torch = lazy_import("torch")


@dataclass(frozen=True)
class Probed:
    """One played episode as the probes read it."""

    snapshots: list[Episode]
    """A fork taken before each action: s_0, s_1, …"""
    contexts: list[list[int]]
    """The ids each action was sampled from (prompt, earlier actions and observations)."""
    actions: list[str]
    """Each action's decoded text, as the environment received it."""
    rewards: list[float]
    """Each turn's reward."""
    probe: bool
    """Ended on its own: neither truncated nor failed."""
    seed: int
    """The episode's sampling seed (rlvr/rollout/episodes.py): its probes' draws are derived from it."""


async def probe(engine: Engine, tokenizer, episodes: Sequence[Probed], branching: Branching, turns: int,
                sampling: SamplingParams, run: Callable[[Sequence[Awaitable]], Awaitable[list]]) -> Tensor:
    """float32 [rows, `turns`, B]: [..., 0] the primary's value, [..., 1:] the alternatives', NaN where nothing
    was probed. `run` awaits a list of calls concurrently within the environment's bound."""
    B, L = branching.size, branching.lookahead
    values = torch.full((len(episodes), turns, B), math.nan)
    points = [(r, k) for r, e in enumerate(episodes) if e.probe for k in range(len(e.rewards))]
    for r, k in points:
        values[r, k, 0] = sum(episodes[r].rewards[k: k + L + 1])
    alternatives = (_sampled(engine, tokenizer, episodes, points, B - 1, sampling) if branching.mode == "llm"
                    else [_legal(episodes[r], k, B - 1, sub_seed(episodes[r].seed, f"branch/{k}")) for r, k in points])
    calls, slots, forks = [], [], []
    for (r, k), alts in zip(points, alternatives, strict=True):
        episode = episodes[r]
        for b, alt in enumerate(alts, start=1):
            fork = episode.snapshots[k].fork()
            forks.append(fork)
            calls.append(_replay(fork, [alt, *episode.actions[k + 1: k + 1 + L]]))
            slots.append((r, k, b))
    try:
        for (r, k, b), value in zip(slots, await run(calls), strict=True):
            values[r, k, b] = value
    finally:
        for fork in forks:
            await fork.close()
    return values


def _legal(episode: Probed, k: int, count: int, seed: int) -> list[str]:
    """Up to `count` legal actions of s_k other than a_k, drawn at random; none when a_k is not legal."""
    legal = sorted({a.strip() for a in episode.snapshots[k].legal_actions()})
    primary = episode.actions[k].strip()
    if primary not in legal:
        return []
    others = [a for a in legal if a != primary]
    return random.Random(seed).sample(others, min(count, len(others)))


def _sampled(engine: Engine, tokenizer, episodes: Sequence[Probed], points: list[tuple[int, int]], count: int,
             sampling: SamplingParams) -> list[list[str]]:
    """`count` policy samples at each probed turn's context, decoded as actions are."""
    if not points:
        return []
    sampled = engine.sample([episodes[r].contexts[k] for r, k in points], count, sampling,
                            seeds=[sub_seed(episodes[r].seed, f"branch/{k}") for r, k in points])
    texts = [tokenizer.decode(sampled.tokens_PG_T[i, : int(sampled.mask_PG_T[i].sum())].tolist(),
                              skip_special_tokens=True) for i in range(len(points) * count)]
    return [texts[i * count: (i + 1) * count] for i in range(len(points))]


async def _replay(episode: Episode, actions: list[str]) -> float:
    """The reward `actions` collect on `episode`, stopping where it ends; 0.0 if its environment fails."""
    total = 0.0
    for action in actions:
        step = await episode.step(action)
        if "error" in step.info:
            return 0.0
        total += float(step.reward)
        if step.done:
            break
    return total
