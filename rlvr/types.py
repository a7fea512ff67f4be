"""The data that flows through one step, as frozen dataclasses.

Axis suffixes: `_P` prompts, `_G` samples per prompt, `_T` completion tokens, `_PG` the prompt-major
flattening of P×G (row `p*G + g` is sample g of prompt p). Token tensors are right-padded to T; a mask
says which positions are real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays out of the composing/submitting process
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


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    """Logits are divided by max(temperature, 1e-7) before the softmax. 0 means greedy."""
    top_p: float
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    max_tokens: int
    """Completion length cap; a completion that reaches it without EOS is 'truncated'."""


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

    @property
    def lengths_PG(self) -> Tensor:
        """Real tokens per row (actions and observations)."""
        return self.mask_PG_T.sum(-1)

    @property
    def action_mask_PG_T(self) -> Tensor:
        """bool, the tokens the policy sampled: what trains and what token statistics read."""
        return self.mask_PG_T if self.actions_PG_T is None else self.actions_PG_T


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


@dataclass(frozen=True)
class TrainBatch:
    """What the backend trains on: the rollouts and one advantage per completion token."""

    rollouts: Rollouts
    adv_PG_T: Tensor
    """float32; tokens whose advantage is exactly 0 are left out of the loss and its token count."""


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
