"""Multi-turn episodes, token in and token out, packed one row per episode.

    context_0   = prompt ids (the first observation, encoded as every prompt is)
    action_k    = engine.sample(context_k, n=1)          the tokens the policy sampled, with their logprobs
    step_k      = episode.step(decode(action_k))          observation, reward, done, info
    context_k+1 = context_k + action_k + encode(observation_k)

The context of turn k+1 is exactly the context of turn k plus the sampled ids plus the observation's ids:
the history is never re-rendered and re-tokenized, so the tokens the backend trains on are the tokens the
engine sampled. A row is the completion region after the prompt: action 0, observation 0, action 1, …;
`Rollouts.actions_PG_T` marks the action tokens and `turn_PG_T` their turn (rlvr/types.py), so observation
tokens are attended to but never trained on.

A group's G episodes start from the same state (one game seed per prompt: `Environment.episode(example, seed)`),
as a GRPO group samples G completions of one prompt; they differ by what the policy samples. Each turn
samples every live episode of the batch in one `Engine.sample` call, each episode with its own seed:

    episode seed (p, g)   = sub_seed(group p's sampling seed, "episode/<g>")
    its turn k's seed     = sub_seed(episode seed, "turn/<k>")

so an episode's actions depend on its own seeds and the weights alone, not on which other episodes are still
playing, nor on how many processes share the step. An engine with a `turn_sampler` (engine=pytorch, rlvr/optional.py
`TurnSampling`) samples the turn instead through it, which keeps each episode's KV cache from its last turn and feeds
only what the context adds: the same draws and ids, the log-probabilities to float summation order
(rlvr/engine/pytorch.py "Turns"). The turn's environments are then stepped concurrently (at most
`env.max_concurrent` calls in flight, for a server with a session limit; a call that never suspends, an in-process
game's, is simply run: rlvr/calls.py).
An episode ends when the environment says done, or is truncated (kept, marked) when it has taken `max_turns`
actions or its next turn could not fit in `max_context_tokens` (context plus `max_tokens` new ones). Its reward
is the sum of its turns' rewards.

With `branching` (turn_credit=tl_grpo), each episode is forked before every action (the state s_k) and, once
the batch is played, rlvr/rollout/branch_probes.py tries alternatives on those forks: `Played.branch_rewards_PG_K_B`.

An observation's ids: `tokenizer.encode(text, add_special_tokens=False)` without a chat template; with one,
the suffix the template adds for a user message after the assistant's turn, led by the end-of-turn token when the
action did not sample it (cut by max_tokens): rlvr/chat/observation.py. A run checks once at start that the template
can play episodes this way (rlvr/chat/check.py), refusing the model otherwise.

Rewrites. After each observation the conversation is also rendered as the chat template renders it
(rlvr/chat/rewrites.py); a turn at which that render no longer extends the previous one and the action
(prime-rl's extension property: the template rewrote an earlier turn, e.g. dropped a past `<think>` block or
trimmed the action) is recorded in `Played.rewritten_turns` and counted (`env/template_rewrite_frac`). There, as
prime-rl does, the row starts a new sequence: the next action is sampled from the template's re-render, and the row
records where (`Rollouts.segments_PG`), so the backends train the tokens after it behind that re-render, the prompt
they were sampled from, not behind the row's earlier tokens (`env/sequences_mean` counts the sequences).

The loop itself (reset, turns, probes) is rlvr/rollout/episode_loop.py; `play` runs it once. The rollout returns the
episodes as played (`StepBatch.turns`); turn credit reads them in the credit step (rlvr/credit.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.distributed import gather_played
from rlvr.rollout.episode_loop import Player
from rlvr.seeds import Seeds, eval_sampling_seeds, group_sampling_seeds, sub_seed
from rlvr.tools.harness import tool_metrics
from rlvr.types import Played, Sampled, SamplingParams, Scores, StepBatch

if TYPE_CHECKING:

    from rlvr.distributed import World
    from rlvr.env.guarded import GuardedEnvironment
    from rlvr.protocols import Engine
    from rlvr.types import Branching, EnvFailures, Example


@dataclass(frozen=True)
class PlayedShare:
    """This process's share of a step's episodes as played (`Sampled.rows` of `Episodes`), not yet gathered."""

    played: Played
    failures: EnvFailures
    """The environment failures its episodes met."""


class Episodes:
    """Multi-turn rollouts: env → turns → the played batch. A row is one episode; its group's G episodes start from the
    same game (one seed per group, a function of the data seed and the group's position in the data stream).

    Over several processes each plays its contiguous share of the groups (`World.share`) and the played batch is
    gathered (`rlvr.distributed.gather_played`): every process then holds the whole step, the same as one process
    would have played, since every episode samples from its own seeds."""

    def __init__(self, engine: Engine, tokenizer: Any, env: GuardedEnvironment, seeds: Seeds, world: World,
                 with_entropy: bool = False, branching: Branching | None = None) -> None:
        self.tokenizer, self.env, self.seeds, self.world = tokenizer, env, seeds, world
        self.with_entropy, self.branching = with_entropy, branching
        self.player = Player(engine, tokenizer, env)

    def sample(self, examples: list[Example], step: int, position: int, group_size: int,
               sampling: SamplingParams) -> Sampled[PlayedShare]:
        """This process's share of G episodes of each example's game, played with `sampling`; not yet gathered."""
        games = episode_seeds(self.seeds, position, len(examples))
        groups = group_sampling_seeds(self.seeds.sampler, step, position, len(examples))
        return self._play(examples, group_size, sampling, games, groups, self.with_entropy, self.branching)

    def finish(self, sampled: Sampled[PlayedShare]) -> StepBatch:
        """The step gathered, with the episodes as played (what turn credit reads)."""
        from rlvr.telemetry import episode_metrics

        share = sampled.rows
        played, failures = gather_played(self.world, share.played, share.failures, self.tokenizer.pad_token_id)
        metrics = episode_metrics(played, failures)
        if self.env.tool_schemas:  # env.tools (rlvr/tools/harness.py)
            metrics |= tool_metrics(played.infos)
        return StepBatch(
            rollouts=played.rollouts, rewards_P_G=played.rewards_P_G,
            completions=[transcript_text(t) for t in played.transcripts], scores=self._scores(played, failures),
            metrics=metrics, failures={k: metrics[k] for k in ("env/error_frac", "env/timeout_frac")},
            what="episodes", check="the environment, env.step_timeout_s and the server",
            sample_seconds=sampled.seconds - played.env_seconds - played.probe_seconds,
            score_seconds=played.env_seconds, credit_seconds=played.probe_seconds, turns=played,
        )

    def evaluate(self, examples: list[Example], max_tokens: int, samples: int = 1,
                 temperature: float = 0.0, first: int = 0) -> StepBatch:
        """One greedy episode of each held-out example, on held-out games (the same for every run seed), with
        `max_tokens` per turn; accuracy counts the episodes whose reward is > 0.5. With `temperature` > 0:
        `samples` episodes of each game at that temperature (top_p 1), each group's sampling seed from
        rlvr/seeds.py's eval_sampling_seeds (each episode's, as in training, from its group's); `examples` are the
        held-out set's from place `first` on. No maj@k: an
        environment's reward has no answer to compare (rlvr/rollout/sampled_eval.py)."""
        self.env.failures.take()  # a training step's failures are that step's; count this evaluation's alone
        sampling = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens)
        end = first + len(examples)
        seeds = eval_sampling_seeds(self.seeds.sampler, end)[first:] if temperature > 0 else [0] * len(examples)
        sampled = self._play(examples, samples, sampling, eval_episode_seeds(end)[first:], seeds, False, None)
        share = sampled.rows
        played, failures = gather_played(self.world, share.played, share.failures, self.tokenizer.pad_token_id)
        metrics = {"eval/turns_mean": float(played.turns_PG.float().mean()),
                   "eval/truncated_frac": float(played.truncated_PG.float().mean())}
        if self.env.tool_schemas:
            metrics["eval/tool_call_frac"] = tool_metrics(played.infos)["env/tool_call_frac"]
        return StepBatch(
            rollouts=played.rollouts, rewards_P_G=played.rewards_P_G,
            completions=[transcript_text(t) for t in played.transcripts], scores=self._scores(played, failures),
            metrics=metrics, failures=failures.fractions("env/"), what="episodes", check="the environment",
            sample_seconds=sampled.seconds - played.env_seconds, score_seconds=played.env_seconds, turns=played,
        )

    def _play(self, examples: list[Example], G: int, sampling: SamplingParams, game_seeds: list[int],
              sample_seeds: list[int], with_entropy: bool, branching: Branching | None) -> Sampled[PlayedShare]:
        """This process's share of the groups played, with the environment failures they met."""
        t0 = time.perf_counter()
        mine = self.world.share(len(examples))
        played = self.player.play([examples[i] for i in mine], G, sampling, [game_seeds[i] for i in mine],
                                  [sample_seeds[i] for i in mine], with_entropy, branching)
        return Sampled(PlayedShare(played, self.env.failures.take()), time.perf_counter() - t0)

    @staticmethod
    def _scores(played: Played, failures: EnvFailures) -> Scores:
        return Scores(values=played.rewards_P_G.view(-1).tolist(), errors=failures.errors, timeouts=failures.timeouts)


