"""Single-turn rollouts: data → engine → reward. A row is one completion of its prompt.

    seeds       = one sampling seed per group: sub_seed(sub_seed(seeds.sampler, "step/<step>"), "group/<position>")
    rollouts    = engine.sample(this process's share of the prompts, n=G, seeds)
    scores      = reward.score(decoded completions, references)         rlvr/reward/guarded.py: guarded_score
    batch       = gathered over the run's processes                      rlvr/distributed.py: gather_step

A group's completions depend only on its own seed, a function of the run seed, the step and the group's position
in the data stream: not on the other groups of the step, nor on how many processes share it. Scoring runs inside
`interruptible` (the trainer's StopSignals.interruptible): a stop signal then does not wait for a verifier that
hangs. The interrupted rank still joins the step's gather, which tells every rank (`gather_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlvr.distributed import World, gather_step
from rlvr.lazy import lazy_import
from rlvr.model.prompt_encoding import decode_completions, encode_prompts
from rlvr.preemption import StepInterrupted
from rlvr.protocols import AnswerReward
from rlvr.reward.guarded import RewardGuard, guarded_score
from rlvr.rollout.sampled_eval import majority_metric
from rlvr.seeds import Seeds, eval_sampling_seeds, group_sampling_seeds
from rlvr.telemetry import Stopwatch
from rlvr.types import Sampled, SamplingParams, StepBatch

if TYPE_CHECKING:
    from rlvr.protocols import Engine, Reward
    from rlvr.types import Example, Rollouts

torch = lazy_import("torch")


@dataclass(frozen=True)
class Completions:
    """This process's share of a step's completions as sampled (`Sampled.rows` of `SingleTurn`), not yet scored."""

    rollouts: Rollouts
    completions: list[str]
    """Each row's decoded text."""
    references: list[str]
    """Each row's example's reference, for the reward."""
    prompts: int
    """The step's prompts P, over every process (the rows' groups are this process's share of them)."""
    group_size: int


class SingleTurn:
    def __init__(self, engine: Engine, tokenizer: Any, reward: Reward, guard: RewardGuard, seeds: Seeds, world: World,
                 with_entropy: bool = False,
                 interruptible: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.engine, self.tokenizer, self.reward, self.seeds, self.world = engine, tokenizer, reward, seeds, world
        self.answers = reward if isinstance(reward, AnswerReward) else None
        """The reward, where it reads each completion's answer (a sampled evaluation's maj@k); None otherwise."""
        self.guard = guard
        """The range the rewards must keep (`trainer.reward_max_abs`) and the reward's name (rlvr/reward/guarded.py)."""
        self.with_entropy = with_entropy
        self.interruptible = interruptible

    def sample(self, examples: list[Example], step: int, position: int, group_size: int,
               sampling: SamplingParams) -> Sampled[Completions]:
        """This process's share of the step's rollouts of `examples` (the data stream's from `position` on), G
        completions each, decoded; not yet scored."""
        seeds = group_sampling_seeds(self.seeds.sampler, step, position, len(examples))
        return self._sample(examples, group_size, sampling, seeds, self.with_entropy)

    def finish(self, sampled: Sampled[Completions]) -> StepBatch:
        """Score this process's share (interruptible by a stop signal), then gather the step."""
        clock = Stopwatch()
        share = sampled.rows
        try:
            with self.interruptible():
                scores = guarded_score(self.reward, share.completions, share.references, self.guard)
        except StepInterrupted:
            scores = None  # the gather raises it again on every rank: all of them drop this step, none waits
        rollouts, completions, scores = gather_step(self.world, share.rollouts, share.completions, scores,
                                                    self.tokenizer.pad_token_id)
        fractions = scores.fractions("reward/")
        rewards_P_G = torch.tensor(scores.values, dtype=torch.float32).view(share.prompts, share.group_size)
        return StepBatch(
            rollouts=rollouts, rewards_P_G=rewards_P_G,
            completions=completions, scores=scores, metrics=fractions, failures=fractions, what="completions",
            check="the verifier, its timeouts and the answer format", sample_seconds=sampled.seconds,
            score_seconds=clock.lap(),
        )

    def evaluate(self, examples: list[Example], max_tokens: int, samples: int = 1,
                 temperature: float = 0.0, first: int = 0) -> StepBatch:
        """One greedy (T=0) completion of each held-out example, scored; or `samples` of each at `temperature`
        (top_p 1), each group from its own seed (rlvr/seeds.py: eval_sampling_seeds; `examples` are the held-out
        set's from place `first` on), with `eval/maj@k` when the reward reads answers (rlvr/rollout/sampled_eval.py)."""
        if temperature == 0:
            greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens)
            batch = self.finish(self._sample(examples, samples, greedy, [0] * len(examples), False))
            return replace(batch, metrics={})  # an evaluation row has its own eval/reward_*_frac (rlvr/telemetry.py)
        sampling = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens)
        seeds = eval_sampling_seeds(self.seeds.sampler, first + len(examples))[first:]
        batch = self.finish(self._sample(examples, samples, sampling, seeds, False))
        if self.answers is None or samples < 2:
            return replace(batch, metrics={})
        return replace(batch, metrics=majority_metric([self.answers.answer(c) for c in batch.completions],
                                                      batch.scores.values, samples))

    def _sample(self, examples: list[Example], G: int, sampling: SamplingParams, seeds: list[int],
                with_entropy: bool) -> Sampled[Completions]:
        clock = Stopwatch()
        mine = self.world.share(len(examples))  # this process's groups (all of them in a world of one)
        rollouts = self.engine.sample(encode_prompts(self.tokenizer, [examples[i].prompt for i in mine]), G, sampling,
                                      seeds=[seeds[i] for i in mine], with_entropy=with_entropy)
        completions = decode_completions(self.tokenizer, rollouts)
        references = [examples[i].reference for i in mine for _ in range(G)]
        return Sampled(Completions(rollouts, completions, references, len(examples), G), clock.lap())
