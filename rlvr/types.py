"""The data that flows through one step, as frozen dataclasses.

Axis suffixes: `_P` prompts, `_G` samples per prompt, `_T` completion tokens, `_PG` the prompt-major
flattening of P×G (row `p*G + g` is sample g of prompt p). Token tensors are right-padded to T; a mask
says which positions are real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # torch and peft stay out of the composing/submitting process
    from collections.abc import Callable, Sequence

    from peft import LoraConfig
    from torch import Tensor


@dataclass(frozen=True)
class Example:
    """One verifiable problem."""

    prompt: str
    """What the policy is asked (raw text; chat templating happens at encoding time)."""
    reference: str
    """What the verifier compares the completion against."""


@dataclass(frozen=True)
class Demonstration:
    """One supervised (prompt, completion) pair for the SFT warm-up phase."""

    prompt: str
    completion: str
    """The target text; the tokenizer's EOS is appended when it is encoded."""
    followups: tuple[str, ...] = ()
    """A multi-turn demonstration goes on after `completion` (the first action) with observation, action,
    observation, action, …: observations are encoded as the episode loop encodes them (rlvr/rollout/episodes.py) and
    not supervised; each action is, with EOS appended, as the first."""


@dataclass(frozen=True)
class Scores:
    """A verifier's verdict on a batch: one reward per completion, and how many of them it could not really
    judge. A completion whose grading timed out or raised, or with no answer to parse, scores 0.0 and is
    counted here, so a verifier failing silently shows up in `reward/*_frac` instead of as a flat zero."""

    values: list[float]
    timeouts: int = 0
    """Grading ran past its time bound (and was stopped)."""
    errors: int = 0
    """Grading raised, or returned something that is not a finite number."""
    parse_failures: int = 0
    """No answer could be read from the completion (no `\\boxed{}`, an answer the parser rejects, a judge
    verdict that is neither yes nor no)."""

    def fractions(self, prefix: str) -> dict[str, float]:
        """`{prefix}timeout_frac`, `{prefix}error_frac`, `{prefix}parse_fail_frac` (0.0 for an empty batch)."""
        n = max(1, len(self.values))
        return {
            f"{prefix}timeout_frac": self.timeouts / n,
            f"{prefix}error_frac": self.errors / n,
            f"{prefix}parse_fail_frac": self.parse_failures / n,
        }


@dataclass
class EnvFailures:
    """Episodes started through one guarded environment (rlvr/env/guarded.py) and how many of them the guard ended,
    since the last `take`: what a step's `env/error_frac` and `env/timeout_frac` count, gathered over the run's
    processes (rlvr/distributed.py). Updated on the event loop's thread only."""

    episodes: int = 0
    errors: int = 0
    timeouts: int = 0

    def take(self) -> EnvFailures:
        """The counts so far, and start again from zero (one training step's worth)."""
        taken = EnvFailures(self.episodes, self.errors, self.timeouts)
        self.episodes = self.errors = self.timeouts = 0
        return taken

    def fractions(self, prefix: str = "env/") -> dict[str, float]:
        """`{prefix}error_frac`, `{prefix}timeout_frac` of the episodes (0.0 when there were none)."""
        n = max(1, self.episodes)
        return {f"{prefix}error_frac": self.errors / n, f"{prefix}timeout_frac": self.timeouts / n}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    """Logits are divided by max(temperature, 1e-7) before the softmax. 0 means greedy."""
    top_p: float
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    max_tokens: int
    """Completion length cap; a completion that reaches it without EOS is 'truncated'."""


