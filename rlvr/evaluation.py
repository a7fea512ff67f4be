"""Greedy held-out evaluation: one function for the trainer (at start, every `trainer.eval_every` steps, at the
end) and for `rlvr eval` on a saved checkpoint, so both give the same numbers from the same weights.

    examples    = data.eval_examples()
    engine.sync(policy)
    rollouts    = engine.sample(prompts, n=1, T=0, top_p=1, max_tokens, seed=0)
    scores      = guarded_score(reward, completions, references)
    row         = eval_row(...)        rlvr/telemetry.py: eval/accuracy, eval/mean_reward, …, eval_time_s

`eval_time_s` covers all of it (the held-out set, the sync, sampling and scoring); every other field
depends only on the weights, the data, the reward and `max_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.distributed import gather_step
from rlvr.episodes import eval_episode_seeds, play, transcript_text
from rlvr.model.prompt_encoding import decode_completions, encode_prompts
from rlvr.reward.guarded import guarded_score
from rlvr.telemetry import eval_row
from rlvr.types import Example, Rollouts, SamplingParams, Scores

if TYPE_CHECKING:
    from torch import nn

    from rlvr.distributed import World
    from rlvr.env.guarded import GuardedEnvironment
    from rlvr.protocols import DataSource, Engine, Reward


@dataclass(frozen=True)
class Evaluation:
    row: dict
    """The metrics row (`step` = optimizer steps done), as metrics.jsonl holds it."""
    examples: list[Example]
    completions: list[str]
    """One greedy completion per example, decoded without EOS or padding."""
    scores: Scores
    rollouts: Rollouts


def evaluate_held_out(engine: Engine, policy: nn.Module, tokenizer, data: DataSource, reward: Reward,
                      max_tokens: int, steps_done: int, world: World | None = None) -> Evaluation:
    """Greedy (T=0) accuracy of `policy` on `data.eval_examples()`, sampled by `engine` up to `max_tokens`. In a
    distributed run (`world`) each rank decodes and scores its share of the examples and every rank gets the whole
    evaluation (greedy decoding does not depend on which examples share a batch, up to float summation order)."""
    t0 = time.perf_counter()
    examples = data.eval_examples()
    mine = range(len(examples)) if world is None else world.share(len(examples))
    prompt_ids = encode_prompts(tokenizer, [examples[i].prompt for i in mine])
    engine.sync(policy)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens)
    rollouts = engine.sample(prompt_ids, 1, greedy, seed=0)
    completions = decode_completions(tokenizer, rollouts)
    scores = guarded_score(reward, completions, [examples[i].reference for i in mine])
    if world is not None:
        rollouts, completions, scores = gather_step(rollouts, completions, scores, tokenizer.pad_token_id)
    row = eval_row(steps_done, scores, rollouts, time.perf_counter() - t0)
    return Evaluation(row, list(examples), completions, scores, rollouts)


def evaluate_episodes(engine: Engine, policy: nn.Module, tokenizer, data: DataSource, env: GuardedEnvironment,
                      max_tokens: int, steps_done: int) -> Evaluation:
    """Multi-turn: one greedy episode per held-out example, on held-out game seeds (the same for every run
    seed, rlvr/episodes.py), `max_tokens` per turn. Accuracy = episodes whose reward is > 0.5."""
    t0 = time.perf_counter()
    examples = data.eval_examples()
    engine.sync(policy)
    env.failures.take()  # a training step's failures are that step's; count this evaluation's alone
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens)
    played = play(engine, tokenizer, env, examples, 1, greedy, eval_episode_seeds(len(examples)), sample_seed=0)
    failures = env.failures.take()
    scores = Scores(values=played.rewards_P_G.view(-1).tolist(), errors=failures.errors, timeouts=failures.timeouts)
    row = {**eval_row(steps_done, scores, played.rollouts, time.perf_counter() - t0),
           "eval/turns_mean": float(played.turns_PG.float().mean()),
           "eval/truncated_frac": float(played.truncated_PG.float().mean())}
    completions = [transcript_text(t) for t in played.transcripts]
    return Evaluation(row, list(examples), completions, scores, played.rollouts)
