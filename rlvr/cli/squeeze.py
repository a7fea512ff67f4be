"""`rlvr squeeze ADAPTER`: the per-rank variance table of a LoRA adapter, the recommended rank, and with
`--out` the adapter re-factored at that rank (rlvr/squeeze.py has the method). Imported only when chosen:
it loads torch."""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.cli.runs import CliError
from rlvr.squeeze import SqueezeError, analyze_adapter, compress_adapter, load_adapter


def parse_ranks(text: str | None) -> list[int] | None:
    """`1,2,3` → [1, 2, 3]; `4-8` → [4, 5, 6, 7, 8]; None → the default targets."""
    if not text:
        return None
    ranks = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            ranks += list(range(int(low), int(high or low) + 1))
    except ValueError:
        raise CliError(f"--ranks {text!r}: expected comma-separated ranks or ranges, e.g. 1,2,4 or 1-16") from None
    return ranks


def run(path: Path, threshold: float, rank: int | None, ranks: str | None, out: Path | None, as_json: bool,
        device: str) -> str:
    try:
        if rank is not None and out is None:
            raise CliError("--rank chooses the rank of the adapter --out writes: give --out DIR too")
        adapter = load_adapter(path)
        report = analyze_adapter(adapter, threshold, parse_ranks(ranks), device)
        summary = report.to_json()
        if out is not None:
            config = compress_adapter(adapter, out, rank or report.recommended_rank, device)
            summary["written"] = {"path": str(out), "r": config["r"], "lora_alpha": config.get("lora_alpha")}
    except SqueezeError as err:
        raise CliError(str(err)) from None
    if as_json:
        return json.dumps(summary, indent=2)
    lines = [report.table()]
    if out is not None:
        lines.append(f"wrote the rank-{config['r']} adapter (lora_alpha {config.get('lora_alpha')}) to {out}")
    return "\n".join(lines)
