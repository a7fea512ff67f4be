"""Engine/trainer mismatch correction (`correction=`, docs/algorithms.md#mismatch-correction).

The engine samples with its own kernels (vLLM in bfloat16, other batching), so its log-probability of a sampled
token, log π_engine(t), is not the trainer's, log π_train(t), for the same weights. Per sampled (action) token:

    log ρ_t = log π_train(t) − log π_engine(t)        π_train: the trainer's, before this step's update
    ρ_seq   = Π_t ρ_t  (over the row's sampled tokens)  geo_seq = exp(mean_t log ρ_t)

rlvr takes one optimizer step per batch, so π_train before the update is exactly the value the gradient pass
computes (sg(log π_θ), every micro-batch sees the same weights): neither mode needs a pass of its own.

Where π_old comes from (`pi_old`), i.e. what the loss's ratio r = π_θ / π_old compares with:

    bypass     π_old = π_engine: r = π_θ / π_engine (value ρ_t): the ratio is itself the full importance weight
    decoupled  π_old = π_train:  r = π_θ / sg(π_θ) (value 1): the PPO clip sees the trainer's own policy, and the
               mismatch is the correction's alone (none: ignored)

What the correction does (`kind`); weights scale a token's loss, masks remove tokens (from the loss and from
the token count it is divided by):

    none          nothing
    token_tis     weight w_t = min(ρ_t, cap)                                   truncated IS, per token
    seq_tis       weight w_t = min(ρ_seq, cap) on every token of the row          truncated IS, per sequence
    token_mask    keep tokens with low ≤ ρ_t ≤ high                           (IcePop's band)
    seq_geo_mask  keep rows with low ≤ geo_seq ≤ high                         (geometric-mean band)

A weight replaces the importance weight the token's gradient carries: under `bypass` the token's loss is
multiplied by sg(w_t / ρ_t) (the ratio already carries ρ_t), under `decoupled` by sg(w_t). So token_tis's
gradient is −min(ρ_t, cap)·A·∇log π_θ in both modes (with no ratio clipping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

KINDS = ("none", "token_tis", "seq_tis", "token_mask", "seq_geo_mask")
PI_OLD = ("bypass", "decoupled")


@dataclass(frozen=True)
class Correction:
    kind: str = "none"
    pi_old: str = "bypass"
    cap: float = 2.0
    """token_tis, seq_tis: importance weights are truncated at `cap`."""
    low: float = 0.5
    """token_mask, seq_geo_mask: the band's lower end."""
    high: float = 2.0
    """token_mask, seq_geo_mask: the band's upper end."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """Every kind and π_old mode asks the backend for the same thing, `token_correction`: π_train of the sampled
        tokens before the update, `factors` of it, and a loss whose per-token ratio those factors scale (the local
        loss, or a service's per-token loss_fn given π_old and the scaled advantages, rlvr/backend/tinker.py)."""
        if settings["kind"] == "none" and settings["pi_old"] == "bypass":
            return Needs()
        decoupled = settings["kind"] != "none" and settings["pi_old"] == "decoupled"
        return Needs(provides=frozenset({"off_policy_loss"}) if decoupled else frozenset(),
                     requires={"token_correction": f"correction={settings['kind']} (pi_old={settings['pi_old']})"})

    def __post_init__(self) -> None:
        where = "algorithm.loss.correction"
        if self.kind not in KINDS:
            raise ValueError(f"{where}.kind={self.kind!r} must be one of {', '.join(KINDS)}")
        if self.pi_old not in PI_OLD:
            raise ValueError(f"{where}.pi_old={self.pi_old!r} must be one of {', '.join(PI_OLD)}")
        if not self.cap >= 1:
            raise ValueError(f"{where}.cap={self.cap} must be >= 1 (importance weights are truncated at it)")
        if not 0 <= self.low < 1 < self.high:
            raise ValueError(f"{where}: low={self.low} and high={self.high} must satisfy 0 <= low < 1 < high")

    @property
    def active(self) -> bool:
        """Whether the loss changes at all (decoupled changes the ratio's base even without a correction)."""
        return self.kind != "none" or self.pi_old == "decoupled"

    def factors(self, log_rho_N_T: Tensor, sampled_N_T: Tensor) -> tuple[Tensor, Tensor]:
        """(float [N, T] what each token's loss is multiplied by, no gradient; bool [N, T] tokens kept). `log_rho`
        is log π_train − log π_engine of every position (read only where `sampled`, the rows' action tokens)."""
        log_rho = torch.where(sampled_N_T, log_rho_N_T.detach().float(), 0.0)
        keep = torch.ones_like(sampled_N_T)
        if self.kind == "token_mask":
            keep = (log_rho >= _log(self.low)) & (log_rho <= math.log(self.high))
        elif self.kind == "seq_geo_mask":
            log_geo = log_rho.sum(-1) / sampled_N_T.sum(-1).clamp(min=1)
            keep = ((log_geo >= _log(self.low)) & (log_geo <= math.log(self.high)))[:, None].expand_as(sampled_N_T)
        if self.kind == "token_tis":
            log_w = log_rho.clamp(max=math.log(self.cap))
        elif self.kind == "seq_tis":
            log_w = log_rho.sum(-1, keepdim=True).clamp(max=math.log(self.cap)).expand_as(log_rho)
        else:  # no weight of its own: bypass keeps the ratio's ρ, decoupled ignores the mismatch
            log_w = log_rho if self.pi_old == "bypass" else torch.zeros_like(log_rho)
        log_factor = log_w - log_rho if self.pi_old == "bypass" else log_w
        return torch.exp(log_factor) * keep, keep


def mismatch_sums(log_rho_N_T: Tensor, sampled_N_T: Tensor, keep_N_T: Tensor, signal_N_T: Tensor
                  ) -> dict[str, float]:
    """One micro-batch's part of the step's `mismatch/*` metrics (summed, or maxed, over micro-batches and
    ranks: `SUMMED`, `MAXED`), over its rows' sampled tokens; `masked` and `kept` count the tokens with signal
    (those the loss sums over) the correction removed or kept."""
    log_rho = log_rho_N_T.detach().float()[sampled_N_T]
    rho = log_rho.exp()
    seq = torch.where(sampled_N_T, log_rho_N_T.detach().float(), 0.0).sum(-1)[sampled_N_T.any(-1)]
    empty = log_rho.numel() == 0
    return {
        "k3": float((rho - 1 - log_rho).sum()), "rho": float(rho.sum()), "abs": float(log_rho.abs().sum()),
        "sampled": float(log_rho.numel()),
        "masked": float((signal_N_T & ~keep_N_T).sum()), "kept": float((signal_N_T & keep_N_T).sum()),
        "rho_max": -math.inf if empty else float(rho.max()), "neg_rho_min": -math.inf if empty else -float(rho.min()),
        "seq_log_max": -math.inf if seq.numel() == 0 else float(seq.max()),
    }


SUMMED = ("k3", "rho", "abs", "sampled", "masked", "kept")
MAXED = ("rho_max", "neg_rho_min", "seq_log_max")


def merge_sums(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {**{k: a[k] + b[k] for k in SUMMED}, **{k: max(a[k], b[k]) for k in MAXED}}


EMPTY_SUMS = {**dict.fromkeys(SUMMED, 0.0), **dict.fromkeys(MAXED, -math.inf)}


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step row's `mismatch/*` (docs/metrics.md) from the whole step's sums; `mismatch/abs_log_ratio` only when
    there were sampled tokens (trainer.sync_check reads it: rlvr/engine/sync_check.py)."""
    n, signal = sums["sampled"], sums["masked"] + sums["kept"]
    finite = n > 0
    return {
        **({"mismatch/abs_log_ratio": sums["abs"] / n} if finite else {}),
        "mismatch/kl": sums["k3"] / n if finite else 0.0,
        "mismatch/ratio_mean": sums["rho"] / n if finite else 1.0,
        "mismatch/ratio_max": sums["rho_max"] if finite else 1.0,
        "mismatch/ratio_min": -sums["neg_rho_min"] if finite else 1.0,
        "mismatch/seq_ratio_max": math.exp(min(sums["seq_log_max"], 80.0)) if finite else 1.0,
        "mismatch/masked_frac": sums["masked"] / signal if signal else 0.0,
    }


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


NO_CORRECTION = Correction()
