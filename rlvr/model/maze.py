"""The maze task's policy (MaxRL paper, appendix "Maze"): the paper's Qwen2 decoder and its symbolic vocabulary,
built offline from config with seeded random weights.

Tokenizer: a `tokenizers` WordLevel vocabulary (`<pad>`, `<eos>`, `<unk>`, then the paper's tokens in
rlvr/data/maze.py `VOCABULARY`) split on whitespace, so a prompt written as space-separated token names is one id a
token and a completion decodes to its names joined by spaces, which the verifier splits again. No BOS (the paper's
example shows one; a fixed first token carries no information).

Architecture: the paper's Qwen2 (4 layers, hidden 256, FFN 1024, 4 heads, 2 KV heads, RMSNorm ε 1e-6, SiLU, RoPE
θ 1e6, tied embeddings) is built as transformers' Llama with `attention_bias=True`: Qwen2's decoder is Llama's with
biases on the q, k and v projections; Llama's flag also gives o_proj a bias (zero at init, 1,024 more parameters at
hidden 256 × 4 layers). Not `Qwen2ForCausalLM` itself, because a run folder's saved model is read back with
AutoTokenizer (`rlvr eval`, `export`, `sample`), which for a Qwen2 config swaps this tokenizer for Qwen2's
byte-level one and encodes "GRID_START WALL" to no ids at all (transformers 5; model=tiny chose Llama for the same
reason). tests/model/test_maze_model.py shows the module computes what Qwen2ForCausalLM computes on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlvr.data.maze import VOCABULARY
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


def build_maze_tokenizer() -> PreTrainedTokenizerFast:
    """One id per paper token (module docstring)."""
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *VOCABULARY])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


@dataclass(frozen=True)
class MazeQwen2:
    """The paper's maze decoder (module docstring), full fine-tuning unless `lora` is set."""

    seeded: ClassVar[bool] = True
    """Its weights are drawn from the run's init seed: each seed starts from a base of its own."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_positions: int
    rope_theta: float
    rms_norm_eps: float
    dtype: str
    lora: LoraSpec | None = None

    @property
    def name(self) -> str:
        return "maze"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"lora"}) if settings.get("lora") is not None else frozenset())

    def __post_init__(self) -> None:
        check_dtype(self.dtype)

    def load_tokenizer(self) -> tuple[PreTrainedTokenizerFast, list[int]]:
        tokenizer = build_maze_tokenizer()
        return tokenizer, [tokenizer.eos_token_id]

    def load(self, seed: int) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
        tokenizer = build_maze_tokenizer()
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(self._config(tokenizer)).to(getattr(torch, self.dtype))
        model.config._attn_implementation = "eager"  # as model=tiny: faster than sdpa at this size on a CPU
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        return model, tokenizer

    def skeleton(self) -> LlamaForCausalLM:
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(self._config(build_maze_tokenizer())).to(getattr(torch, self.dtype))

    def _config(self, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
        return transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_positions,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            hidden_act="silu",
            attention_bias=True,
            attention_dropout=0.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
            tie_word_embeddings=True,
        )