@dataclass(frozen=True)
class Segment:
    """Partial rollouts (rlvr/rollout/partial.py): rows continued under the engine's current weights from where an
    earlier version left them, until `need` of their groups are complete and every row has sampled its quota (or
    ended). Plain lists: it crosses to engine=pytorch's sampler process."""

    contexts: list[list[int]]
    """Per row: its prompt's ids and the tokens it has so far (the engine prefills them: their keys and values are
    recomputed under the new weights)."""
    budgets: list[int]
    """Per row: the tokens it may still sample (max_tokens less those it has)."""
    offsets: list[int]
    """Per row: the tokens it has: the index of its next token, which its noise is drawn for."""
    seeds: list[int]
    """Per row: its own sampling seed; token t's draw is seeded by (seed, t) alone (`rlvr.engine.pytorch.RowNoise`),
    so a row's tokens are the same however its sampling is cut into segments."""
    groups: list[int]
    """Per row: its group (0, 1, …), for `need`."""
    quotas: list[int]
    """Per row: the fewest tokens it must sample in this segment unless it ends first; its whole budget where its
    group must be complete when the segment ends (its tokens would otherwise outgrow the staleness bound)."""
    need: int
    """Groups that must be complete, among those of the segment, before it may end."""
    params: SamplingParams
    with_entropy: bool = False

    @property
    def settled(self) -> bool:
        """Nothing to decode: no rows, or enough groups complete already and no quota."""
        return not self.contexts or (self.need <= 0 and not any(self.quotas))

    def may_end(self, ended: Sequence[bool], sampled: Sequence[int]) -> bool:
        """The segment may end once each row has `ended` and has `sampled` tokens in it as given: every row has
        ended or sampled its quota, and at least `need` groups have every row ended."""
        if not all(done or n >= quota for done, n, quota in zip(ended, sampled, self.quotas, strict=True)):
            return False
        running = [0] * (max(self.groups, default=-1) + 1)
        for group, done in zip(self.groups, ended, strict=True):
            running[group] += not done
        return sum(count == 0 for count in running) >= self.need


@dataclass(frozen=True)
class Continued:
    """What a `Segment` sampled, per row (in the segment's order)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    entropies: list[list[float]] | None
    ended: list[bool]
    """Whether the row ended: EOS, or its budget spent."""
    eos: list[bool]
    """Whether it ended with EOS."""

    @staticmethod
    def nothing(segment: Segment) -> Continued:
        """A settled segment's: no row sampled a token."""
        n = len(segment.contexts)
        return Continued([[]] * n, [[]] * n, [[]] * n if segment.with_entropy else None, [False] * n, [False] * n)


