"""LoRA settings of a model preset (`model.lora`; null in YAML means full fine-tuning) and the weight
dtypes a preset may ask for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from peft import LoraConfig

peft = lazy_import("peft")

DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str] = field(default_factory=list)
    """Module-name suffixes (q_proj, …, down_proj); PEFT matches them against the model."""

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"model.lora.rank={self.rank} must be > 0 (use model.lora=null for full fine-tuning)")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name the projections LoRA adapts")

    def to_peft(self) -> LoraConfig:
        return peft.LoraConfig(
            task_type="CAUSAL_LM", r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
        )
