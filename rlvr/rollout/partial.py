"""Partial rollouts (`trainer.partial_rollouts=true`, with `trainer.off_policy_steps=k`): a weight update does not wait
for the longest completions. Sequences unfinished at an update go on under the new weights, each token tagged with
the version that sampled it; a step trains the groups that finished first, oldest first.

The pool. k batches of groups are in flight: job 0 admits the data stream's batches 0 … k − 1, job s ≥ 1 batch
s + k − 1 (none past the run's last step). Job s decodes every unfinished row of the pool under the engine's weights
(version s − 1, sampled while step s − 1 trains: rlvr/overlap.py with one step ahead; version 0 for job 0) — the
engine prefills each row's prompt and tokens so far, so their keys and values are the new weights' — until
`batch_size` groups are complete (every row ended: EOS or max_tokens) and every row has sampled its quota or
ended; then step s trains the `batch_size` complete groups admitted first. A row's quota (`PartialRollouts.quota`)
shares max_tokens evenly over the jobs from its admission to the one it is due at, where it is the rest of its
budget: every group due at s is complete, and a long completion is decoded over its jobs alike. Batch i is due at
job i: a group is at most k updates old when it trains (its first tokens were sampled by version ≥ i − k), whatever
the timing — the staleness bound counts a sequence's oldest token. With k = 1 every group is due at once: the same
steps as without partial rollouts (from another noise stream: below).

Exact. What a job decodes depends only on the pool, which depends only on the seed and the steps before: a run
repeats bit for bit (trainer.off_policy_mode=fixed; bounded is refused). A row's token t is drawn from noise seeded by
(the row's seed, t) alone (`rlvr.engine.pytorch.RowNoise`), so where its sampling was cut does not change its draws.
The pool after a job is part of the job (`Job.partial`), and a checkpoint keeps the jobs sampled and not trained
(rlvr/checkpoint.py): a run continued from it — after a SIGKILL too — writes the rows of one never stopped.

Row fields (`Partial.fields`): `async/staleness_mean` and `_max` over the trained tokens (step − the token's version),
`async/policy_version` (the oldest trained token's), `async/staleness_frac/<d>` (the trained tokens d updates old),
`async/partial_frac` (trained rows sampled by more than one version) and `async/version_spread_max` (the most
versions one trained row spans, less one).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlvr.distributed import World
from rlvr.lazy import lazy_import
from rlvr.model.prompt_encoding import decode_completions, encode_prompts
from rlvr.rollout.single_turn import Completions
from rlvr.seeds import Seeds, group_sampling_seeds, sub_seed
from rlvr.telemetry import Stopwatch
from rlvr.types import Continued, Example, Rollouts, Sampled, SamplingParams, Segment

if TYPE_CHECKING:
    from rlvr.overlap import Job

torch = lazy_import("torch")


@dataclass(eq=False)
class Group:
    """A prompt's group in flight: its rows as sampled so far, token by token with the version that sampled each."""

    batch: int
    """The data stream's batch it was drawn for; it is due at job `batch`."""
    example: Example
    prompt: list[int]
    seeds: list[int]
    """Per row: its sampling seed (the group's seed's sub-seed `row/<r>`)."""
    tokens: list[list[int]]
    logprobs: list[list[float]]
    entropies: list[list[float]]
    versions: list[list[int]]
    ended: list[bool]
    eos: list[bool]

    @property
    def complete(self) -> bool:
        return all(self.ended)


@dataclass
class Partial:
    """What a job of partial rollouts trains, reports and leaves in flight (this process's share of it)."""

    examples: list[Example]
    """The trained groups' examples, in the step's order."""
    versions: list[list[int]]
    """Each trained row's tokens' versions (its row fields: `gathered`)."""
    k: int
    pool: list[Group] = field(default_factory=list)
    """The groups in flight after the job (a checkpoint's state). The pool itself, not a copy: a checkpoint pickles
    the pending jobs while the sampler is idle, when the last job sampled is the last to have changed it."""
    admitted: int = 0
    """The batches admitted so far (0 … admitted − 1)."""

    def gathered(self, world: World, step: int) -> tuple[list[Example], dict[str, float]]:
        """The step's trained examples over every process, in the order their rows are gathered (rank after rank),
        and its row fields over all their tokens: a collective on several processes, so from the main thread."""
        if "versions" not in vars(self):  # a checkpoint written before the fields were gathered (one process): its own
            return self.examples, vars(self)["fields"]
        shares = world.gather((self.examples, self.versions))
        versions = [row for _, rows in shares for row in rows]
        return [e for examples, _ in shares for e in examples], fields_of(versions, step, self.k)


