"""bench/prefill.py on the default model=tiny engine: both prefills sample the same tokens call for call (the bench
asserts it), the shared one feeds each group's prompt once, and the engine is left sharing afterwards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import rlvr.engine.pytorch as pytorch_engine

PATH = Path(__file__).resolve().parents[2] / "bench" / "prefill.py"


def test_both_prefills_sample_alike_and_the_engine_shares_again_after(capsys):
    spec = importlib.util.spec_from_file_location("bench_prefill", PATH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    try:
        spec.loader.exec_module(bench)
        sharing = pytorch_engine.distinct_rows
        assert bench.main(["--prompts", "3", "--repeats", "4"])["ratio"] > 0
    finally:
        del sys.modules[spec.name]
    out = capsys.readouterr().out
    assert "3 prompts × 8, max_tokens 8, 4 calls each way" in out and "every row / shared (medians)" in out
    assert pytorch_engine.distinct_rows is sharing
    assert sharing([[1, 2], [1, 2], [3], [1, 2]]) == ([0, 2], [0, 0, 1, 0]) and sharing([[1], [2]]) == (None, None)
