"""A policy loaded with the standard `from_pretrained` path: a hub id or a local folder."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlvr.lazy import lazy_import
from rlvr.model import unsloth
from rlvr.model.lora import check_dtype
from rlvr.model.prompt_encoding import eos_ids
from rlvr.protocols import Finding, Needs
from rlvr.requirements import HUB_PROBE_TIMEOUT_S, hub_cache, hub_endpoint, hub_offline, unanswered
from rlvr.types import LoraSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

torch = lazy_import("torch")
transformers = lazy_import("transformers")


CONFIG = "config.json"
WEIGHTS = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))
"""(one file, a sharded model's index naming every shard in its `weight_map`), in from_pretrained's order."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "tokenizer_config.json")
"""Any one of them: a tokenizer's files are there (which ones it needs depends on its kind)."""


def is_local(name_or_path: str) -> bool:
    """A path (absolute, relative, ~, or an existing folder), not a hub id."""
    return name_or_path.startswith(("/", ".", "~")) or Path(os.path.expanduser(name_or_path)).exists()


def absent_files(locate: Callable[[str], Path | None]) -> tuple[list[str], int]:
    """What of a model from_pretrained reads is not there (`locate(filename)`: its path, or None): config.json,
    a tokenizer, every weight file; and how many weight files there are."""
    absent = [] if locate(CONFIG) else [CONFIG]
    if not any(locate(name) for name in TOKENIZER_FILES):
        absent.append(f"tokenizer files (any of {', '.join(TOKENIZER_FILES)})")
    for single, index_name in WEIGHTS:
        if locate(single):
            return absent, 1
        index = locate(index_name)
        if index is None:
            continue
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            return [*absent, f"a readable weight index ({index_name}: {type(err).__name__})"], 0
        missing = [shard for shard in shards if not locate(shard)]
        if missing:
            absent.append(f"{len(missing)} of {len(shards)} weight files ({missing[0]}, …)")
        return absent, len(shards)
    names = [name for pair in WEIGHTS for name in pair]
    return [*absent, f"weights ({' or '.join(names)})"], 0


@dataclass(frozen=True)
class PretrainedWeights:
    """The files `from_pretrained` will read (config.json, a tokenizer, every weight file): in a local folder, or
    for a hub id in the local hub cache at `revision`. What is not cached is downloaded at start, so it is
    missing when the hub is off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) or does not answer a HEAD request
    within HUB_PROBE_TIMEOUT_S (the one request made, and only then): a run refuses at start instead of
    retrying the hub for a minute and failing with a traceback."""

    name_or_path: str
    revision: str | None
    at_start: bool = True

    @property
    def item(self) -> str:
        return "files"

    def check(self) -> Finding:
        return self.finding(lambda: unanswered(hub_endpoint()))

    def finding(self, hub_unanswered: Callable[[], str | None]) -> Finding:
        """`check`, with the hub probe given (`rlvr doctor` probes once for every preset)."""
        name = self.name_or_path
        if is_local(name):
            folder = Path(os.path.expanduser(name))
            if not (folder / CONFIG).is_file():
                return Finding("missing", f"model.name_or_path={name!r}: no model folder there (expected a folder "
                                          "with config.json written by save_pretrained, or a hub id such as "
                                          "Qwen/Qwen3-0.6B)")
            absent, _ = absent_files(lambda f: folder / f if (folder / f).is_file() else None)
            if absent:
                return Finding("missing", f"model.name_or_path={name!r}: the folder lacks {', '.join(absent)}"
                                          ": save the model and its tokenizer there with save_pretrained")
            return Finding("ok", f"local folder {name}")
        cached, detail = self.in_hub_cache()
        if cached:
            return Finding("ok", f"{name}: {detail}")
        off = hub_offline()
        if off is not None:
            var = off.split("=")[0]
            return Finding("missing", f"model.name_or_path={name!r} {detail} and {var} is set ({off}): nothing is "
                                      f"downloaded. {self.how_to_fetch()}")
        endpoint = hub_endpoint()
        why = hub_unanswered()
        if why is not None:
            return Finding("missing", f"model.name_or_path={name!r} {detail} and the hub does not answer (HEAD "
                                      f"{endpoint}: {why}, within a {HUB_PROBE_TIMEOUT_S:g}-s probe; $HF_ENDPOINT "
                                      f"names another hub or mirror), so it cannot be downloaded. "
                                      f"{self.how_to_fetch()}")
        return Finding("warning", f"{name} {detail}: downloaded from {endpoint} when the run starts")

    def how_to_fetch(self) -> str:
        revision = f" --revision {self.revision}" if self.revision else ""
        folder = "models--" + self.name_or_path.replace("/", "--")
        return (f"Fetch it on a machine with network (`hf download {self.name_or_path}{revision}`, or `huggingface-cli "
                f"download {self.name_or_path}{revision}`) and copy its hub cache folder {folder} into {hub_cache()} "
                "($HF_HUB_CACHE, else $HF_HOME/hub), or set model.name_or_path to a local folder written by "
                "save_pretrained")

    def in_hub_cache(self) -> tuple[bool, str]:
        """Whether config.json, a tokenizer and every weight file are in the local hub cache at `revision`, and
        what is (not) there. Reads the cache only (huggingface_hub's `try_to_load_from_cache`), never the network."""
        from huggingface_hub import try_to_load_from_cache

        cache = hub_cache()

        def locate(filename: str) -> Path | None:
            found = try_to_load_from_cache(self.name_or_path, filename, cache_dir=cache, revision=self.revision)
            return Path(found) if isinstance(found, str) else None

        at = f" at revision {self.revision}" if self.revision else ""
        config = locate(CONFIG)
        if config is None:
            return False, f"is not in the local hub cache{at}"
        absent, weights = absent_files(locate)
        if absent:
            return False, f"is only partly in the local hub cache{at} ({config.parent} lacks {', '.join(absent)})"
        return True, f"in the hub cache ({weights} weight file{'s' if weights > 1 else ''}, {config.parent})"


def check_all_loaded(name_or_path: str, model_class: str, missing: set[str] | list[str]) -> None:
    """Refuse a model some of whose weights the checkpoint did not hold: transformers initialises them at random
    and only logs it. A multimodal checkpoint read into its text-only class (Qwen3.5's: Qwen3_5ForCausalLM) is
    where this happens: its `tie_word_embeddings` read from the text config alone leaves an untied `lm_head`
    missing."""
    if missing:
        keys = sorted(missing)
        raise ValueError(f"model.name_or_path={name_or_path!r}: {len(keys)} weight(s) of {model_class} are not in "
                         f"the checkpoint and would start at random ({', '.join(keys[:3])}"
                         f"{', …' if len(keys) > 3 else ''}): a checkpoint of another architecture, or a config that "
                         "does not match its weights (e.g. tie_word_embeddings)")


@dataclass(frozen=True)
class Pretrained:
    seeded: ClassVar[bool] = False
    """Its weights are loaded, whatever the seed: every seed starts from one base (unless a warm-up trains it)."""

    name_or_path: str
    revision: str | None
    dtype: str
    """torch dtype name of the weights: bfloat16 on GPUs, float32 on CPU."""
    attn_implementation: str | None
    """sdpa | eager | flash_attention_2; null lets transformers choose."""
    lora: LoraSpec | None
    """The adapter the backend attaches; None: full fine-tuning, or the Unsloth loader's (`unsloth_lora`)."""
    trust_remote_code: bool = False
    loader: str = "transformers"
    """transformers | unsloth: a 4-bit base with Unsloth's LoRA and gradient checkpointing, CUDA only
    (rlvr/model/unsloth.py)."""
    unsloth_lora: LoraSpec | None = field(default=None, init=False)
    """Under `loader: unsloth`, the `lora` the preset was given: Unsloth attaches it while loading."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"lora"}) if settings["lora"] is not None else frozenset(),
                     requires=({"local_policy": "model.loader=unsloth loads the policy into this process"}
                               if settings.get("loader") == "unsloth" else {}),
                     machine=(PretrainedWeights(settings["name_or_path"], settings["revision"]),
                              *unsloth.requirements(settings)))

    @property
    def name(self) -> str:
        return self.name_or_path

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.loader not in unsloth.LOADERS:
            raise ValueError(f"model.loader={self.loader!r}: expected one of {', '.join(unsloth.LOADERS)}")
        if self.loader == "unsloth" and self.lora is None:
            raise ValueError("model.loader=unsloth trains a LoRA adapter on a 4-bit base, and model.lora is null "
                             "(full fine-tuning): set model.lora, or use model.loader=transformers")
        if self.loader == "unsloth":  # the module arrives with its adapter: the backend attaches none
            object.__setattr__(self, "unsloth_lora", self.lora)
            object.__setattr__(self, "lora", None)

    def load(self, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        if self.loader == "unsloth":
            assert self.unsloth_lora is not None  # __post_init__ refuses the unsloth loader without LoRA
            return unsloth.load(self.name_or_path, self.revision, self.dtype, self.trust_remote_code,
                                self.unsloth_lora, seed)
        del seed  # pretrained weights are fixed; the LoRA init has its own sub-seed
        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        tokenizer = self._tokenizer()
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            self.name_or_path, dtype=getattr(torch, self.dtype), attn_implementation=self.attn_implementation,
            output_loading_info=True, **kwargs
        )
        check_all_loaded(self.name_or_path, type(model).__name__, info["missing_keys"])
        return model, tokenizer

    def skeleton(self) -> PreTrainedModel:
        config = transformers.AutoConfig.from_pretrained(self.name_or_path, revision=self.revision,
                                                         trust_remote_code=self.trust_remote_code)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, self.dtype),
                                                                 trust_remote_code=self.trust_remote_code)

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
