"""The reference KL and the entropy bonus (docs/algorithms.md#reference-kl-and-entropy-bonus).

`algorithm.kl` (coef β, estimator, where) penalises the policy's divergence from the reference, the model the run
starts from (the base model, after the SFT warm-up when there is one): under LoRA the trained module with its
adapter disabled (PEFT's `disable_adapter()`: no second copy), under full fine-tuning a frozen copy made when the
backend is built (before any update, so a resumed run's is rebuilt from the base, not from the checkpoint). Per
sampled token, with δ = log π_θ − log π_ref (Schulman, "Approximating KL divergence", 2020):

    k1 = δ                          unbiased, can be negative (verl's kl_penalty="kl")
    k2 = ½ δ²                       (verl's "mse")
    k3 = exp(−δ) − 1 + δ            unbiased, ≥ 0, low variance (verl's "low_var_kl", TRL's GRPO β term), the
                                    estimate clamped to [−10, 10] as verl clamps it

`estimator: auto` takes the sources' defaults: k3 in the loss (verl's kl_loss_type=low_var_kl, TRL), k1 in the
reward (verl's use_kl_in_reward with kl_penalty=kl).

    where=loss    ℓ_t += β·kl_t, the gradient through log π_θ (verl's use_kl_loss, TRL's beta): each token's
                  term is weighed and counted as the policy term is (rlvr/algorithm/loss.py)
    where=reward  r ← r − β·Σ_t kl_t over the completion's action tokens, before credit assignment (verl's
                  use_kl_in_reward); log π_θ is the sampler's log-probability (the rollouts', verl's old_log_prob
                  in its bypass mode), log π_ref from one no-grad reference pass over the step's rows

`algorithm.entropy_coef` c adds −c·H_t per token (an entropy bonus for c > 0; verl's actor entropy_coeff), H_t the
entropy of the policy's temperature-scaled distribution at the token, from the chunked head
(rlvr/backend/lm_head.py), with its gradient. coef = 0 and entropy_coef = 0 (the defaults) leave the loss as it was,
bit for bit, with no reference pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import Rollouts

torch = lazy_import("torch")

ESTIMATORS = ("k1", "k2", "k3", "auto")
WHERE = ("loss", "reward")
DEFAULT_ESTIMATOR = {"loss": "k3", "reward": "k1"}
"""`estimator: auto`: the sources' choice for each place (verl's kl_loss_type=low_var_kl and kl_penalty=kl)."""
K3_CLAMP = 10.0
"""k3's estimate is clamped to [−K3_CLAMP, K3_CLAMP] (verl's low_var_kl)."""


@dataclass(frozen=True)
class ReferenceKL:
    coef: float = 0.0
    """β; 0 = off (no reference pass, no copy)."""
    estimator: str = "auto"
    """k1 | k2 | k3 | auto (k3 in the loss, k1 in the reward)."""
    where: str = "loss"
    """loss (ℓ_t += β·kl_t) | reward (r ← r − β·Σ_t kl_t)."""

    def __post_init__(self) -> None:
        if not self.coef >= 0:
            raise ValueError(f"algorithm.kl.coef={self.coef} must be >= 0 (0 = off)")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"algorithm.kl.estimator={self.estimator!r} must be one of {', '.join(ESTIMATORS)}")
        if self.where not in WHERE:
            raise ValueError(f"algorithm.kl.where={self.where!r} must be one of {', '.join(WHERE)}")

    @property
    def active(self) -> bool:
        return self.coef > 0

    @property
    def in_loss(self) -> bool:
        return self.active and self.where == "loss"

    @property
    def in_reward(self) -> bool:
        return self.active and self.where == "reward"

    @property
    def kind(self) -> str:
        """The estimator used: `estimator`, or `where`'s default for auto."""
        return DEFAULT_ESTIMATOR[self.where] if self.estimator == "auto" else self.estimator

    def estimate(self, logp: Tensor, ref_logp: Tensor) -> Tensor:
        """Per-token estimate of KL(π_θ ‖ π_ref) at the sampled tokens (module docstring), differentiable in `logp`."""
        return estimate(self.kind, logp, ref_logp)


NO_KL = ReferenceKL()


