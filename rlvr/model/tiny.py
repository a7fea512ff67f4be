"""The tiny built-in policy: a Llama-architecture model and a character-level tokenizer, built offline.

One builder serves `conf/model/tiny.yaml` and the tests. The tokenizer is a `tokenizers` WordLevel vocab
(`<pad>`, `<eos>`, `<unk>`, then one entry per alphabet character) with a split-every-character
pre-tokenizer and a Fuse decoder; it has no BOS. model=tiny has no chat template, so prompts are encoded as
plain text; a preset may give one (`chat_template`, a Jinja text: model=tiny_tools shows tools and tool-role
turns in a few characters, conf/model/tiny_tools.yaml). Llama (not Qwen2) because AutoTokenizer would swap a
Qwen2 model's tokenizer for a byte-level one that silently drops characters: "1+2=3 ab" → "1+2=3ab"
(docs/environment.md#transformers-5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlvr.lazy import lazy_import
from rlvr.model.lora import check_dtype
from rlvr.protocols import Needs
from rlvr.types import LoraSpec

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

torch = lazy_import("torch")
tokenizers = lazy_import("tokenizers")
transformers = lazy_import("transformers")

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def build_char_tokenizer(alphabet: str, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    chars = list(dict.fromkeys(alphabet))  # keep order, drop repeats
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *chars])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@dataclass(frozen=True)
class TinyLlama:
    """A Llama model built from config with seeded random weights (no download)."""

    seeded: ClassVar[bool] = True
    """Its weights are drawn from the run's init seed: each seed starts from a base of its own."""

    alphabet: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_positions: int
    dtype: str
    lora: LoraSpec | None
    chat_template: str | None = None
    """A Jinja chat template for the tokenizer (None: prompts are plain text)."""

    @property
    def name(self) -> str:
        return "tiny"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"lora"}) if settings["lora"] is not None else frozenset())

    def __post_init__(self) -> None:
        check_dtype(self.dtype)

    def load_tokenizer(self) -> tuple[PreTrainedTokenizerFast, list[int]]:
        tokenizer = build_char_tokenizer(self.alphabet, self.chat_template)
        return tokenizer, [tokenizer.eos_token_id]

    def load(self, seed: int) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
        tokenizer = build_char_tokenizer(self.alphabet, self.chat_template)
        torch.manual_seed(seed)
        # eager attention: measured faster than sdpa at this size (docs/cpu-recipe.md)
        model = transformers.LlamaForCausalLM(self._config(tokenizer)).to(getattr(torch, self.dtype))
        model.config._attn_implementation = "eager"
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        return model, tokenizer

    def skeleton(self) -> LlamaForCausalLM:
        with torch.device("meta"):
            tokenizer = build_char_tokenizer(self.alphabet, self.chat_template)
            return transformers.LlamaForCausalLM(self._config(tokenizer)).to(getattr(torch, self.dtype))

    def _config(self, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
        return transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_positions,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
            tie_word_embeddings=True,
        )
