"""A policy loaded with the standard `from_pretrained` path: a hub id or a local folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlvr.model.lora import LoraSpec, check_dtype
from rlvr.model.prompt_encoding import eos_ids


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

    def __post_init__(self) -> None:
        check_dtype(self.dtype)

    def check_available(self) -> None:
        """Fail now, before anything loads, if the weights cannot be found: a local folder that does not
        exist, or (offline) a hub id that is not in the local cache."""
        local = Path(os.path.expanduser(self.name_or_path))
        if self.name_or_path.startswith(("/", ".", "~")) or local.exists():
            if not (local / "config.json").is_file():
                raise FileNotFoundError(
                    f"model.name_or_path={self.name_or_path!r}: no model folder there (expected a folder with "
                    "config.json written by save_pretrained, or a hub id such as Qwen/Qwen3-0.6B)"
                )
            return
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(self.name_or_path, "config.json", revision=self.revision), str):
                raise FileNotFoundError(
                    f"model.name_or_path={self.name_or_path!r} is not in the local hub cache and HF_HUB_OFFLINE "
                    "is set: download it first, or point model.name_or_path at a local folder"
                )

    def load(self, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        del seed  # pretrained weights are fixed; the LoRA init has its own sub-seed
        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        tokenizer = self._tokenizer()
        model = AutoModelForCausalLM.from_pretrained(
            self.name_or_path, dtype=getattr(torch, self.dtype), attn_implementation=self.attn_implementation, **kwargs
        )
        return model, tokenizer

    def load_tokenizer(self) -> tuple[PreTrainedTokenizerBase, list[int]]:
        """The tokenizer and the EOS ids of the tokenizer and of `generation_config.json` (no weights read)."""
        tokenizer = self._tokenizer()
        try:
            generation = GenerationConfig.from_pretrained(
                self.name_or_path, revision=self.revision, trust_remote_code=self.trust_remote_code
            )
            model_eos = generation.eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            model_eos = None
        return tokenizer, eos_ids(tokenizer, model_eos)

    def _tokenizer(self) -> PreTrainedTokenizerBase:
        tokenizer = AutoTokenizer.from_pretrained(
            self.name_or_path, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
        if tokenizer.pad_token_id is None:  # Llama-family tokenizers ship without one
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
