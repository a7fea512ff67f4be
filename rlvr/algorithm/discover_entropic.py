"""discover_entropic: TTT-Discover's entropic objective (docs/algorithms.md#discover_entropic; "Learning to Discover
at Test Time", arXiv 2601.16175; docs/predecessor.md). Boltzmann weights over each group's rewards:

    p_i = softmax(β·r)_i = exp(max(−700, β·(r_i − max r))) / Σ_j exp(max(−700, β·(r_j − max r)))
    A_i = n·p_i − 1                     (n = G; Σ p = 1, so the group's advantages sum to 0)

The best sample of a group gets the most weight and, as β grows, all of it (A → n − 1 for the best, −1 for the
rest): the objective chases the group's maximum, not its mean. β per group:

    beta: <number>   β = max(0, beta) for every group
    beta: null       the largest β in [0, beta_max] with KL(p ‖ uniform) = Σ p_i·(log p_i + log n) ≤ target_kl:
                     β_max when KL(β_max) ≤ target_kl, else `beta_search_steps` bisection steps from [0, β_max],
                     keeping the lower end (a β whose KL is ≤ target_kl, 0 at worst). KL grows with β, so the
                     target bounds how far the weights move from uniform.

Edge cases: a group of one (n ≤ 1) or one whose rewards span ≤ 1e-12 gets β = 0, KL = 0 and all-zero advantages
(exactly, not n·(1/n) − 1, which rounds to ±1e-16 for some n). Groups whose rewards tie within 1e-6 are zeroed by
rlvr/credit.py before anything reads them, as for every algorithm.

Computed in float64 per group, all groups of the step at once (the bisection runs on a [P] vector of brackets).

Metrics (`advantage_metrics`, read by rlvr/credit.py): discover_beta, discover_kl, discover_reward_max,
discover_reward_mean, each the mean over the step's groups whose rewards do not tie (the groups the predecessor
computed: it skips tied ones upstream and averages extra metrics over the groups that report them); absent when
every group ties.

Deliberate departures from the predecessor: a knob of the wrong type (`beta: "0.5"`, `beta_search_steps: 2.5`)
is a config error naming it, where the predecessor silently fell back to its defaults; target_kl ≤ 0,
beta_max ≤ 0 or beta_search_steps < 1 are errors too (the predecessor clamped them and trained on β = 0; write
`beta: 0` for that). The aliases discover_target_kl / discover_beta_max do not exist: one name per knob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.policy_gradient import PolicyGradient
from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

EXP_FLOOR = -700.0
"""β·(r − max r) is floored here before exp: exp(−700) ≈ 1e−304 is still a normal float64, never 0."""
FLAT_RANGE = 1e-12
"""A group whose rewards span no more than this gets β = 0 (uniform weights, zero advantages)."""


@dataclass(frozen=True)
class DiscoverEntropic(PolicyGradient):
    beta: float | None
    """Fixed β (clamped at 0), or null to solve for it per group from target_kl."""
    target_kl: float = 0.2
    """beta: null: the bound on KL(p ‖ uniform) that the solved β meets (nats)."""
    beta_max: float = 50.0
    """beta: null: the largest β searched, used as is when even it meets target_kl."""
    beta_search_steps: int = 24
    """beta: null: bisection steps on [0, beta_max] (the bracket shrinks to beta_max / 2^steps)."""

    def __post_init__(self) -> None:
        def number(value: object) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        if self.beta is not None and not number(self.beta):
            raise TypeError(f"algorithm.beta={self.beta!r} must be a number or null (solve β for target_kl)")
        for key in ("target_kl", "beta_max"):
            if not number(getattr(self, key)):
                raise TypeError(f"algorithm.{key}={getattr(self, key)!r} must be a number")
            if not getattr(self, key) > 0:
                raise ValueError(f"algorithm.{key}={getattr(self, key)} must be > 0 (for uniform weights, that is "
                                 "all-zero advantages, set algorithm.beta=0)")
        steps = self.beta_search_steps
        if not isinstance(steps, int) or isinstance(steps, bool):
            raise TypeError(f"algorithm.beta_search_steps={steps!r} must be an integer")
        if steps < 1:
            raise ValueError(f"algorithm.beta_search_steps={steps} must be >= 1")

    def advantages(self, rewards_P_G: Tensor) -> Tensor:
        rewards = rewards_P_G.double()
        beta_P, flat_P = self._beta(rewards)
        adv = rewards.shape[1] * boltzmann(rewards, beta_P) - 1.0
        return adv.masked_fill(flat_P[:, None], 0.0).to(rewards_P_G.dtype)

    def advantage_metrics(self, rewards_P_G: Tensor) -> dict[str, float]:
        """β, KL(p ‖ uniform) and the rewards' max and mean, each averaged over the rows given (rlvr/credit.py
        passes the groups whose rewards do not tie); {} for no rows."""
        if rewards_P_G.shape[0] == 0:
            return {}
        rewards = rewards_P_G.double()
        beta_P, flat_P = self._beta(rewards)
        kl_P = kl_to_uniform(boltzmann(rewards, beta_P)).masked_fill(flat_P, 0.0)
        return {
            "discover_beta": float(beta_P.mean()),
            "discover_kl": float(kl_P.mean()),
            "discover_reward_max": float(rewards.max(-1).values.mean()),
            "discover_reward_mean": float(rewards.mean(-1).mean()),
        }

    def normalize(self, adv_PG_T: Tensor, mask_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        return adv_PG_T, {}

    def _beta(self, rewards_P_G: Tensor) -> tuple[Tensor, Tensor]:
        """float64 β [P] and bool [P]: the flat groups (n ≤ 1 or reward range ≤ 1e-12), whose β is 0."""
        P, G = rewards_P_G.shape
        flat_P = (rewards_P_G.max(-1).values - rewards_P_G.min(-1).values <= FLAT_RANGE) | (G <= 1)
        if self.beta is not None:
            beta_P = torch.full((P,), max(0.0, float(self.beta)), dtype=torch.float64)
        else:
            beta_P = self._solve_beta(rewards_P_G)
        return beta_P.masked_fill(flat_P, 0.0), flat_P

    def _solve_beta(self, rewards_P_G: Tensor) -> Tensor:
        """The largest β in [0, beta_max] with KL ≤ target_kl, per group (module docstring)."""
        P = rewards_P_G.shape[0]
        beta_max = torch.full((P,), float(self.beta_max), dtype=torch.float64)
        lo, hi = torch.zeros(P, dtype=torch.float64), beta_max.clone()
        for _ in range(self.beta_search_steps):
            mid = (lo + hi) / 2.0
            within = kl_to_uniform(boltzmann(rewards_P_G, mid)) <= self.target_kl
            lo, hi = torch.where(within, mid, lo), torch.where(within, hi, mid)
        max_within = kl_to_uniform(boltzmann(rewards_P_G, beta_max)) <= self.target_kl
        return torch.where(max_within, beta_max, lo)


def boltzmann(rewards_P_G: Tensor, beta_P: Tensor) -> Tensor:
    """p = softmax(β·r) per group, as exp(max(−700, β·(r − max r))) / Σ (the largest term is exp(0) = 1, so the
    sum is ≥ 1)."""
    shifted = beta_P[:, None] * (rewards_P_G - rewards_P_G.max(-1, keepdim=True).values)
    weights = shifted.clamp_min(EXP_FLOOR).exp()
    return weights / weights.sum(-1, keepdim=True)


def kl_to_uniform(p_P_G: Tensor) -> Tensor:
    """KL(p ‖ uniform) = Σ_i p_i·(log p_i + log n) per group, terms with p_i = 0 left out; 0 for n ≤ 1."""
    n = p_P_G.shape[1]
    if n <= 1:
        return torch.zeros(p_P_G.shape[0], dtype=p_P_G.dtype)
    terms = torch.where(p_P_G > 0, p_P_G * (p_P_G.log() + math.log(n)), torch.zeros_like(p_P_G))
    return terms.sum(-1)