def estimate(kind: str, logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1, k2 or k3 of δ = logp − ref_logp (module docstring)."""
    delta = logp - ref_logp
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "k3":
        return (torch.exp(-delta) - 1.0 + delta).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"algorithm.kl.estimator={kind!r} must be one of k1, k2, k3")


def kl_settings(settings: Mapping[str, Any] | None) -> ReferenceKL:
    """The ReferenceKL of a config node (resolved; None or absent: off)."""
    if not settings:
        return NO_KL
    return ReferenceKL(**{k: v for k, v in settings.items() if k != "_target_"})


def uses_reference(loss: Any) -> bool:
    """Whether `loss` (`algorithm.loss`) reads a reference model, in the loss or in the reward."""
    kl = getattr(loss, "kl", None)
    return kl is not None and kl.active


class ReferenceBackend(Protocol):
    def reference_logprobs(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] log π_ref of every sampled completion token (0 on padding), no grad."""
        ...


def kl_in_reward(loss: Any, backend: Any, rollouts: Rollouts, rewards_P_G: Tensor) -> tuple[Tensor, dict[str, float]]:
    """`algorithm.kl.where=reward`: the rewards credit assignment sees, r − β·Σ_t kl_t over each completion's action
    tokens (log π_θ: the sampler's, `rollouts.logprobs_PG_T`; log π_ref: the backend's no-grad reference pass), and
    the step's metrics. Anything else: `rewards_P_G` itself and no metrics (no pass)."""
    kl = getattr(loss, "kl", None)
    if kl is None or not kl.in_reward:
        return rewards_P_G, {}
    ref_PG_T = cast(ReferenceBackend, backend).reference_logprobs(rollouts).to(rollouts.logprobs_PG_T.device)
    mask = rollouts.action_mask_PG_T
    kl_PG_T = torch.where(mask, kl.estimate(rollouts.logprobs_PG_T.float(), ref_PG_T.float()), 0.0)
    penalty_P_G = (kl.coef * kl_PG_T.sum(-1)).reshape(rewards_P_G.shape).to(rewards_P_G.dtype)
    metrics = {"policy/kl_ref": float(kl_PG_T.sum()) / max(int(mask.sum()), 1), "policy/kl_coef": kl.coef,
               "policy/kl_reward_penalty": float(penalty_P_G.mean())}
    return rewards_P_G - penalty_P_G.to(rewards_P_G.device), metrics


DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}


def reference_memory(config: Mapping[str, Any]) -> list[str]:
    """What the reference model costs a run (lines for `rlvr plan`, docs/memory.md#the-reference-model), from the
    composed config (no model loaded): nothing when algorithm.kl.coef = 0; under LoRA no copy (the adapter disabled);
    under full fine-tuning a frozen copy of the base in model.dtype, its size when the weights' files are on this
    machine (a local folder, or the Hugging Face cache), sharded over the processes under backend=fsdp."""
    algorithm = config.get("algorithm") or {}
    coef = (algorithm.get("kl") or {}).get("coef", 0.0)
    if not isinstance(coef, (int, float)) or coef <= 0:
        return []
    model = config.get("model") or {}
    head = f"reference model (algorithm.kl.coef={coef:g}):"
    if model.get("lora") is not None:
        return [f"{head} the policy with its LoRA adapter disabled, no copy (one more no-grad forward pass)"]
    dtype = str(model.get("dtype") or "float32")
    size = weight_file_bytes(model.get("name_or_path"), model.get("revision"))
    sharded = str((config.get("backend") or {}).get("_target_", "")).endswith("FSDPBackend")
    where = ", sharded over the processes (each holds 1/N)" if sharded else ""
    if size is None:
        return [f"{head} a frozen copy of the base beside the trained weights (full fine-tuning): its parameter "
                f"count × {DTYPE_BYTES.get(dtype, 4)} bytes ({dtype}) more{where}"]
    return [f"{head} a frozen copy of the base beside the trained weights (full fine-tuning): "
            f"{size / 2**30:.3g} GiB in {dtype} (the size of its weight files){where}"]


def weight_file_bytes(name_or_path: Any, revision: Any = None) -> int | None:
    """The bytes of a model's safetensors files, from a local folder or the Hugging Face cache (no download);
    None when they are not on this machine."""
    if not name_or_path or str(name_or_path).startswith("???"):
        return None
    from pathlib import Path

    folder = Path(str(name_or_path))
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        for name in ("model.safetensors.index.json", "model.safetensors"):
            try:
                found = try_to_load_from_cache(str(name_or_path), name, revision=revision)
            except ValueError:  # not a hub id either (HFValidationError): a path that does not exist
                return None
            if isinstance(found, str):
                folder = Path(found).parent
                break
        else:
            return None
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None