def play(engine: Engine, tokenizer: Any, env: GuardedEnvironment, examples: list[Example], group_size: int,
         sampling: SamplingParams, seeds: list[int], sample_seeds: list[int], with_entropy: bool = False,
         branching: Branching | None = None) -> Played:
    """One batch played by a `Player` of its own (rlvr/rollout/episode_loop.py): `group_size` episodes of each
    example, `seeds[p]` the game its group starts from, `sample_seeds[p]` its group's sampling seed."""
    return Player(engine, tokenizer, env).play(examples, group_size, sampling, seeds, sample_seeds, with_entropy,
                                               branching)


def episode_seeds(seeds: Seeds, position: int, count: int) -> list[int]:
    """The seeds of the `count` episodes groups that start at position `position` of the data stream: a function
    of the run's data seed and the position, so a resumed run replays the same games."""
    return [sub_seed(seeds.data, f"episode/{position + i}") for i in range(count)]


def eval_episode_seeds(count: int) -> list[int]:
    """Held-out games: the same for every run seed, apart from every training seed's."""
    return [sub_seed(EVAL_SEED_ROOT, f"eval/{i}") for i in range(count)]


EVAL_SEED_ROOT = 0x5EED


def transcript_text(transcript: list[dict]) -> str:
    """An episode's turns after its prompt, as one text (`samples/`' completion, a reference-free reading)."""
    return "".join(turn["text"] for turn in transcript[1:])