@dataclass(frozen=True)
class Admission:
    """The batches a job admits: (batch index, its examples, their data-stream position) each."""

    batches: list[tuple[int, list[Example], int]]
    upto: int
    """Every batch before this one is admitted once the job is."""


class ContinuesRows(Protocol):
    """An engine that declares the `partial_rollouts` capability (engine=pytorch)."""

    def continue_rows(self, segment: Segment) -> Continued: ...


class SingleTurnParts(Protocol):
    """What the pool uses of the run's single-turn rollout (rlvr/rollout/single_turn.py `SingleTurn`)."""

    engine: Any
    tokenizer: Any
    seeds: Seeds
    world: World
    with_entropy: bool


class PartialRollouts:
    """The pool of a run's partial rollouts over its single-turn rollout's engine, tokenizer and seeds: this
    process's share of it. Over several processes (backend=fsdp) each admits its share of every batch (the groups
    `World.share` gives it, each from its own seed) and trains its share of `batch_size`: the first of its own
    groups to complete, so which groups a step trains depends on the number of processes (a run continues on as
    many: its checkpoint holds each one's pool)."""

    def __init__(self, rollout: SingleTurnParts, batch_size: int, group_size: int, sampling: SamplingParams, k: int,
                 resumed: Partial | None = None, first: int = 0) -> None:
        """`resumed`: what the checkpoint continued from at step `first` left in flight; None: nothing (a fresh run,
        or one whose checkpoint was its last step's: every batch it admitted, 0 … first − 1, was trained)."""
        self.rollout, self.P, self.G, self.sampling, self.k = rollout, batch_size, group_size, sampling, k
        self.B = len(rollout.world.share(batch_size))
        """This process's share of the groups a step trains."""
        self.pool = copy.deepcopy(resumed.pool) if resumed else []
        self.admitted = resumed.admitted if resumed else first
        """The batches admitted by the jobs submitted so far (main thread)."""

    @staticmethod
    def resumed(jobs: list[Job]) -> Partial | None:
        """What a checkpoint's pending jobs left (the last one's), or None: a fresh pool."""
        done = [job for job in jobs if job.partial is not None]
        return max(done, key=lambda job: job.step).partial if done else None

    def admissions(self, step: int, max_steps: int, batch: Callable[[int], tuple[list[Example], int]]) -> Admission:
        """Job `step`'s batches (module docstring), each from `batch(i)`: (examples, position). Those not admitted
        yet up to batch step + k − 1, so a run continued with more steps (trainer.max_steps) admits what its shorter
        self did not."""
        first, self.admitted = self.admitted, max(self.admitted, min(step + self.k, max_steps))
        return Admission([(i, *batch(i)) for i in range(first, self.admitted)], self.admitted)

    def sample(self, job: Job) -> Sampled[Completions]:
        """Job `job.step`: admit, decode under the engine's weights (version `job.version`), train the first
        complete; sets `job.partial`."""
        clock = Stopwatch()
        for index, examples, position in job.work.batches:
            self.pool += self._admit(index, examples, position)
        running = [g for g in self.pool if not g.complete]
        index = {id(g): i for i, g in enumerate(running)}
        rows = [(g, r) for g in running for r in range(self.G) if not g.ended[r]]
        segment = Segment(
            contexts=[g.prompt + g.tokens[r] for g, r in rows],
            budgets=[self.sampling.max_tokens - len(g.tokens[r]) for g, r in rows],
            offsets=[len(g.tokens[r]) for g, r in rows], seeds=[g.seeds[r] for g, r in rows],
            groups=[index[id(g)] for g, _ in rows], quotas=[self.quota(g, r, job.step) for g, r in rows],
            need=self.B - sum(g.complete for g in self.pool), params=self.sampling,
            with_entropy=self.rollout.with_entropy)
        continued = cast(ContinuesRows, self.rollout.engine).continue_rows(segment)
        for n, (g, r) in enumerate(rows):
            g.tokens[r] += continued.tokens[n]
            g.logprobs[r] += continued.logprobs[n]
            g.entropies[r] += continued.entropies[n] if continued.entropies is not None else []
            g.versions[r] += [job.version] * len(continued.tokens[n])
            g.ended[r], g.eos[r] = continued.ended[n], continued.eos[n]
        trained = sorted((g for g in self.pool if g.complete), key=lambda g: g.batch)[: self.B]
        late = [g.batch for g in self.pool if g.batch <= job.step and g not in trained]
        if late:  # cannot happen: a due group ends the segment only once complete, and the oldest train first
            raise RuntimeError(f"partial rollouts: groups of batches {late} would outgrow the staleness bound at step "
                               f"{job.step}")
        self.pool = [g for g in self.pool if g not in trained]
        job.partial = Partial([g.example for g in trained], [g.versions[r] for g in trained for r in range(self.G)],
                              self.k, self.pool, job.work.upto)
        return self._sampled(trained, clock.lap())

    def quota(self, group: Group, row: int, step: int) -> int:
        """The tokens `row` of `group` must sample in job `step` unless it ends: max_tokens shared evenly over the jobs
        from the one that admitted its batch i (job max(0, i − k + 1)) to the one it is due at (job i, where the
        quota is the rest of its budget: the group must be complete). A long completion is then decoded over those
        jobs alike, not mostly in the job it is due at, whose length would otherwise swing with the tail."""
        first = max(0, group.batch - self.k + 1)
        jobs = group.batch - first + 1
        upto = -(-self.sampling.max_tokens * min(step - first + 1, jobs) // jobs)
        return max(0, upto - len(group.tokens[row]))

    def _admit(self, index: int, examples: list[Example], position: int) -> list[Group]:
        seeds = group_sampling_seeds(self.rollout.seeds.sampler, index, position, len(examples))
        mine = self.rollout.world.share(len(examples))
        examples, seeds = [examples[i] for i in mine], [seeds[i] for i in mine]
        prompts = encode_prompts(self.rollout.tokenizer, [e.prompt for e in examples])

        def rows() -> list:
            return [[] for _ in range(self.G)]

        return [Group(index, e, p, [sub_seed(seed, f"row/{r}") for r in range(self.G)], rows(), rows(), rows(), rows(),
                      [False] * self.G, [False] * self.G) for e, p, seed in zip(examples, prompts, seeds, strict=True)]

    def _sampled(self, trained: list[Group], seconds: float) -> Sampled[Completions]:
        rows = [(g, r) for g in trained for r in range(self.G)]
        T = max(len(g.tokens[r]) for g, r in rows)
        pad = self.rollout.tokenizer.pad_token_id

        def padded(values: Callable[[Group, int], list], fill: Any, dtype) -> Any:
            return torch.tensor([values(g, r) + [fill] * (T - len(g.tokens[r])) for g, r in rows], dtype=dtype)

        rollouts = Rollouts(
            prompt_ids_P=[g.prompt for g in trained], group_size=self.G,
            tokens_PG_T=padded(lambda g, r: g.tokens[r], pad, torch.long),
            logprobs_PG_T=padded(lambda g, r: g.logprobs[r], 0.0, torch.float32),
            mask_PG_T=padded(lambda g, r: [True] * len(g.tokens[r]), False, torch.bool),
            finished_PG=torch.tensor([g.eos[r] for g, r in rows], dtype=torch.bool),
            temperature=self.sampling.temperature,
            entropy_PG_T=padded(lambda g, r: g.entropies[r], 0.0, torch.float32) if self.rollout.with_entropy else None)
        completions = decode_completions(self.rollout.tokenizer, rollouts)
        references = [g.example.reference for g in trained for _ in range(self.G)]
        return Sampled(Completions(rollouts, completions, references, self.P, self.G), seconds)


def fields_of(versions: list[list[int]], step: int, k: int) -> dict[str, float]:
    """The row fields of a step's trained rows, each given by its tokens' versions (module docstring)."""
    ages = [step - v for row in versions for v in row]
    count = max(len(ages), 1)
    spreads = [max(row) - min(row) for row in versions if row]
    return {"async/staleness_mean": sum(ages) / count, "async/staleness_max": float(max(ages, default=0)),
            "async/policy_version": float(min((v for row in versions for v in row), default=step)),
            **{f"async/staleness_frac/{d}": sum(a == d for a in ages) / count for d in range(k + 1)},
            "async/partial_frac": sum(s > 0 for s in spreads) / max(len(versions), 1),
            "async/version_spread_max": float(max(spreads, default=0))}
