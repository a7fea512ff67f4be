"""Does the engine sample from the trainer's weights? A fixed probe after a sync (`trainer.sync_check`).

A policy that never reaches the engine (an adapter not loaded, a reload that did not happen) trains off-policy
with nothing to show for it but a flat reward. So every `every` steps, right after `Engine.sync`:

    prompts   two fixed prompts of 4 token ids from the first min(V, 256) ids, no EOS among them
    engine    samples `tokens` tokens of each at temperature 1 (its own log-probabilities of what it drew)
    trainer   scores the same tokens: one un-cached forward of the module per row (`local_logprobs`)
    Δ         mean |log π_engine − log π_train| over the sampled tokens

Δ above the tolerance stops the run (`StaleEngineError`). The tolerance depends on the precisions: float32 on
both sides agree to ~1e-6 (the pytorch engine, vLLM's float32 path: 2.4e-7 measured), a bfloat16 engine
beside a float32 trainer to ~1e-3 (the tiny model, vLLM's CPU build); `tolerance: null` takes 1e-4 when the
model's and the engine's dtypes are both float32, else 0.02. A stale policy shows once the weights have moved
more than that; the check cannot see a staleness smaller than the precision's own noise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from rlvr.lazy import lazy_import
from rlvr.seeds import prompt_seeds
from rlvr.types import SamplingParams

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PreTrainedModel

    from rlvr.protocols import Engine

torch = lazy_import("torch")

PROBE_SEED = 1234
FLOAT32_TOLERANCE = 1e-4
LOW_PRECISION_TOLERANCE = 0.02


class StaleEngineError(RuntimeError):
    """The engine's log-probabilities disagree with the trainer's beyond the tolerance: it serves other weights."""


@dataclass(frozen=True)
class SyncCheck:
    every: int = 0
    """Steps between checks (each right after the sync); 0 = never."""
    tokens: int = 8
    """Tokens sampled per probe prompt."""
    tolerance: float | None = None
    """Mean |Δ| allowed; null = by precision (module docstring)."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.tokens < 1 or (self.tolerance is not None and not self.tolerance > 0):
            raise ValueError(f"trainer.sync_check: every={self.every} must be >= 0, tokens={self.tokens} >= 1, "
                             f"tolerance={self.tolerance} > 0 or null")

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def resolved_tolerance(self, model_dtype: str | None, engine_dtype: str | None) -> float:
        """`tolerance`, or by precision: the engine's dtype is the model's unless it names its own."""
        if self.tolerance is not None:
            return self.tolerance
        engine_dtype = engine_dtype or model_dtype
        both_fp32 = {model_dtype, engine_dtype} <= {"float32", None}
        return FLOAT32_TOLERANCE if both_fp32 else LOW_PRECISION_TOLERANCE


def check_sync(engine: Engine, module: nn.Module, eos_ids: list[int], tokens: int, tolerance: float,
               step: int) -> dict[str, float]:
    """Sample the probe from `engine`, score it with `module`; raise StaleEngineError when mean |Δ| > `tolerance`.
    Returns the step row's `engine/sync_check_delta` and `engine/sync_check_s`."""
    t0 = time.perf_counter()
    prompts = probe_prompts(module, eos_ids)
    sampled = engine.sample(prompts, 1, SamplingParams(1.0, 1.0, tokens), seeds=prompt_seeds(PROBE_SEED, 2))
    lengths = sampled.mask_PG_T.sum(-1).tolist()
    completions = [sampled.tokens_PG_T[i, :n].tolist() for i, n in enumerate(lengths)]
    served = torch.cat([sampled.logprobs_PG_T[i, :n] for i, n in enumerate(lengths)]).float().cpu()
    with torch.no_grad():
        own, _ = local_logprobs(module, prompts, completions, 1.0)
    delta = float((served - own).abs().mean()) if len(own) else 0.0
    if delta > tolerance:
        raise StaleEngineError(
            f"after the sync before step {step + 1}, the engine <{type(engine).__name__}> serves other weights than "
            f"the trainer's: the log-probabilities of {len(own)} probe tokens differ by mean |Δ| {delta:.3g} > "
            f"{tolerance:g} (trainer.sync_check.tolerance; null chooses it by the model's and the engine's dtype). "
            "The engine is sampling from a stale policy: its weight sync (an adapter load, a weight reload) did not "
            "take effect"
        )
    return {"engine/sync_check_delta": delta, "engine/sync_check_s": time.perf_counter() - t0}


def probe_prompts(module: nn.Module, eos_ids: list[int]) -> list[list[int]]:
    """Two fixed prompts of 4 token ids from the first min(V, 256) ids, no EOS among them."""
    # a Hugging Face model (under LoRA, PEFT's PeftModel passes `config` through to the one it wraps); a multimodal
    # one (Gemma 4) keeps the vocabulary in its text config
    vocab = min(int(cast("PreTrainedModel", module).config.get_text_config().vocab_size), 256)
    allowed = torch.tensor([t for t in range(vocab) if t not in eos_ids])
    gen = torch.Generator().manual_seed(PROBE_SEED)
    return [allowed[torch.randint(len(allowed), (4,), generator=gen)].tolist() for _ in range(2)]


def local_logprobs(
    module: nn.Module, prompts: list[list[int]], completions: list[list[int]], temperature: float
) -> tuple[Tensor, Tensor]:
    """The sampled tokens' log-probabilities under `module`, at temperature 1 and at `temperature`, from one
    un-cached forward per row, concatenated over rows (float32, CPU)."""
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    raw, scaled = [], []
    try:
        for prompt, completion in zip(prompts, completions, strict=True):
            if not completion:
                continue
            ids = torch.tensor([prompt + completion], device=device)
            logits = module(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            target = torch.tensor(completion, device=device)[:, None]
            raw.append(torch.log_softmax(logits, -1).gather(-1, target).squeeze(-1).cpu())
            scaled.append(torch.log_softmax(logits / temperature, -1).gather(-1, target).squeeze(-1).cpu())
    finally:
        module.train(was_training)
    if not raw:
        return torch.zeros(0), torch.zeros(0)
    return torch.cat(raw), torch.cat(scaled)
