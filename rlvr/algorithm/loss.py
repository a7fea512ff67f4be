"""The policy loss every algorithm trains with (docs/algorithms.md#policy-loss): `PolicyLoss`, the settings of
`algorithm.loss` and, called on a micro-batch's `LossInputs` (rlvr/loss/contract.py), the loss itself, composed of
the units of rlvr/loss/ (one form, the regularisers, one aggregation).

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
REINFORCE's. With `kl` (algorithm.kl, where=loss, coef β > 0) and `entropy_coef` c ≠ 0, the regularisers add
β·kl_t − c·H_t to each token's ℓ (rlvr/loss/regularizers.py: kl_t the k1/k2/k3 estimate against the reference, H_t the
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

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.correction import NO_CORRECTION, Correction
from rlvr.algorithm.kl import NO_KL, ReferenceKL, kl_settings
from rlvr.lazy import lazy_import
from rlvr.loss.aggregation import AGGREGATIONS, agg_loss, token_weights
from rlvr.loss.contract import LossInputs, LossOutputs
from rlvr.loss.forms import FORMS, Form
from rlvr.loss.regularizers import distill_kl, echo, entropy_bonus, reference_kl
from rlvr.loss.selection import select_tokens
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Generator, Tensor

torch = lazy_import("torch")

MODES = ("standard", "kl_cov", "clip_cov")
FORM_NAMES = ("ppo", "gspo", "cispo")
COVARIANCE_MODES = ("kl_cov", "clip_cov")
"""The modes that select tokens by covariance over the whole step (only the local backend computes them)."""
__all__ = ["AGGREGATIONS", "COVARIANCE_MODES", "FORM_NAMES", "MODES", "PolicyLoss"]


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
    """The ratio and loss form (module docstring): ppo, gspo (sequence ratio), cispo (clipped weight × log π), or the
    import path of a form of one's own (`form_function`)."""
    cispo_max: float = 5.0
    """cispo: the cap of the stop-gradient importance weight (ScaleRL's ε_max)."""
    kl: ReferenceKL | None = None
    """The reference KL (`algorithm.kl`, rlvr/algorithm/kl.py; None: off): where=loss adds β·kl_t to ℓ_t."""
    entropy_coef: float = 0.0
    """`algorithm.entropy_coef` c: ℓ_t −= c·H_t (an entropy bonus for c > 0); 0 = off."""
    custom: Form | None = None
    """A user's own loss (rlvr/algorithm/custom_loss.py), called instead of the composition; None: the built-in one."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """What the settings ask of the other components. Which forms, modes, aggregations and terms a backend
        computes, it declares itself (rlvr/loss/support.py)."""
        correction = Correction.needs(settings["correction"]) if settings.get("correction") else Needs()
        requires = dict(correction.requires)
        if settings["clip_eps"] > 0:
            requires["ratio_clipping"] = f"algorithm.loss.clip_eps={settings['clip_eps']}"
        coef = (settings.get("kl") or {}).get("coef", 0.0)  # its values are checked when it is built
        if isinstance(coef, (int, float)) and coef > 0:
            requires["reference_model"] = f"algorithm.kl.coef={coef}"
        kind = (settings.get("correction") or {}).get("kind", "none")
        masked = kind in ("token_mask", "seq_geo_mask") and settings.get("aggregation", "token_mean") == "token_mean"
        return Needs(provides=correction.provides | ({"masked_token_mean"} if masked else set()), requires=requires)

    def __post_init__(self) -> None:
        self.check_clipping()
        self.check_modes()
        self.check_forms()
        self.check_aggregation()
        if isinstance(self.kl, Mapping):  # a config node built without its _target_
            object.__setattr__(self, "kl", kl_settings(self.kl))
        if not isinstance(self.entropy_coef, (int, float)) or not math.isfinite(self.entropy_coef):
            raise ValueError(f"algorithm.entropy_coef={self.entropy_coef!r} must be a finite number (0 = off)")

    def check_clipping(self) -> None:
        if self.clip_eps < 0 or self.clip_eps_high < 0 or self.adv_clip_max < 0:
            raise ValueError(
                f"algorithm.loss: clip_eps={self.clip_eps}, clip_eps_high={self.clip_eps_high} and "
                f"adv_clip_max={self.adv_clip_max} must all be >= 0"
            )
        if self.clip_eps_high > 0 and self.clip_eps == 0:
            raise ValueError(f"algorithm.loss.clip_eps_high={self.clip_eps_high} needs algorithm.loss.clip_eps > 0")

    def check_modes(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"algorithm.loss.mode={self.mode!r} must be one of {', '.join(MODES)}")
        if not 0 <= self.kl_cov_percent <= 100:
            raise ValueError(f"algorithm.loss.kl_cov_percent={self.kl_cov_percent} must be in [0, 100] (a percent)")
        if self.kl_cov_coef < 0:
            raise ValueError(f"algorithm.loss.kl_cov_coef={self.kl_cov_coef} must be >= 0")
        if not 0 <= self.clip_cov_ratio <= 1:
            raise ValueError(f"algorithm.loss.clip_cov_ratio={self.clip_cov_ratio} must be in [0, 1] (a fraction)")
        if not self.clip_cov_min < self.clip_cov_max:
            raise ValueError(f"algorithm.loss.clip_cov_min={self.clip_cov_min} must be < "
                             f"algorithm.loss.clip_cov_max={self.clip_cov_max}")

    def check_forms(self) -> None:
        if self.form not in FORM_NAMES:
            try:
                self.form_function  # noqa: B018 - a form of one's own, imported now: a wrong path fails at start
            except (ImportError, ValueError, AttributeError) as err:
                raise ValueError(f"algorithm.loss.form={self.form!r} must be one of {', '.join(FORM_NAMES)}, or the "
                                 f"import path of a form function (my_forms.my_form): {err}") from None
        if self.form != "ppo" and self.mode != "standard":
            raise ValueError(f"algorithm.loss.mode={self.mode} selects tokens by a per-token covariance and replaces "
                             f"the per-token ratio; it applies to algorithm.loss.form=ppo only (now {self.form})")
        if self.form == "cispo" and (self.clip_eps or self.clip_eps_high):
            raise ValueError(f"algorithm.loss.form=cispo caps its weight at algorithm.loss.cispo_max instead of "
                             f"clipping the ratio: set algorithm.loss.clip_eps=0 and clip_eps_high=0 (now "
                             f"{self.clip_eps}, {self.clip_eps_high})")
        if not self.cispo_max > 0:
            raise ValueError(f"algorithm.loss.cispo_max={self.cispo_max} must be > 0")

    def check_aggregation(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"algorithm.loss.aggregation={self.aggregation!r} must be one of "
                             f"{', '.join(AGGREGATIONS)}")
        if self.aggregation == "seq_mean_token_sum_norm" and not self.aggregation_norm > 0:
            raise ValueError(f"algorithm.loss.aggregation=seq_mean_token_sum_norm divides each row's sum by "
                             f"algorithm.loss.aggregation_norm, which must be > 0 (now {self.aggregation_norm})")

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        """The micro-batch's share of the step's loss: the form's ℓ × the correction's weights, plus the
        regularisers' terms, aggregated (`agg_loss`), plus ECHO's term and the teacher's divergence
        (distill.estimator=full), each over its own tokens and weights; with the sums the backend reports."""
        if self.custom is not None:
            return self.custom(inputs, self)
        form = self.form_function(inputs, self)
        token_loss = form.loss if inputs.importance_weights is None else form.loss * inputs.importance_weights
        per_token = dict(form.metrics)
        for term in self.regularizers:
            out = term(inputs, self)
            token_loss = token_loss + out.loss
            per_token |= out.metrics
        loss = agg_loss(token_loss, inputs)
        metrics = {"loss": loss.detach(), **{k: v.detach()[inputs.loss_mask].sum() for k, v in per_token.items()}}
        if inputs.echo_weights is not None:
            echo_loss = echo(inputs, self).loss.sum()
            loss, metrics = loss + echo_loss, metrics | {"echo_loss": echo_loss.detach()}
        if inputs.distill_weights is not None:  # its own tokens and weights: every action token, a token mean
            teacher = distill_kl(inputs, self)
            distill_loss = (teacher.loss * inputs.distill_weights).sum()
            loss = loss + distill_loss
            metrics |= {"distill_loss": distill_loss.detach(),
                        "distill_kl": teacher.metrics["reverse_kl"].detach()[inputs.distill_weights > 0].sum()}
        return LossOutputs(loss, metrics)

    @property
    def kind(self) -> str:
        """The form's name in rlvr/loss/forms.py `FORMS`: the covariance mode, or `form` in standard."""
        return self.form if self.mode == "standard" else self.mode

    @property
    def form_function(self) -> Form:
        """The form's unit: a built-in one by name (rlvr/loss/forms.py `FORMS`), or one of one's own by import path
        (`algorithm.loss.form=my_forms.my_form`, a function of the forms' signature)."""
        if self.kind in FORMS:
            return FORMS[self.kind]
        module, _, name = self.form.rpartition(".")
        if not module:
            raise ValueError("not a module.function path")
        return getattr(importlib.import_module(module), name)

    @property
    def reference_kl(self) -> ReferenceKL:
        """`kl`, or the off one."""
        return self.kl or NO_KL

    @property
    def regularizers(self) -> tuple[Form, ...]:
        """The terms added to each token's ℓ (rlvr/loss/regularizers.py): the backend then runs the reference pass,
        or reads the entropies, per micro-batch."""
        return (((reference_kl,) if self.reference_kl.in_loss else ())
                + ((entropy_bonus,) if self.entropy_coef else ()))

    @property
    def selects_tokens(self) -> bool:
        """Whether the loss needs `select_tokens`' mask, chosen over the whole step."""
        return self.mode in COVARIANCE_MODES

    def token_weights(self, signal_N_T: Tensor, prompt_N: Tensor) -> Tensor | None:
        """[N, T] each token's weight in the step's loss (rlvr/loss/aggregation.py `token_weights`)."""
        return token_weights(self.aggregation, self.aggregation_norm, signal_N_T, prompt_N)

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

    def select_tokens(self, new_lp_N_T: Tensor, old_lp_N_T: Tensor, adv_N_T: Tensor, mask_N_T: Tensor,
                      generator: Generator | None = None) -> Tensor:
        """bool [N, T]: kl_cov's or clip_cov's pick over the whole step (rlvr/loss/selection.py)."""
        return select_tokens(self, new_lp_N_T, old_lp_N_T, adv_N_T, mask_N_T, generator)

    def clip_cov_bounds(self) -> tuple[float, float]:
        """clip_cov's (ε_lo, ε_hi): clip_eps or 1.0, and clip_eps_high or ε_lo (docs/algorithms.md#clip_cov)."""
        lo = self.clip_eps if self.clip_eps > 0 else 1.0
        return lo, self.clip_eps_high or lo

    def token_losses(self, new_lp: Tensor, old_lp: Tensor, adv: Tensor, selected: Tensor | None = None,
                     sampled: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The form's per-token ℓ alone (no weights, no regularisers) and its bool `clipped` per token: `selected`
        is the whole-step pick (kl_cov, clip_cov), `sampled` the rows' sampled tokens (gspo; default: every token)."""
        inputs = LossInputs(new_lp, old_lp, adv, torch.ones_like(adv, dtype=torch.bool), 1,
                            torch.ones_like(adv, dtype=torch.bool) if sampled is None else sampled, selected=selected)
        out = self.form_function(inputs, self)
        return out.loss, out.metrics["clipped"]
