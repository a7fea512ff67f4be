"""The policy loss every algorithm trains with (docs/algorithms.md#policy-loss).

Per completion token t with advantage A ≠ 0 (a "valid" token):

    δ = log π_θ(t) − log π_old(t),   r = exp(δ)

π_old is the engine's log-probability of the sampled token (`correction.pi_old=bypass`, the default) or the
trainer's own before the update (`decoupled`); `correction` (rlvr/algorithm/correction.py) then weighs or masks
tokens for the engine/trainer mismatch.

mode=standard (the default), by `form`:
    ppo (the default)
      clip_eps = 0:   ℓ = −r·A                                   (importance-sampled REINFORCE)
      clip_eps > 0:   ℓ = −min(r·A, clip(r, 1−ε, 1+ε_high)·A)    (PPO clip; ε_high = clip_eps_high or ε)
    gspo              r replaced by the row's s = exp(mean of δ over its sampled tokens), the geometric mean of its
                      token ratios (GSPO, arXiv 2507.18071; gradient through every token's δ), clipped alike
    cispo             ℓ = −sg(min(r, cispo_max))·A·log π_θ       (ScaleRL's CISPO, arXiv 2510.13786; MiniMax-M1's
                      clipped IS weight: every token keeps a gradient, the weight has none; clip_eps must be 0)

mode=kl_cov and mode=clip_cov (arXiv 2505.22617, "The Entropy Mechanism of RL for Reasoning LMs";
docs/algorithms.md#kl_cov, docs/algorithms.md#clip_cov) first score every valid token of the step by the
covariance of its advantage and its new log-probability (no gradient; means over the step's valid tokens):

    cov = (A − mean A)·(log π_θ − mean log π_θ)

    kl_cov:   ℓ = −r·A, plus kl_cov_coef·|δ| on the k tokens of largest cov,
              k = max(1, int(valid·min(kl_cov_percent, 100)/100))          (kl_cov_percent = 0.2 means 0.2 %)
    clip_cov: ε_lo = clip_eps if > 0 else 1.0, ε_hi = clip_eps_high or ε_lo,
              ℓ = max(−r·A, −clip(r, 1−ε_lo, 1+ε_hi)·A);
              among the tokens with clip_cov_min < cov < clip_cov_max whose clipped branch is not active
              (−clip(r)·A > −r·A), n = max(int(clip_cov_ratio·valid), 1) drawn at random (at most all of
              them) get ℓ = 0 (no gradient; they still count in the token count below)

Every mode: loss = Σ w·ℓ over the step's tokens with A ≠ 0, the weights w set by `aggregation`
(docs/algorithms.md#loss-aggregation), each from the whole step (every micro-batch, pass and process together):

    token_mean               w = 1 / n                      n: the step's tokens with A ≠ 0 (the default; DAPO)
    seq_mean_token_mean      w = 1 / (S · n_i)              S: rows with any such token, n_i: row i's (GRPO's paper)
    seq_mean_token_sum       w = 1 / S
    seq_mean_token_sum_norm  w = 1 / (S · aggregation_norm) (Dr. GRPO: a constant, the longest completion allowed)
    prompt_mean              w = 1 / (P · n_p)              P: prompts with any such token, n_p: their group's tokens

token_mean: long completions carry proportionally more weight, and the loss is the mean per token. Micro-batching,
packing and the number of processes change memory, never the objective, under every aggregation. Tokens whose
advantage is exactly 0 are left out of both the sums and the counts (a row or prompt without one counts in no
denominator). Both log-probabilities are of the temperature-scaled distribution the
sampler drew from (see rlvr/types.py Rollouts), so an on-policy step has r = 1 and the gradient is
REINFORCE's. With `kl` (algorithm.kl, where=loss, coef β > 0) and `entropy_coef` c ≠ 0, `regularize` adds
β·kl_t − c·H_t to each token's ℓ (rlvr/algorithm/kl.py: kl_t the k1/k2/k3 estimate against the reference, H_t the
policy's entropy), on the same tokens and with the same weights w as the policy term (verl and TRL apply them over
every response token: docs/algorithms.md#reference-kl-and-entropy-bonus); both 0 (the defaults) leave ℓ as above.

Covariance selection (kl_cov, clip_cov), a deliberate departure from the predecessor (docs/algorithms.md#kl_cov):
the tokens are chosen over the **whole step** (every micro-batch together), so `backend.micro_batch_size` still
never changes the objective; the predecessor chose them inside each micro-batch (means, k and the random draw per
micro-batch), so its loss depended on the micro-batch size. The local backend gets the step's new log-probabilities
from a no-grad forward pass before the gradient pass (the parameters do not change between micro-batches of a step,
so they are the values the gradient pass sees): one extra forward pass per step in these modes, none in `standard`.
clip_cov's draw uses a generator the backend seeds from the run's seed and its step counter, so a resumed run draws
the same tokens. Edge cases: a step with no valid token selects nothing; kl_cov_percent = 0 or clip_cov_ratio = 0
still selects one token (the spec's max(1, …); the predecessor's code selects none at kl_cov_percent = 0,
docs/predecessor.md); clip_cov with no token inside (clip_cov_min, clip_cov_max) selects nothing. On-policy (r = 1
up to float noise, this trainer's single update per batch) kl_cov's |δ| is ≈ 0 in value, and its gradient's sign is
the noise's: the penalty bites once the policy moves off the sampler's. Metrics: `policy/cov_fraction` = selected /
valid (both modes, absent in standard); `clip_fraction` is 0 under kl_cov and the selected fraction under clip_cov.

`adv_clip_max` > 0 caps non-zero token advantages to [−cap, cap] before the loss (not ratio clipping;
docs/algorithms.md#advantage-cap). Metrics: adv_cap_fraction (capped / non-zero), adv_cap_magnitude
(mean |a| of the capped values before the clamp).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.correction import NO_CORRECTION, Correction
from rlvr.algorithm.kl import NO_KL, ReferenceKL, kl_settings
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Generator, Tensor

torch = lazy_import("torch")

MODES = ("standard", "kl_cov", "clip_cov")
FORMS = ("ppo", "gspo", "cispo")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "prompt_mean")
COVARIANCE_MODES = ("kl_cov", "clip_cov")
"""The modes that select tokens by covariance over the whole step (only the local backend computes them)."""


@dataclass(frozen=True)
class PolicyLoss:
    clip_eps: float
    clip_eps_high: float
    adv_clip_max: float
    mode: str = "standard"
    kl_cov_percent: float = 0.2
    """kl_cov: percent (not fraction) of the step's valid tokens that get the |δ| penalty."""
    kl_cov_coef: float = 1.0
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of the step's valid tokens whose loss is zeroed."""
    clip_cov_min: float = 1.0
    clip_cov_max: float = 5.0
    correction: Correction = NO_CORRECTION
    """The engine/trainer mismatch correction (`correction=`, rlvr/algorithm/correction.py)."""
    aggregation: str = "token_mean"
    """How the step's per-token losses become one number (module docstring)."""
    aggregation_norm: int = 0
    """seq_mean_token_sum_norm's constant divisor of each row's sum (Dr. GRPO: the longest completion allowed)."""
    form: str = "ppo"
    """The ratio and loss form (module docstring): ppo, gspo (sequence ratio), cispo (clipped weight × log π)."""
    cispo_max: float = 5.0
    """cispo: the cap of the stop-gradient importance weight (ScaleRL's ε_max)."""
    kl: ReferenceKL | None = None
    """The reference KL (`algorithm.kl`, rlvr/algorithm/kl.py; None: off): where=loss adds β·kl_t to ℓ_t."""
    entropy_coef: float = 0.0
    """`algorithm.entropy_coef` c: ℓ_t −= c·H_t (an entropy bonus for c > 0); 0 = off."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        correction = Correction.needs(settings["correction"]) if settings.get("correction") else Needs()
        requires = dict(correction.requires)
        if settings["clip_eps"] > 0:
            requires["ratio_clipping"] = f"algorithm.loss.clip_eps={settings['clip_eps']}"
        mode = settings.get("mode", "standard")
        if mode in COVARIANCE_MODES:
            requires["local_loss"] = f"algorithm.loss.mode={mode}"
        if settings.get("form", "ppo") != "ppo":
            requires["local_loss"] = f"algorithm.loss.form={settings['form']}"
        coef = (settings.get("kl") or {}).get("coef", 0.0)  # its values are checked when it is built
        if isinstance(coef, (int, float)) and coef > 0:
            requires["reference_model"] = f"algorithm.kl.coef={coef}"
        if settings.get("entropy_coef"):
            requires["local_loss"] = f"algorithm.entropy_coef={settings['entropy_coef']}"
        return Needs(provides=correction.provides, requires=requires)

    def __post_init__(self) -> None:
        if self.clip_eps < 0 or self.clip_eps_high < 0 or self.adv_clip_max < 0:
            raise ValueError(
                f"algorithm.loss: clip_eps={self.clip_eps}, clip_eps_high={self.clip_eps_high} and "
                f"adv_clip_max={self.adv_clip_max} must all be >= 0"
            )
        if self.clip_eps_high > 0 and self.clip_eps == 0:
            raise ValueError(f"algorithm.loss.clip_eps_high={self.clip_eps_high} needs algorithm.loss.clip_eps > 0")
        if self.mode not in MODES:
            raise ValueError(f"algorithm.loss.mode={self.mode!r} must be one of {', '.join(MODES)}")
        if not 0 <= self.kl_cov_percent <= 100:
            raise ValueError(f"algorithm.loss.kl_cov_percent={self.kl_cov_percent} must be in [0, 100] (a percent)")
        if self.kl_cov_coef < 0:
            raise ValueError(f"algorithm.loss.kl_cov_coef={self.kl_cov_coef} must be >= 0")
        if not 0 <= self.clip_cov_ratio <= 1:
            raise ValueError(f"algorithm.loss.clip_cov_ratio={self.clip_cov_ratio} must be in [0, 1] (a fraction)")
        if self.form not in FORMS:
            raise ValueError(f"algorithm.loss.form={self.form!r} must be one of {', '.join(FORMS)}")
        if self.form != "ppo" and self.mode != "standard":
            raise ValueError(f"algorithm.loss.mode={self.mode} selects tokens by a per-token covariance and replaces "
                             f"the per-token ratio; it applies to algorithm.loss.form=ppo only (now {self.form})")
        if self.form == "cispo" and (self.clip_eps or self.clip_eps_high):
            raise ValueError(f"algorithm.loss.form=cispo caps its weight at algorithm.loss.cispo_max instead of "
                             f"clipping the ratio: set algorithm.loss.clip_eps=0 and clip_eps_high=0 (now "
                             f"{self.clip_eps}, {self.clip_eps_high})")
        if not self.cispo_max > 0:
            raise ValueError(f"algorithm.loss.cispo_max={self.cispo_max} must be > 0")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"algorithm.loss.aggregation={self.aggregation!r} must be one of "
                             f"{', '.join(AGGREGATIONS)}")
        if self.aggregation == "seq_mean_token_sum_norm" and not self.aggregation_norm > 0:
            raise ValueError(f"algorithm.loss.aggregation=seq_mean_token_sum_norm divides each row's sum by "
                             f"algorithm.loss.aggregation_norm, which must be > 0 (now {self.aggregation_norm})")
        if not self.clip_cov_min < self.clip_cov_max:
            raise ValueError(f"algorithm.loss.clip_cov_min={self.clip_cov_min} must be < "
                             f"algorithm.loss.clip_cov_max={self.clip_cov_max}")
        if isinstance(self.kl, Mapping):  # a config node built without its _target_
            object.__setattr__(self, "kl", kl_settings(self.kl))
        if not isinstance(self.entropy_coef, (int, float)) or not math.isfinite(self.entropy_coef):
            raise ValueError(f"algorithm.entropy_coef={self.entropy_coef!r} must be a finite number (0 = off)")

    @property
    def reference_kl(self) -> ReferenceKL:
        """`kl`, or the off one."""
        return self.kl or NO_KL

    @property
    def regularized(self) -> bool:
        """Whether the per-token loss has a reference-KL or an entropy term (the backend then runs the reference
        pass, or reads the entropies, per micro-batch)."""
        return self.reference_kl.in_loss or self.entropy_coef != 0

    def regularize(self, tok_loss: Tensor, new_lp: Tensor, ref_lp: Tensor | None, entropy: Tensor | None
                   ) -> tuple[Tensor, Tensor | None]:
        """ℓ_t + β·kl_t − c·H_t (rlvr/algorithm/kl.py) and the per-token kl_t (None without the KL term): `ref_lp` is
        log π_ref of the same tokens (no grad; None without the KL term), `entropy` H_t (None when c = 0)."""
        kl_t = None
        kl = self.reference_kl
        if kl.in_loss:
            if ref_lp is None:
                raise ValueError(f"algorithm.kl.coef={kl.coef}: the loss needs the reference's log-probabilities")
            kl_t = kl.estimate(new_lp, ref_lp)
            tok_loss = tok_loss + kl.coef * kl_t
        if self.entropy_coef:
            if entropy is None:
                raise ValueError(f"algorithm.entropy_coef={self.entropy_coef}: the loss needs the entropies")
            tok_loss = tok_loss - self.entropy_coef * entropy
        return tok_loss, kl_t

    @property
    def selects_tokens(self) -> bool:
        """Whether `token_losses` needs `select_tokens`' mask, chosen over the whole step."""
        return self.mode in COVARIANCE_MODES

    def token_weights(self, signal_N_T: Tensor, prompt_N: Tensor) -> Tensor | None:
        """[N, T] float: each token's weight w in the step's loss Σ w·ℓ (module docstring), from the whole step's
        tokens with A ≠ 0 (`signal_N_T`; `prompt_N`: each row's prompt index); None for token_mean, whose sum is
        divided by the count instead."""
        if self.aggregation == "token_mean":
            return None
        n_N = signal_N_T.sum(-1).double()
        rows = int((n_N > 0).sum())
        if self.aggregation == "prompt_mean":
            n_P = torch.zeros(int(prompt_N.max()) + 1 if len(prompt_N) else 0, dtype=torch.float64,
                              device=n_N.device).index_add_(0, prompt_N.to(n_N.device), n_N)
            w_N = 1.0 / (int((n_P > 0).sum()) * n_P[prompt_N.to(n_N.device)])
        elif self.aggregation == "seq_mean_token_mean":
            w_N = 1.0 / (rows * n_N)
        elif self.aggregation == "seq_mean_token_sum":
            w_N = torch.full_like(n_N, 1.0 / max(rows, 1))
        else:
            w_N = torch.full_like(n_N, 1.0 / (max(rows, 1) * self.aggregation_norm))
        return torch.where(signal_N_T, w_N[:, None], 0.0).float()

    def cap(self, adv_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        if self.adv_clip_max <= 0:
            return adv_PG_T, {}
        nonzero = adv_PG_T != 0
        capped = nonzero & (adv_PG_T.abs() > self.adv_clip_max)
        n_nonzero, n_capped = int(nonzero.sum()), int(capped.sum())
        metrics = {
            "adv_cap_fraction": n_capped / n_nonzero if n_nonzero else 0.0,
            "adv_cap_magnitude": float(adv_PG_T[capped].abs().mean()) if n_capped else 0.0,
        }
        return adv_PG_T.clamp(-self.adv_clip_max, self.adv_clip_max), metrics

    def select_tokens(
        self, new_lp_N_T: Tensor, old_lp_N_T: Tensor, adv_N_T: Tensor, mask_N_T: Tensor,
        generator: Generator | None = None,
    ) -> Tensor:
        """bool [N, T]: the tokens kl_cov penalises or clip_cov zeroes, chosen among `mask_N_T`'s (the valid
        tokens of the WHOLE step) by the covariance score of the module docstring; all False in standard.
        `generator` (CPU) draws clip_cov's pick; the candidates are taken in row-major order, so the pick is a
        function of the step's tensors and the generator's state only."""
        selected = torch.zeros_like(mask_N_T, dtype=torch.bool)
        valid = int(mask_N_T.sum())
        if not self.selects_tokens or valid == 0:
            return selected
        new, adv = new_lp_N_T.detach()[mask_N_T], adv_N_T[mask_N_T]  # valid tokens, row-major
        cov = (adv - adv.mean()) * (new - new.mean())
        if self.mode == "kl_cov":
            chosen = cov.topk(max(1, int(valid * min(self.kl_cov_percent, 100) / 100))).indices
        else:
            ratio, (lo, hi) = torch.exp(new - old_lp_N_T[mask_N_T]), self.clip_cov_bounds()
            clipped_branch = -ratio.clamp(1 - lo, 1 + hi) * adv > -ratio * adv
            inside = (cov > self.clip_cov_min) & (cov < self.clip_cov_max) & ~clipped_branch
            candidates = inside.nonzero().squeeze(-1)
            n = min(max(int(self.clip_cov_ratio * valid), 1), len(candidates))
            chosen = candidates[torch.randperm(len(candidates), generator=generator)[:n].to(candidates.device)]
        selected.view(-1)[mask_N_T.flatten().nonzero().squeeze(-1)[chosen]] = True
        return selected

    def clip_cov_bounds(self) -> tuple[float, float]:
        """clip_cov's (ε_lo, ε_hi): clip_eps or 1.0, and clip_eps_high or ε_lo (docs/algorithms.md#clip_cov)."""
        lo = self.clip_eps if self.clip_eps > 0 else 1.0
        return lo, self.clip_eps_high or lo

    def token_losses(
        self, new_lp: Tensor, old_lp: Tensor, adv: Tensor, selected: Tensor | None = None,
        sampled: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Per-token loss ℓ and a bool per token counted in `clip_fraction` (clipped tokens in standard — a
        clipped sequence's every token under gspo, weights at the cap under cispo —, none in kl_cov, the selected
        ones in clip_cov). `selected` is this micro-batch's rows of `select_tokens`' whole-step mask (required by
        kl_cov and clip_cov, unused by standard); `sampled` its rows' sampled tokens (required by gspo: the tokens
        each row's ratio is the geometric mean over)."""
        if self.selects_tokens and selected is None:
            raise ValueError(f"algorithm.loss.mode={self.mode}: token_losses needs select_tokens' whole-step mask")
        if self.form == "cispo":
            weight = torch.exp(new_lp - old_lp).detach()
            return -weight.clamp(max=self.cispo_max) * adv * new_lp, weight > self.cispo_max
        if self.form == "gspo":
            if sampled is None:
                raise ValueError("algorithm.loss.form=gspo: token_losses needs the rows' sampled tokens")
            delta = torch.where(sampled, new_lp - old_lp, 0.0)
            ratio = torch.exp(delta.sum(-1, keepdim=True) / sampled.sum(-1, keepdim=True).clamp(min=1))
            ratio = ratio.expand_as(adv)
        else:
            ratio = torch.exp(new_lp - old_lp)
        if self.mode == "kl_cov":
            penalty = self.kl_cov_coef * (new_lp - old_lp).abs()
            return -ratio * adv + torch.where(selected, penalty, 0.0), torch.zeros_like(adv, dtype=torch.bool)
        if self.mode == "clip_cov":
            assert selected is not None  # selects_tokens: refused above when missing
            lo, hi = self.clip_cov_bounds()
            loss = torch.maximum(-ratio * adv, -ratio.clamp(1 - lo, 1 + hi) * adv)
            return torch.where(selected, torch.zeros_like(loss), loss), selected
        if self.clip_eps == 0:
            return -ratio * adv, torch.zeros_like(adv, dtype=torch.bool)
        hi = self.clip_eps_high or self.clip_eps
        clipped_ratio = ratio.clamp(1 - self.clip_eps, 1 + hi)
        loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
        return loss, (ratio < 1 - self.clip_eps) | (ratio > 1 + hi)
