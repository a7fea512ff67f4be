"""Unsloth as the loader of a pretrained policy in the local backend (`model.loader: unsloth`,
rlvr/model/pretrained.py).

Unsloth loads the base in 4 bits (bitsandbytes NF4), attaches its own LoRA (PEFT underneath, with its fused LoRA
kernels) and its own gradient checkpointing (activations offloaded, `use_gradient_checkpointing="unsloth"`):

    FastLanguageModel.from_pretrained(model_name, max_seq_length, dtype, load_in_4bit=True, revision,
                                      trust_remote_code, use_gradient_checkpointing="unsloth", random_state)
    FastLanguageModel.get_peft_model(model, r, target_modules, lora_alpha, lora_dropout, bias="none",
                                     use_gradient_checkpointing="unsloth", random_state)

(the keywords of unsloth 2026.10.9's `FastLanguageModel.from_pretrained` and `FastLlamaModel.get_peft_model`,
which `FastLanguageModel.get_peft_model` wraps). The module the backend gets already carries that adapter, so the
backend attaches none (`Pretrained.lora` is None under this loader; `Pretrained.unsloth_lora` keeps the spec);
checkpoints hold the adapter alone, as under the transformers loader. Leave `backend.gradient_checkpointing`
false: Unsloth's checkpointing is on, and transformers' would replace it.

GPU only: bitsandbytes' 4-bit kernels and Unsloth's Triton kernels need CUDA, so a run with this loader is
refused at start on a machine without it (`UnslothCuda`), as it is when unsloth is not installed, or when the
installed transformers is outside the range unsloth's own metadata pins (`UnslothTransformersPin`: unsloth
2026.10.9 requires transformers <=5.17.0, excluding some releases; rlvr's environment has a newer one, so unsloth
goes in an environment of its own). `rlvr doctor model.loader=unsloth` reports all three. Unsloth itself imports
on a machine without a GPU (it prints "no GPU found, training on CPU" and offers SFT on the CPU); that fallback is
not what this loader is for."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.model.lora import TextOnlyLora, text_only_pattern
from rlvr.protocols import Finding
from rlvr.requirements import Package
from rlvr.types import LoraSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LOADERS = ("transformers", "unsloth")
"""`model.loader`: transformers' AutoModelForCausalLM (any device), or Unsloth's FastLanguageModel (CUDA)."""
MAX_SEQ_LENGTH = 2048
"""Unsloth's `max_seq_length` (its RoPE scaling and kernels are sized by it): the predecessor's floor, and longer
than every prompt + completion of the shipped recipes."""
GRADIENT_CHECKPOINTING = "unsloth"
"""Unsloth's own checkpointing: activations offloaded to CPU memory between forward and backward."""
INSTALL = ('pip install "unsloth==2026.10.9" in an environment of its own (it pins transformers <=5.17.0 and '
           "torch <2.15) on a machine with a CUDA GPU")
UNSLOTH_PACKAGE = Package("unsloth", INSTALL)


def from_pretrained_kwargs(name_or_path: str, revision: str | None, dtype: str, trust_remote_code: bool,
                           seed: int) -> dict[str, Any]:
    """What `FastLanguageModel.from_pretrained` is given: the base in 4 bits, computing in `dtype`."""
    import torch

    return {"model_name": name_or_path, "max_seq_length": MAX_SEQ_LENGTH, "dtype": getattr(torch, dtype),
            "load_in_4bit": True, "revision": revision, "trust_remote_code": trust_remote_code,
            "use_gradient_checkpointing": GRADIENT_CHECKPOINTING, "random_state": seed}


def peft_kwargs(lora: LoraSpec, seed: int) -> dict[str, Any]:
    """What `FastLanguageModel.get_peft_model` is given besides the model: `lora`'s rank, alpha, dropout and
    targets (TextOnlyLora's as its regex, which Unsloth passes to PEFT whole), LoRA A drawn from `seed`."""
    targets: str | list[str] = (text_only_pattern(list(lora.target_modules)) if isinstance(lora, TextOnlyLora)
                                else list(lora.target_modules))
    return {"r": lora.rank, "target_modules": targets, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
            "bias": "none", "use_gradient_checkpointing": GRADIENT_CHECKPOINTING, "random_state": seed}


def load(name_or_path: str, revision: str | None, dtype: str, trust_remote_code: bool, lora: LoraSpec,
         seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The 4-bit base with Unsloth's LoRA attached, and its tokenizer. (Full fine-tuning is not offered under this
    loader, as the predecessor did not: `Pretrained` refuses `model.lora=null` with it.)"""
    from unsloth import FastLanguageModel  # imported first: it patches transformers and peft as it loads

    model, tokenizer = FastLanguageModel.from_pretrained(
        **from_pretrained_kwargs(name_or_path, revision, dtype, trust_remote_code, seed))
    model = FastLanguageModel.get_peft_model(model, **peft_kwargs(lora, seed))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def transformers_pin() -> tuple[str, str] | None:
    """(unsloth's version, its requirement on transformers as a specifier, e.g. ">=4.52.4,<=5.17.0,!=5.0.0"), read
    from the installed unsloth's metadata without importing it; None when unsloth is not installed."""
    from packaging.requirements import Requirement

    try:
        version, requires = importlib.metadata.version("unsloth"), importlib.metadata.requires("unsloth") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for text in requires:
        requirement = Requirement(text)
        if requirement.name == "transformers" and requirement.marker is None:
            return version, str(requirement.specifier)
    return version, ""


@dataclass(frozen=True)
class UnslothTransformersPin:
    """The installed transformers is one unsloth accepts (its metadata's `transformers` requirement)."""

    at_start: bool = True

    @property
    def item(self) -> str:
        return "transformers"

    def check(self) -> Finding:
        from packaging.specifiers import SpecifierSet

        pin = transformers_pin()
        try:
            installed = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            return Finding("missing", "transformers is not installed")
        if pin is None:
            return Finding("missing", f"transformers {installed}; unsloth is not installed, so the transformers "
                                      f"releases it accepts are unknown: {INSTALL}")
        version, specifier = pin
        if SpecifierSet(specifier).contains(installed, prereleases=True):
            return Finding("ok", f"transformers {installed} is within unsloth {version}'s pin ({specifier})")
        return Finding("missing", f"model.loader=unsloth: transformers {installed} is outside unsloth {version}'s pin "
                                  f"transformers{specifier}: {INSTALL}")


@dataclass(frozen=True)
class UnslothCuda:
    """A CUDA device: where Unsloth's 4-bit base, LoRA kernels and gradient checkpointing run."""

    at_start: bool = True

    @property
    def item(self) -> str:
        return "cuda"

    def check(self) -> Finding:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return Finding("ok", f"model.loader=unsloth: {torch.cuda.get_device_name(0)}")
        why = (f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None else
               f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device")
        return Finding("missing", f"model.loader=unsloth needs a CUDA GPU ({why}): Unsloth's 4-bit base "
                                  "(bitsandbytes), its LoRA kernels (Triton) and its gradient checkpointing run on "
                                  "CUDA; use model.loader=transformers here")


def requirements(settings: Mapping[str, Any]) -> tuple:
    """The machine requirements of `model.loader` (none for transformers)."""
    if settings.get("loader", "transformers") != "unsloth":
        return ()
    return UNSLOTH_PACKAGE, UnslothTransformersPin(), UnslothCuda()
