"""The policy as files an engine in another process or library can load (vLLM in-process, a vLLM server).

- `save_base(policy, folder)`: the base model as a plain Hugging Face folder (config.json,
  generation_config.json, safetensors), without any LoRA layer, so an engine can be started on it. Under
  LoRA these are W0 (including whatever the SFT warm-up trained), not the merged weights.
- `save_adapter(policy, folder)`: the current LoRA adapter (adapter_config.json + safetensors), the form
  vLLM's `LoRARequest` and its `/v1/load_lora_adapter` endpoint read.
- `save_full(policy, folder)`: the current full weights (for `reload_weights`), when there is no adapter.

Each call writes a new folder; engines never load a folder that is being written. `folder_bytes(folder)` is what
writing one wrote (an engine's `sync` returns it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from peft import PeftModel
    from torch import nn
    from transformers import PreTrainedModel


def is_lora(policy: nn.Module) -> bool:
    return hasattr(policy, "peft_config")


def save_base(policy: nn.Module, folder: Path) -> Path:
    """W0 as a plain HF model folder: LoRA wrappers' `base_layer` weights under their plain names."""
    # the policy is a Hugging Face model, under LoRA wrapped in PEFT's PeftModel
    inner = cast("PeftModel", policy).get_base_model() if is_lora(policy) else policy
    base = cast("PreTrainedModel", inner)
    state = {
        name.replace(".base_layer.", "."): tensor
        for name, tensor in base.state_dict().items()
        if "lora_" not in name
    }
    folder.mkdir(parents=True, exist_ok=True)
    base.save_pretrained(folder, state_dict=state, safe_serialization=True)
    return folder


def save_adapter(policy: nn.Module, folder: Path) -> Path:
    if not is_lora(policy):
        raise TypeError("save_adapter needs a LoRA (PEFT) policy")
    folder.mkdir(parents=True, exist_ok=True)
    cast("PeftModel", policy).save_pretrained(str(folder), safe_serialization=True)
    return folder


def save_full(policy: nn.Module, folder: Path) -> Path:
    if is_lora(policy):
        raise TypeError("save_full is for full fine-tuning; a LoRA policy is pushed with save_adapter")
    folder.mkdir(parents=True, exist_ok=True)
    cast("PreTrainedModel", policy).save_pretrained(folder, safe_serialization=True)
    return folder


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`: what writing it wrote, whatever the file system."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
