"""The rules of a backend's own optimizer and batching values, which each backend reports as its `needs(settings)
.errors` (rlvr/protocols.py `Needs`), before any model loads: torch checks some only when the optimizer is built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def optimizer_errors(b: Mapping[str, Any]) -> list[str]:
    """AdamW's settings (backend=local, fsdp, tinker): eps must be > 0, since at 0 a weight whose gradient is 0
    (LoRA's A at the first step, an embedding row no token of the step used) gets 0/0 = NaN."""
    errors = []
    betas = b.get("betas")
    if betas is not None and not (len(betas) == 2 and all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1 for x in betas)):
        errors.append(f"backend.betas={list(betas)} must be two numbers in [0, 1) (AdamW's β1, β2)")
    if "eps" in b and not b["eps"] > 0:
        errors.append(f"backend.eps={b['eps']} must be > 0 (AdamW divides by sqrt(v) + eps, and v is 0 where every "
                      "gradient so far was 0)")
    errors += [f"backend.{k}={b[k]} must be >= 0" for k in ("weight_decay", "grad_clip_norm") if k in b and b[k] < 0]
    return errors


def packing_errors(b: Mapping[str, Any]) -> list[str]:
    """backend.packing=true packs rows into passes of at most backend.max_tokens_per_micro_batch tokens."""
    if b.get("packing") and not (isinstance(budget := b.get("max_tokens_per_micro_batch"), int) and budget > 0):
        return [f"backend.max_tokens_per_micro_batch={budget!r}: backend.packing=true needs a token budget per "
                "forward/backward > 0 (prompt + completion tokens)"]
    return []
