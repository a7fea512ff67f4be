"""Does the engine sample from the trainer's weights? Checked on every on-policy step (`trainer.sync_check`).

A sync that silently does nothing (an adapter not loaded, a weight reload that did not happen, a merged copy not
refreshed) leaves the engine sampling from old weights, and the run trains off-policy with nothing to show for it
but a flatter reward. What training moves is the probability of what the policy samples, so that is what is
compared: on a step sampled from the weights the trainer holds (every step of the synchronous loop; under
`trainer.off_policy_steps` ≥ 1 only those sampled at the step's own version), the engine's log-probabilities of the
step's own sampled tokens against the trainer's first forward of them (π_old, before the update), which the backend
computes anyway for `mismatch/*` (rlvr/algorithm/correction.py; backend=local and fsdp, a service's is not the
trainer's to score):

    Δ          mean |log π_engine − log π_train| over the step's sampled tokens (`mismatch/abs_log_ratio`)
    reference  Δ of this process's first checked step, the engine just synced to the weights the trainer holds
    allowed    max(`tolerance`, 4 × reference)
    verdict    `steps` checked steps in a row with Δ > allowed stop the run: StaleEngineError, a RunFailed (status
               `failed`, exit 1, the reason on one line)

Measured on the default run (tiny model, LoRA, engine=pytorch, docs/metrics.md `engine/sync_delta`): a faithful
engine 1.7e-7–3.4e-7, float32 on both sides; one whose sync is a no-op after step 0: 4.5e-3, 9.4e-3, 1.5e-2, 2.7e-2
after 1–4 missed steps, so `tolerance` 1e-4 stops it after 3. A bfloat16 engine beside a float32 trainer (vLLM's
CPU build) has a real gap, 1.2e-3–3.4e-3 over 12 steps and not growing: the reference absorbs it (its stale
engine: 7.5e-3, 1.2e-2, 2.7e-2 after 2–4 missed steps, over 4 × 2.4e-3 from the third). A gap that grows during
training for another reason (a policy whose bfloat16 mismatch grows) trips it too: raise `tolerance` above it, or
set `steps: 0`.

Blind where the engine's log-probabilities are not its own: engine=vllm with top_p < 1 returns the policy's
recomputation of them (rlvr/engine/vllm.py "Log-probabilities"), so Δ is 0 whatever weights vLLM holds.

`check_sync` is the older fixed probe, kept for what has no training step to read: the engine tests and
bench/weight_sync.py sample two fixed token-id prompts and score them with the module. Random-id prompts barely
move under training (a stale default run measured 1.5e-6–2.0e-6 on them), so it serves after a deliberate
perturbation only; engine=openai's start-up probe shares its prompts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from rlvr.errors import RunFailed
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
"""Mean |Δ| of float32 on both sides, allowed (the run's default `tolerance`, the probe's)."""
LOW_PRECISION_TOLERANCE = 0.02
"""The probe's mean |Δ| allowed for a bfloat16 side (bench/weight_sync.py)."""
REFERENCE_FACTOR = 4.0
"""How far above its first checked step's gap a step's may go (a bfloat16 engine's varies by 2.6× on the tiny
model's ~100 tokens a step)."""


class StaleEngineError(RunFailed):
    """The engine's log-probabilities disagree with the trainer's beyond the tolerance: it serves other weights."""


@dataclass(frozen=True)
class SyncCheck:
    steps: int = 3
    """Checked steps in a row over the allowed gap that stop the run; 0 = never."""
    tolerance: float = FLOAT32_TOLERANCE
    """Mean |Δ log p| always allowed (the gap of float32 on both sides is ~2e-7)."""

    def __post_init__(self) -> None:
        if self.steps < 0 or not (math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"trainer.sync_check: steps={self.steps} must be >= 0 (0 = never) and "
                             f"tolerance={self.tolerance} a finite number > 0")


@dataclass
class SyncWatch:
    """One process's reference gap and its run of steps over the allowed one (a continued run takes a new
    reference: its engine was just built on the checkpoint's weights)."""

    check: SyncCheck
    engine: str
    """The engine's class name, for the message."""
    reference: float | None = None
    over: list[tuple[int, float]] = field(default_factory=list)
    """The steps in a row over the allowed gap, with their Δ."""

    def observe(self, step: int, delta: float) -> dict[str, float]:
        """Step `step`'s Δ (an on-policy step's `mismatch/abs_log_ratio`); its row's `engine/sync_delta` and
        `engine/sync_allowed`. Raises StaleEngineError on the `check.steps`-th step in a row over."""
        if self.reference is None:
            self.reference = delta
        allowed = max(self.check.tolerance, REFERENCE_FACTOR * self.reference)
        self.over = [*self.over, (step, delta)] if delta > allowed else []
        if self.check.steps and len(self.over) >= self.check.steps:
            gaps = ", ".join(f"{d:.3g} (step {s})" for s, d in self.over)
            raise StaleEngineError(
                f"the engine <{self.engine}> samples from other weights than the trainer's: on {len(self.over)} "
                f"consecutive on-policy steps its log-probabilities of the step's own sampled tokens differ from the "
                f"trainer's by mean |Δ| {gaps}, over the {allowed:.3g} allowed (the larger of "
                f"trainer.sync_check.tolerance={self.check.tolerance:g} and {REFERENCE_FACTOR:g} × the first "
                f"checked step's {self.reference:.3g}). Its weight sync (Engine.sync: an adapter load, a weight "
                "reload, a merged copy's refresh) does not take effect, so the run trains on a stale policy's "
                "samples (metrics.jsonl: engine/sync_delta). A gap that grows for another reason: raise "
                "trainer.sync_check.tolerance above it, or trainer.sync_check.steps=0 turns the check off"
            )
        return {"engine/sync_delta": delta, "engine/sync_allowed": allowed}


def check_sync(engine: Engine, module: nn.Module, eos_ids: list[int], tokens: int, tolerance: float,
               step: int) -> dict[str, float]:
    """The fixed probe (module docstring): sample it from `engine` (`tokens` tokens of each prompt at temperature 1),
    score it with `module`; raise StaleEngineError when mean |Δ| > `tolerance`. Returns `engine/sync_check_delta`
    and `engine/sync_check_s` (bench/weight_sync.py's columns)."""
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
            f"{tolerance:g}; its weight sync (an adapter load, a weight reload) did not take effect"
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
