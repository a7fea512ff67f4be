"""The weight dtypes a model preset may ask for, and LoRA on a multimodal checkpoint's language model alone. A
preset's LoRA settings are `rlvr.types.LoraSpec`; `TextOnlyLora` is the one for the newer families (Qwen3.5,
Gemma 4) whose published checkpoints hold a vision (and audio) tower beside the language model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.types import LoraSpec

if TYPE_CHECKING:
    from peft import LoraConfig

DTYPES = ("float32", "bfloat16", "float16")

DECODER_LAYERS = r"(?:model\.language_model|model)\.layers\.\d+\.(?:[^.]+\.)*?"
"""Where a causal LM keeps its decoder layers: `model.layers.N.…` in a text-only class (Qwen3_5ForCausalLM, which
transformers loads from a Qwen3.5 multimodal checkpoint), `model.language_model.layers.N.…` in a multimodal one
(Gemma4ForConditionalGeneration, which it loads from a Gemma 4 checkpoint). A vision tower's layers
(`model.vision_tower.encoder.layers.N.…`, `model.visual.blocks.N.…`) and an audio tower's never match."""


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: expected one of {', '.join(DTYPES)}")


def text_only_pattern(suffixes: list[str]) -> str:
    """The PEFT `target_modules` regex (matched against a module's whole name) of the projections named by
    `suffixes` inside the language model's decoder layers."""
    names = "|".join(re.escape(s) for s in suffixes)
    return f"{DECODER_LAYERS}(?:{names})"


@dataclass(frozen=True)
class TextOnlyLora(LoraSpec):
    """LoRA on the language model's projections alone (`model.lora._target_: rlvr.model.lora.TextOnlyLora`): the
    `target_modules` suffixes are matched only inside the decoder layers (`DECODER_LAYERS`), so a multimodal
    checkpoint's vision and audio towers, whose layers reuse the names q_proj … down_proj (Gemma 4 wraps them in a
    module PEFT cannot adapt), stay as they are. A text-only model gets the same adapters as with `LoraSpec`."""

    def to_peft(self) -> LoraConfig:
        import peft

        return peft.LoraConfig(
            task_type="CAUSAL_LM", r=self.rank, lora_dropout=self.dropout,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; a float scales alike
            target_modules=text_only_pattern(list(self.target_modules)),
        )
