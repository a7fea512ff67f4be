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
playing, nor on how many processes share the step. An engine with a `turn_sampler` (engine=pytorch) samples the
turn instead through it, which keeps each episode's KV cache from its last turn and feeds only what the context
adds: the same draws and ids, the log-probabilities to float summation order (rlvr/engine/pytorch.py "Turns").
The turn's environments are then stepped concurrently (at most `env.max_concurrent` calls in flight, for a server
with a session limit; a call that never suspends, an in-process game's, is simply run: rlvr/env/guarded.py).
An episode ends when the environment says done, or is truncated (kept, marked) when it has taken `max_turns`
actions or its next turn could not fit in `max_context_tokens` (context plus `max_tokens` new ones). Its reward
is the sum of its turns' rewards.

With `branching` (turn_credit=tl_grpo), each episode is forked before every action (the state s_k) and, once
the batch is played, rlvr/rollout/branch_probes.py tries alternatives on those forks: `Played.branch_rewards_PG_K_B`.

An observation's ids: `tokenizer.encode(text, add_special_tokens=False)` without a chat template; with one,
the suffix the template adds for a user message after the assistant's turn (rlvr/rollout/chat_turns.py), led by
the end-of-turn token when the action did not sample it (cut by max_tokens). The trainer checks once at start
that the template can play episodes this way (`chat_turns.check_chat_turns`), refusing the model otherwise.

Rewrites. After each observation the conversation is also rendered as the chat template renders it
(rlvr/rollout/template_rewrites.py); a turn at which that render no longer extends the previous one and the action
(prime-rl's extension property: the template rewrote an earlier turn, e.g. dropped a past `<think>` block or
trimmed the action) is recorded in `Played.rewritten_turns` and counted (`env/template_rewrite_frac`). There, as
prime-rl does, the row starts a new sequence: the next action is sampled from the template's re-render, and the row
records where (`Rollouts.segments_PG`), so the backends train the tokens after it behind that re-render, the prompt
they were sampled from, not behind the row's earlier tokens (`env/sequences_mean` counts the sequences).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rlvr.distributed import gather_played
from rlvr.env.guarded import gather_eagerly
from rlvr.lazy import lazy_import
from rlvr.model.prompt_encoding import encode_prompts
from rlvr.rollout.branch_probes import Probed, probe
from rlvr.rollout.chat_turns import end_of_turn_id, observation_ids
from rlvr.rollout.observation_body import observation_body
from rlvr.rollout.template_rewrites import TemplateView
from rlvr.seeds import Seeds, eval_sampling_seeds, group_sampling_seeds, sub_seed
from rlvr.tools.harness import tool_metrics
from rlvr.tools.render import tool_prompt_ids, tool_turn_ids
from rlvr.turn_credit.played import turn_signals
from rlvr.types import Played, Rollouts, Sampled, SamplingParams, Scores, StepBatch

if TYPE_CHECKING:

    from rlvr.distributed import World
    from rlvr.env.guarded import GuardedEnvironment
    from rlvr.protocols import Engine, Episode
    from rlvr.types import Branching, Example

torch = lazy_import("torch")


@dataclass
class _Play:
    """One episode while it is played."""

    episode: Episode
    prompt: list[int]
    seed: int
    """The episode's sampling seed: turn k samples with sub_seed(seed, "turn/<k>") (module docstring)."""
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
    """The conversation as the chat template renders it (rlvr/rollout/template_rewrites.py); None without one."""
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


