"""The weight dtypes a model preset may ask for. Its LoRA settings are `rlvr.types.LoraSpec`."""

from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
