"""A policy loaded with the standard `from_pretrained` path: a hub id or a local folder."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.model.lora import LoraSpec, check_dtype
from rlvr.model.prompt_encoding import eos_ids
from rlvr.protocols import Finding, Needs

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

torch = lazy_import("torch")
transformers = lazy_import("transformers")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


@dataclass(frozen=True)
class PretrainedWeights:
    """The weights `from_pretrained` will read: a local folder with config.json, or a hub id whose config and
    weight files are in the local hub cache (needed when HF_HUB_OFFLINE is set; otherwise downloaded at start).
    Reads the cache only; never the network."""

    name_or_path: str
    revision: str | None
    at_start: bool = True

    @property
    def item(self) -> str:
        return "weights"

    def check(self) -> Finding:
        local = Path(os.path.expanduser(self.name_or_path))
        if self.name_or_path.startswith(("/", ".", "~")) or local.exists():
            if not (local / "config.json").is_file():
                return Finding("missing", f"model.name_or_path={self.name_or_path!r}: no model folder there (expected "
                                          "a folder with config.json written by save_pretrained, or a hub id such "
                                          "as Qwen/Qwen3-0.6B)")
            return Finding("ok", f"local folder {self.name_or_path}")
        cached, detail = self.in_hub_cache()
        if cached:
            return Finding("ok", f"{self.name_or_path}: {detail}")
        if hub_offline():
            return Finding("missing", f"model.name_or_path={self.name_or_path!r} {detail} and HF_HUB_OFFLINE is set: "
                                      "download it first, or point model.name_or_path at a local folder")
        return Finding("warning", f"{self.name_or_path} {detail}: downloaded from the hub when the run starts")

    def in_hub_cache(self) -> tuple[bool, str]:
        """Whether config.json and every weight file are in the local hub cache, and what is (not) there."""
        from huggingface_hub import try_to_load_from_cache

        def cached(filename: str) -> str | None:
            found = try_to_load_from_cache(self.name_or_path, filename, revision=self.revision)
            return found if isinstance(found, str) else None

        config = cached("config.json")
        if config is None:
            return False, "is not in the local hub cache"
        index = cached("model.safetensors.index.json")
        if index is not None:
            shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
            absent = [s for s in shards if cached(s) is None]
            if absent:
                return False, f"has {len(absent)} of {len(shards)} weight files missing from the hub cache"
            return True, f"in the hub cache ({len(shards)} weight files, {Path(config).parent})"
        if cached("model.safetensors") or cached("pytorch_model.bin"):
            return True, f"in the hub cache ({Path(config).parent})"
        return False, "has config.json in the hub cache but no weights"


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

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"lora"}) if settings["lora"] is not None else frozenset(),
                     machine=(PretrainedWeights(settings["name_or_path"], settings["revision"]),))

    def __post_init__(self) -> None:
        check_dtype(self.dtype)

    def load(self, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        del seed  # pretrained weights are fixed; the LoRA init has its own sub-seed
        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        tokenizer = self._tokenizer()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            self.name_or_path, dtype=getattr(torch, self.dtype), attn_implementation=self.attn_implementation, **kwargs
        )
        return model, tokenizer

    def load_tokenizer(self) -> tuple[PreTrainedTokenizerBase, list[int]]:
        """The tokenizer and the EOS ids of the tokenizer and of `generation_config.json` (no weights read)."""
        tokenizer = self._tokenizer()
        try:
            generation = transformers.GenerationConfig.from_pretrained(
                self.name_or_path, revision=self.revision, trust_remote_code=self.trust_remote_code
            )
            model_eos = generation.eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            model_eos = None
        return tokenizer, eos_ids(tokenizer, model_eos)

    def _tokenizer(self) -> PreTrainedTokenizerBase:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            self.name_or_path, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
        if tokenizer.pad_token_id is None:  # Llama-family tokenizers ship without one
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