class Episodes:
    """Multi-turn rollouts: env → turns → turn signals. A row is one episode; its group's G episodes start from the
    same game (one seed per group, a function of the data seed and the group's position in the data stream).

    Over several processes each plays its contiguous share of the groups (`World.share`) and the played batch is
    gathered (`rlvr.distributed.gather_played`): every process then holds the whole step, the same as one process
    would have played, since every episode samples from its own seeds."""

    def __init__(self, engine: Engine, tokenizer, env: GuardedEnvironment, seeds: Seeds, world: World,
                 with_entropy: bool = False, branching: Branching | None = None) -> None:
        self.engine, self.tokenizer, self.env, self.seeds, self.world = engine, tokenizer, env, seeds, world
        self.with_entropy, self.branching = with_entropy, branching

    def sample(self, examples: list[Example], step: int, position: int, group_size: int,
               sampling: SamplingParams) -> Sampled:
        """This process's share of G episodes of each example's game, played with `sampling`; not yet gathered."""
        games = episode_seeds(self.seeds, position, len(examples))
        groups = group_sampling_seeds(self.seeds.sampler, step, position, len(examples))
        return self._play(examples, group_size, sampling, games, groups, self.with_entropy, self.branching)

    def finish(self, sampled: Sampled) -> StepBatch:
        """The step gathered, with what turn credit reads of it."""
        from rlvr.telemetry import episode_metrics

        played, failures = gather_played(self.world, sampled.rows[0], sampled.rows[1], self.tokenizer.pad_token_id)
        metrics = episode_metrics(played, failures)
        if getattr(self.env, "tool_schemas", None):  # env.tools (rlvr/tools/harness.py)
            metrics |= tool_metrics(played.infos)
        return StepBatch(
            rollouts=played.rollouts, rewards_P_G=played.rewards_P_G,
            completions=[transcript_text(t) for t in played.transcripts], scores=self._scores(played, failures),
            metrics=metrics, failures={k: metrics[k] for k in ("env/error_frac", "env/timeout_frac")},
            what="episodes", check="the environment, env.step_timeout_s and the server",
            sample_seconds=sampled.seconds - played.env_seconds - played.probe_seconds,
            score_seconds=played.env_seconds, credit_seconds=played.probe_seconds, turns=turn_signals(played),
            played=played,
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
        played, failures = gather_played(self.world, sampled.rows[0], sampled.rows[1], self.tokenizer.pad_token_id)
        metrics = {"eval/turns_mean": float(played.turns_PG.float().mean()),
                   "eval/truncated_frac": float(played.truncated_PG.float().mean())}
        if getattr(self.env, "tool_schemas", None):
            metrics["eval/tool_call_frac"] = tool_metrics(played.infos)["env/tool_call_frac"]
        return StepBatch(
            rollouts=played.rollouts, rewards_P_G=played.rewards_P_G,
            completions=[transcript_text(t) for t in played.transcripts], scores=self._scores(played, failures),
            metrics=metrics, failures=failures.fractions("env/"), what="episodes", check="the environment",
            sample_seconds=sampled.seconds - played.env_seconds, score_seconds=played.env_seconds, played=played,
        )

    def _play(self, examples: list[Example], G: int, sampling: SamplingParams, game_seeds: list[int],
              sample_seeds: list[int], with_entropy: bool, branching: Branching | None) -> Sampled:
        """This process's share of the groups played, with the environment failures they met."""
        t0 = time.perf_counter()
        mine = self.world.share(len(examples))
        played = play(self.engine, self.tokenizer, self.env, [examples[i] for i in mine], G, sampling,
                      [game_seeds[i] for i in mine], [sample_seeds[i] for i in mine], with_entropy, branching)
        return Sampled((played, self.env.failures.take()), time.perf_counter() - t0)

    @staticmethod
    def _scores(played: Played, failures) -> Scores:
        return Scores(values=played.rewards_P_G.view(-1).tolist(), errors=failures.errors, timeouts=failures.timeouts)


def play(engine: Engine, tokenizer, env: GuardedEnvironment, examples: list[Example], group_size: int,
         sampling: SamplingParams, seeds: list[int], sample_seeds: list[int], with_entropy: bool = False,
         branching: Branching | None = None) -> Played:
    """Play `group_size` episodes of each example (`seeds[p]`: the game its group starts from; `sample_seeds[p]`:
    its group's sampling seed, from which each episode's are derived, module docstring). With `branching`
    (tl_grpo) each episode is forked before every action and the branch probes run once all are played."""
    played: list[Played] = []

    async def main() -> None:  # returns None: see below
        played.append(await _play(engine, tokenizer, env, examples, group_size, sampling, seeds, sample_seeds,
                                  with_entropy, branching))

    # Where no SIGINT handler is set (`rlvr eval`, tests; a run sets its own), asyncio.run sets one naming its main
    # task and, setting the default back, formats that task, its result included: a Played would cost ~10 ms of
    # tensor printing here.
    asyncio.run(main())
    return played[0]


async def _play(engine, tokenizer, env, examples, G, sampling, seeds, sample_seeds, with_entropy,
                branching) -> Played:
    env_seconds = 0.0
    limit = asyncio.Semaphore(env.max_concurrent) if env.max_concurrent else None

    async def bounded(awaitable):
        async with limit:
            return await awaitable

    def calls(awaitables):
        """The calls, each bounded by `env.max_concurrent` where it is set."""
        return awaitables if limit is None else (bounded(a) for a in awaitables)

    async def timed(awaitables):
        """Every episode's call at once (at most `env.max_concurrent` in flight), timed together."""
        nonlocal env_seconds
        t0 = time.perf_counter()
        out = await gather_eagerly(calls(awaitables))
        env_seconds += time.perf_counter() - t0
        return out

    episodes = [env.episode(example, seed) for example, seed in zip(examples, seeds, strict=True) for _ in range(G)]
    plays: list[_Play] = []
    turns = engine.turn_sampler() if hasattr(engine, "turn_sampler") else None  # rlvr/protocols.py
    observations = Observations(tokenizer)
    tools = getattr(env, "tool_schemas", None)  # env.tools: their schemas shown in the prompt
    prompts: dict[str, list[int]] = {}  # each distinct first observation encoded once
    try:
        firsts = await timed(e.reset() for e in episodes)
        for group_index in range(len(examples)):
            group = range(group_index * G, (group_index + 1) * G)
            started = [r for r in group if episodes[r].ended is None]  # a failed guarded reset: not
            first = firsts[started[0]] if started else ""
            if any(firsts[r] != first for r in started):
                raise ValueError(f"the episodes of group {group_index} started from different observations: an "
                                 "environment's episodes must be a function of (example, seed)")
            if first not in prompts:
                prompts[first] = (tool_prompt_ids(tokenizer, first, tools) if tools
                                  else encode_prompts(tokenizer, [first])[0])
            prompt = list(prompts[first])
            view = TemplateView.start(tokenizer, first, tools)
            plays += [_Play(episodes[r], prompt, sub_seed(sample_seeds[group_index], f"episode/{r - group_index * G}"),
                            done=r not in started, failed=r not in started,
                            transcript=[{"role": "env", "text": first}], view=view and view.copy()) for r in group]
        for turn in range(env.max_turns):
            live = [p for p in plays if not p.done and not p.truncated]
            contexts = [p.context() for p in live]
            for p, context in zip(live, contexts, strict=True):
                if len(context) + sampling.max_tokens > env.max_context_tokens:
                    p.truncated = True
            contexts = [c for p, c in zip(live, contexts, strict=True) if not p.truncated]
            live = [p for p in live if not p.truncated]
            if not live:
                break
            seeds = [sub_seed(p.seed, f"turn/{turn}") for p in live]
            if turns is not None:  # the engine keeps each episode's KV cache between its turns (keyed by episode)
                sampled = turns.sample([id(p) for p in live], contexts, sampling, seeds, with_entropy)
            else:
                sampled = engine.sample(contexts, 1, sampling, seeds=seeds, with_entropy=with_entropy)
            rows = action_lists(sampled)
            actions = observations.decode([ids for ids, _, _ in rows])
            for p, context, (ids, logprobs, entropy), action in zip(live, contexts, rows, actions, strict=True):
                if branching is not None:  # s_k, before the environment sees the action
                    p.snapshots.append(p.episode.fork())
                    p.contexts.append(context)
                p.append(ids, logprobs, entropy, turn)
                p.actions_text.append(action)
                p.transcript.append({"role": "policy", "text": action})
            steps = await timed(p.episode.step(a) for p, a in zip(live, actions, strict=True))
            for p, step in zip(live, steps, strict=True):
                p.rewards.append(float(step.reward))
                p.infos.append(dict(step.info))
                p.done = bool(step.done)
                p.failed = p.failed or "error" in step.info
                if not p.done and step.observation:
                    results = step.info.get("tool_results")
                    ids, body = observations.encode(step.observation, p.tokens, results)
                    p.append(ids, [0.0] * len(ids), [0.0] * len(ids), -1, body)
                    if p.view is not None and not p.view.extends(p.actions_text[-1], step.observation, results):
                        p.rewritten.append(turn)  # the next action follows the re-render: a new sequence
                        p.segments.append((len(p.tokens), p.view.ids()))
                    p.transcript.append({"role": "tool" if "tool_results" in step.info else "env",
                                         "text": step.observation})
        for p in plays:
            p.truncated = p.truncated or not p.done
            if p.failed:  # what its earlier turns earned is not trusted either
                p.rewards = [0.0] * len(p.rewards)
        branches, probe_seconds = None, 0.0
        if branching is not None:
            t0 = time.perf_counter()
            probed = [Probed(p.snapshots, p.contexts, p.actions_text, p.rewards, not (p.truncated or p.failed), p.seed)
                      for p in plays]
            branches = await probe(engine, tokenizer, probed, branching, max([1, *(len(p.rewards) for p in plays)]),
                                   sampling, lambda probes: gather_eagerly(calls(probes)))
            probe_seconds = time.perf_counter() - t0
    finally:
        if turns is not None:
            turns.close()
        await gather_eagerly([*(e.close() for p in plays for e in p.snapshots), *(e.close() for e in episodes)])
    played = _pack(plays, examples, G, sampling.temperature, tokenizer.pad_token_id, with_entropy, env_seconds)
    return replace(played, branch_rewards_PG_K_B=branches, probe_seconds=probe_seconds)


def _pack(plays: list[_Play], examples, G: int, temperature: float, pad_id: int, with_entropy: bool,
          env_seconds: float) -> Played:
    rows, T = len(plays), max([1, *(len(p.tokens) for p in plays)])
    K = max([1, *(len(p.rewards) for p in plays)])

    def padded(lists: list[list], fill, dtype, width: int = T):
        """[rows, width] with each list at the left of its row, `fill` after it (one tensor, not one per row)."""
        out = torch.tensor([values + [fill] * (width - len(values)) for values in lists], dtype=dtype)
        return out.view(rows, width)

    mask = padded([[True] * len(p.tokens) for p in plays], False, torch.bool)
    turn_rewards = padded([p.rewards for p in plays], math.nan, torch.float32, K)
    rollouts = Rollouts(
        prompt_ids_P=[plays[p * G].prompt for p in range(len(examples))], group_size=G,
        tokens_PG_T=padded([p.tokens for p in plays], pad_id, torch.long),
        logprobs_PG_T=padded([p.logprobs for p in plays], 0.0, torch.float32),
        mask_PG_T=mask, finished_PG=torch.tensor([p.done and not p.truncated for p in plays]), temperature=temperature,
        entropy_PG_T=padded([p.entropy for p in plays], 0.0, torch.float32) if with_entropy else None,
        actions_PG_T=padded([p.actions for p in plays], False, torch.bool),
        turn_PG_T=padded([p.turns for p in plays], -1, torch.long),
        observation_body_PG_T=padded([p.body for p in plays], False, torch.bool),
        segments_PG=[[(a, ids) for a, ids in p.segments if a < len(p.tokens)] for p in plays]
        if any(p.segments for p in plays) else None,
    )
    return Played(
        rollouts=rollouts,
        rewards_P_G=torch.tensor([sum(p.rewards) for p in plays], dtype=torch.float32).view(len(examples), G),
        turn_rewards_PG_K=turn_rewards,
        turns_PG=torch.tensor([len(p.rewards) for p in plays]),
        truncated_PG=torch.tensor([p.truncated and not p.failed for p in plays]),
        failed_PG=torch.tensor([p.failed for p in plays]),
        transcripts=[p.transcript for p in plays],
        infos=[p.infos for p in plays],
        env_seconds=env_seconds,
        rewritten_turns=[p.rewritten for p in plays] if any(p.view is not None for p in plays) else None,
    )


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


def action_lists(sampled: Rollouts) -> list[tuple[list[int], list[float], list[float]]]:
    """Each row's sampled ids, logprobs and entropies (0.0 each without them) up to its mask's end, as lists: one
    `tolist` per tensor for the whole turn."""
    lengths = sampled.mask_PG_T.sum(1).tolist()
    tokens, logprobs = sampled.tokens_PG_T.tolist(), sampled.logprobs_PG_T.tolist()
    entropy = sampled.entropy_PG_T.tolist() if sampled.entropy_PG_T is not None else None
    return [(tokens[i][:n], logprobs[i][:n], entropy[i][:n] if entropy is not None else [0.0] * n)
            for i, n in enumerate(lengths)]


class Observations:
    """Observations' ids and body flags (`encode_observation`, rlvr/rollout/observation_body.py) and actions' texts,
    each distinct one encoded (decoded) once per played batch: an observation's ids depend on the text, the tool
    results and whether the row ends with the end-of-turn token, nothing else; an action's text on its ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.closing = end_of_turn_id(tokenizer) if getattr(tokenizer, "chat_template", None) else None
        self.seen: dict[tuple, tuple[list[int], list[bool]]] = {}
        self.texts: dict[tuple[int, ...], str] = {}

    def decode(self, actions: list[list[int]]) -> list[str]:
        """Each action's text, special tokens skipped."""
        keys = [tuple(ids) for ids in actions]
        new = list(dict.fromkeys(k for k in keys if k not in self.texts))
        if new:
            texts = self.tokenizer.batch_decode([list(k) for k in new], skip_special_tokens=True)
            self.texts.update(zip(new, texts, strict=True))
        return [self.texts[k] for k in keys]

    def encode(self, observation: str, row: list[int], results: list[str] | None) -> tuple[list[int], list[bool]]:
        closed = self.closing is not None and bool(row) and row[-1] == self.closing
        key = (observation, None if results is None else tuple(results), closed)
        if key not in self.seen:
            ids = encode_observation(self.tokenizer, observation, row, results)
            blank = None if results is None else [""] * len(results)  # the template alone: ECHO's marker
            self.seen[key] = ids, observation_body(ids, encode_observation(self.tokenizer, "", row, blank))
        ids, body = self.seen[key]
        return list(ids), list(body)


def encode_observation(tokenizer, observation: str, row: list[int], tool_results: list[str] | None = None
                       ) -> list[int]:
    """The ids an observation adds to a row whose last tokens are an action (module docstring); a tool turn's
    (`tool_results`, rlvr/tools/harness.py) are a tool-role turn (rlvr/tools/render.py)."""
    if tool_results is not None:
        return tool_turn_ids(tokenizer, tool_results, row)
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(observation, add_special_tokens=False)
    closing = end_of_turn_id(tokenizer)
    return ([] if row and row[-1] == closing else [closing]) + observation_ids(tokenizer, observation)