@dataclass(frozen=True)
class Rollouts:
    """G completions for each of P prompts, as sampled by an engine.

    `logprobs_PG_T` are log-probabilities of the sampled tokens under the temperature-scaled
    distribution *before* top-p truncation. The backend computes its training log-probabilities the
    same way, so an on-policy importance ratio is exactly 1 (up to float noise). The predecessor
    compared a T=0.7/top-p sampler against a T=1 trainer, so its ratio was not 1 even on-policy; we do not.
    """

    prompt_ids_P: list[list[int]]
    group_size: int
    tokens_PG_T: Tensor
    """int64 completion token ids; positions past the end hold the pad id."""
    logprobs_PG_T: Tensor
    """float32 sampled-token log-probabilities; 0 on padding."""
    mask_PG_T: Tensor
    """bool, True on real completion tokens (the EOS that ended a completion included)."""
    finished_PG: Tensor
    """bool, True where the completion ended with EOS (False: it hit max_tokens)."""
    temperature: float
    """The temperature the tokens were sampled at (the backend scales its logits by it)."""
    entropy_PG_T: Tensor | None = None
    """float32 Shannon entropy (nats) of the temperature-scaled distribution at each position, when
    asked for; 0 on padding."""
    actions_PG_T: Tensor | None = None
    """Multi-turn rows (prompt, action 1, observation 1, action 2, …): bool, True on the tokens the policy
    sampled. Observation tokens are real (in `mask_PG_T`, attended to) but no action: advantage 0, never in
    the loss, invisible to the token transforms. None: every real token is an action (single turn)."""
    turn_PG_T: Tensor | None = None
    """Multi-turn rows: int64 turn index (0, 1, …) of each action token, −1 elsewhere; None for single turns."""
    observation_body_PG_T: Tensor | None = None
    """Multi-turn rows: bool, True on an observation's own text tokens (its body), False on the chat template's tokens
    around it, on actions and on padding (rlvr/rollout/observation_body.py): what ECHO may target. None for single
    turns."""

    segments_PG: list[list[tuple[int, list[int]]]] | None = None
    """Multi-turn rows that a chat template split (rlvr/chat/rewrites.py): per row, for each sequence after
    its first, (the completion position it starts at, the prompt ids its first action was sampled from: the template's
    re-render of the conversation so far). The row's tokens from there on followed that prompt, not the row's earlier
    tokens, so the backends train each sequence on its own (`segments`). None: each row is one sequence after its
    group's prompt."""

    def segments(self, r: int) -> list[tuple[int, int, list[int]]]:
        """Row r's sequences as (start, end, prompt ids): its completion tokens start..end-1 follow that prompt."""
        starts = [(0, self.prompt_ids_P[r // self.group_size]), *(self.segments_PG[r] if self.segments_PG else [])]
        ends = [a for a, _ in starts[1:]] + [int(self.mask_PG_T[r].sum())]
        return [(a, b, prompt) for (a, prompt), b in zip(starts, ends, strict=True)]

    @property
    def lengths_PG(self) -> Tensor:
        """Real tokens per row (actions and observations)."""
        return self.mask_PG_T.sum(-1)

    @property
    def action_mask_PG_T(self) -> Tensor:
        """bool, the tokens the policy sampled: what trains and what token statistics read."""
        return self.mask_PG_T if self.actions_PG_T is None else self.actions_PG_T

    def groups(self, keep_P: list[int]) -> Rollouts:
        """The rows of the groups `keep_P` (prompt indices, in that order), at the same width T."""
        from dataclasses import replace

        import torch

        G = self.group_size
        rows = torch.tensor([p * G + g for p in keep_P for g in range(G)], dtype=torch.long)

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[rows]

        return replace(self, prompt_ids_P=[self.prompt_ids_P[p] for p in keep_P], tokens_PG_T=self.tokens_PG_T[rows],
                       logprobs_PG_T=self.logprobs_PG_T[rows], mask_PG_T=self.mask_PG_T[rows],
                       finished_PG=self.finished_PG[rows], entropy_PG_T=take(self.entropy_PG_T),
                       actions_PG_T=take(self.actions_PG_T), turn_PG_T=take(self.turn_PG_T),
                       observation_body_PG_T=take(self.observation_body_PG_T),
                       segments_PG=None if self.segments_PG is None else [self.segments_PG[r] for r in rows.tolist()])


def cat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """`parts`' groups one after the other (same group size and temperature), padded to the longest row with
    `pad_id` (log-probabilities and entropies 0, masks False, turn index −1): a step gathered from its processes'
    shares, or from its sampling rounds (rlvr/rollout/dynamic_sampling.py)."""
    from dataclasses import replace

    import torch

    width = max(p.tokens_PG_T.shape[1] for p in parts)

    def cat(ts: list[Tensor], fill: float | int | bool) -> Tensor:
        return torch.cat([torch.cat([t, t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), fill)], dim=1)
                          for t in ts])

    def optional(key: str, fill: float | int | bool) -> Tensor | None:
        ts = [getattr(p, key) for p in parts]
        return None if ts[0] is None else cat(ts, fill)

    return replace(
        parts[0], prompt_ids_P=[ids for p in parts for ids in p.prompt_ids_P],
        tokens_PG_T=cat([p.tokens_PG_T for p in parts], pad_id),
        logprobs_PG_T=cat([p.logprobs_PG_T for p in parts], 0.0),
        mask_PG_T=cat([p.mask_PG_T for p in parts], False), finished_PG=torch.cat([p.finished_PG for p in parts]),
        entropy_PG_T=optional("entropy_PG_T", 0.0), actions_PG_T=optional("actions_PG_T", False),
        turn_PG_T=optional("turn_PG_T", -1), observation_body_PG_T=optional("observation_body_PG_T", False),
        segments_PG=None if all(p.segments_PG is None for p in parts)
        else [s for p in parts for s in (p.segments_PG or [[] for _ in range(len(p.tokens_PG_T))])],
    )


@dataclass(frozen=True)
class TokenSignals:
    """What a token-level transform may look at, besides the episode advantages."""

    logprobs_PG_T: Tensor
    """Sampled-token log-probabilities (surprisal = −logprob)."""
    mask_PG_T: Tensor
    """bool completion mask; transforms must leave advantages at padding exactly 0."""
    group_size: int
    step: int
    """The RL step index (schedules such as SEPA's λ read it)."""
    correct_rate: float
    """Fraction of this step's completions with reward > 0.5 (SEPA's gate observes it)."""
    entropy_PG_T: Tensor | None = None
    """Full-distribution entropy from the engine, present when the transform asked for it."""
    planning_PG_T: Tensor | None = None
    """bool planning-token mask, present when the transform asked for it."""
    distill_PG_T: Tensor | None = None
    """distill=…: the teacher's credit coef·(log π_teacher − log π_student) on each action token (rlvr/distill/), added
    to the token advantages after the transform; None without a teacher."""
    self_teacher_PG_T: Tensor | None = None
    """transform=self_distill: log π of each action token under the policy itself shown privileged context
    (rlvr/distill/self_teacher.py), equal to the sampled log-probability where a row has no context; None otherwise."""
    distill_support: TeacherSupport | None = None
    """distill.estimator=full: the teacher's distribution over its top-k at each action token, for the loss (not the
    advantages); None otherwise."""


@dataclass(frozen=True)
class TeacherScores:
    """A distillation teacher's answer for N rows of width T (the completions' width): rlvr/distill/teacher.py."""

    logprobs_N_T: Tensor
    """float32: log π_teacher of each completion token; 0 past the row's length."""
    topk_ids_N_T_K: Tensor | None = None
    """int64: the teacher's k most likely token ids at each completion position (asked for top-k); 0 past the length."""
    topk_logprobs_N_T_K: Tensor | None = None
    """float32: their log-probabilities, in the same order; 0 past the length."""


@dataclass(frozen=True)
class TeacherSupport:
    """distill.estimator=full (rlvr/distill/distill.py, docs/algorithms.md#on-policy-distillation): at each action
    token the teacher's k most likely next tokens (every token of the vocabulary with distill.topk=0) and their
    log-probabilities; the loss adds each token's weight × the divergence `beta` chooses between the student's and the
    teacher's distributions over them (the reverse KL by default)."""

    ids_PG_T_K: Tensor
    """long: the support's token ids (the teacher's, which are the student's: a token map is refused)."""
    logprobs_PG_T_K: Tensor
    """float32: the teacher's log-probabilities of those tokens (over its whole vocabulary)."""
    weight_PG_T: Tensor
    """float32: each token's weight in the term, a token mean: coef / (the step's action tokens) on each action token
    (distill=…), or w / (the action tokens of rows with context) on those (transform=sdpo|sdft); 0 elsewhere."""
    beta: float = 1.0
    """distill.beta: which divergence the loss takes over the support (1: the reverse KL)."""
    tail: bool = False
    """distill.tail: the mass outside the support as one more outcome (False: renormalised over it)."""


@dataclass(frozen=True)
class TrainBatch:
    """What the backend trains on: the rollouts and one advantage per completion token."""

    rollouts: Rollouts
    adv_PG_T: Tensor
    """float32; tokens whose advantage is exactly 0 are left out of the loss and its token count."""
    echo_PG_T: Tensor | None = None
    """float32 ECHO weight of each observation token it targets, the step's normalisation included (rlvr/echo/echo.py:
    the loss adds −Σ w·log π over them); 0 elsewhere. None: echo=none."""
    distill: TeacherSupport | None = None
    """estimator=full (distill=…, transform=sdpo|sdft): the teacher's top-k at each action token, whose divergence the
    loss adds."""


@dataclass(frozen=True)
class Branching:
    """What the rollout probes for branching turn credit (turn_credit=tl_grpo, rlvr/rollout/branch_probes.py)."""

    mode: str
    """`action_space` (alternatives from the episode's legal actions) or `llm` (policy samples)."""
    size: int
    """Values per turn, the primary's included: B − 1 alternatives."""
    lookahead: int
    """The primary's next actions replayed after each alternative (0: the turn's own reward)."""


@dataclass(frozen=True)
class Step:
    """What an environment answers to one action (rlvr/protocols.py: Episode.step)."""

    observation: str | None
    """The text the policy sees next (appended to its context as tokens); None when the episode is over."""
    reward: float
    """This turn's reward; an episode's reward is the sum over its turns."""
    done: bool
    info: dict = field(default_factory=dict)
    """Anything the environment reports (an `advantage` for turn_credit=env, an `error`, …); JSON-serialisable."""


@dataclass(frozen=True)
class Tool:
    """A function the policy may call in an episode (`env.tools`, rlvr/tools/schema.py builds them; an environment may
    offer its own, rlvr/env/verifiers_tools.py), with the schema the prompt shows."""

    name: str
    fn: Callable[..., object]
    """Called with the call's arguments as keywords (bound settings already applied)."""
    schema: dict
    """The OpenAI/transformers function schema `{"type": "function", "function": {...}}`."""

    @property
    def parameters(self) -> dict:
        return self.schema["function"]["parameters"]


@dataclass(frozen=True)
class TurnSignals:  # the checks and the spreading turn credit runs on them: rlvr/turn_credit/signals.py
    """One step's multi-turn rows, as turn credit reads them. All tensors on one device."""

    actions_PG_T: Tensor
    """bool [P·G, T]: the tokens the policy sampled (`Rollouts.action_mask_PG_T`)."""
    turn_PG_T: Tensor
    """int64 [P·G, T]: the turn index of each action token; not read elsewhere (−1 there by convention)."""
    turns_PG: Tensor
    """int64 [P·G]: actions each episode took (its turns are 0 … turns − 1)."""
    group_size: int
    turn_rewards_PG_K: Tensor | None = None
    """float [P·G, K]: each turn's `Step.reward`, read at k < turns_PG (must be finite there). reward_to_go."""
    env_adv_PG_K: Tensor | None = None
    """float [P·G, K]: each turn's `Step.info["advantage"]`, NaN where the environment gave none
    (rlvr.turn_credit.env.env_advantages builds it from the steps' infos). env."""
    branch_rewards_PG_K_B: Tensor | None = None
    """float [P·G, K, B]: TL-GRPO probes of turn k, [..., 0] the primary action's value and [..., 1:] the
    alternatives', NaN where nothing was probed (docs/algorithms.md#tl_grpo says what a value must be). tl_grpo."""


@dataclass(frozen=True)
class Played:
    """A batch of episodes (rlvr/rollout/episodes.py: play): P prompts × G episodes, rows p·G + g."""

    rollouts: Rollouts
    rewards_P_G: Tensor
    """Each episode's reward: the sum of its turns' rewards."""
    turn_rewards_PG_K: Tensor
    """float32 [P·G, K] reward of each turn, NaN for turns not played (K = the most turns any episode took)."""
    turns_PG: Tensor
    """int64 actions each episode took."""
    truncated_PG: Tensor
    """bool: ended by max_turns or max_context_tokens, not by the environment."""
    failed_PG: Tensor
    """bool: the environment failed (raised, hung, malformed answer); the episode scored 0."""
    transcripts: list[list[dict]]
    """Per row: [{"role": "env" | "policy", "text": …}, …] in order, the prompt first."""
    infos: list[list[dict]]
    """Per row: each turn's `Step.info`."""
    env_seconds: float
    """Wall seconds spent in the environments (reset and steps), branch probes excluded."""
    branch_rewards_PG_K_B: Tensor | None = None
    """float32 [P·G, K, B]: the branch probes' values (rlvr/rollout/branch_probes.py), when `play` was given a
    `branching`; NaN where nothing was probed."""
    probe_seconds: float = 0.0
    """Wall seconds the branch probes took (sampling alternatives and stepping forks)."""
    rewritten_turns: list[list[int]] | None = None
    """Per row: the turns k after whose observation the chat template's render of the conversation no longer
    extends the row (rlvr/chat/rewrites.py; where prime-rl would start a new sample, at action k+1);
    None without a chat template (nothing to rewrite)."""


Rows = TypeVar("Rows")


@dataclass(frozen=True)
class Sampled(Generic[Rows]):
    """A step as this process sampled it, not yet scored nor gathered: `Rollout.sample`'s result, which
    `Rollout.finish` turns into the StepBatch. An overlapped run (trainer.off_policy_steps ≥ 1) holds steps in this
    form between sampling and training, and checkpoints them (rlvr/overlap.py)."""

    rows: Rows
    """The rollout's own: `Completions` (rlvr/rollout/single_turn.py) or `PlayedShare` (rlvr/rollout/episodes.py)."""
    seconds: float
    """Wall time of the sampling (an episode's: the environment's turns included)."""


@dataclass(frozen=True)
class StepBatch:
    """A collected step (rlvr/protocols.py: Rollout.finish), the one shape every stage after the rollout reads:
    P prompts × G rows (row p·G + g), sampled, scored and gathered over the run's processes."""

    rollouts: Rollouts
    rewards_P_G: Tensor
    """float32 [P, G]: each row's reward (an episode's: the sum of its turns')."""
    completions: list[str]
    """Per row, the text after the prompt (an episode: its transcript after the first observation)."""
    scores: Scores
    """The rewards with the counts of those that could not really be judged (an episode: its environment
    failed or hung)."""
    metrics: dict[str, float]
    """The rollout's own fields of the metrics row: `reward/*_frac` (single turn) or `env/*` (episodes)."""
    failures: dict[str, float]
    """The fractions a step warns about when above trainer.reward_warn_frac, and what they concern."""
    what: str
    """`completions` or `episodes`: what a failure cost, for the warning."""
    check: str
    """Where to look when failures are high, for the warning."""
    sample_seconds: float
    score_seconds: float
    """Scoring time (an episode's: the environment's)."""
    credit_seconds: float = 0.0
    """Work done for the credit while collecting (branch probes)."""
    turns: Played | None = field(default=None, repr=False)
    """Multi-turn rows: the episodes as played, whose turns the credit reads (rlvr/credit.py derives their
    `TurnSignals`) and whose transcripts samples/ shows; None for single-turn completions."""


@dataclass(frozen=True)
class LoraSpec:
    """LoRA settings of a model preset (`model.lora`; null in YAML means full fine-tuning)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: list[str] = field(default_factory=list)
    """Module-name suffixes (q_proj, …, down_proj); PEFT matches them against the model."""

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"model.lora.rank={self.rank} must be > 0 (use model.lora=null for full fine-tuning)")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name the projections LoRA adapts")

    def to_peft(self) -> LoraConfig:
        import peft

        return peft.LoraConfig(
            task_type="CAUSAL_LM", r=self.rank, lora_dropout=self.dropout,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; a float scales alike
            target_modules=list(self.target_modules),
        )
