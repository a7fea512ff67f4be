"""A policy loaded with the standard `from_pretrained` path: a hub id or a local folder."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.model.lora import LoraSpec


@dataclass(frozen=True)
class Pretrained:
    name_or_path: str
    revision: str | None
    dtype: str
    """torch dtype name of the weights: bfloat16 on GPUs, float32 on CPU."""
    attn_implementation: str | None
    """sdpa | eager | flash_attention_2; null lets transformers choose."""
    lora: LoraSpec | None
    trust_remote_code: bool = False

    def load(self, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        del seed  # pretrained weights are fixed; the LoRA init has its own sub-seed
        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        tokenizer = AutoTokenizer.from_pretrained(self.name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            self.name_or_path, dtype=getattr(torch, self.dtype), attn_implementation=self.attn_implementation, **kwargs
        )
        if tokenizer.pad_token_id is None:  # Llama-family tokenizers ship without one
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer
