"""bench/weight_sync.py at its smallest (the tiny model, two syncs each way): both ways reach the engine, the memory
way writes no file, and the ratio folder / memory is printed. Needs vLLM (its CPU build, installed by .ci/run)."""

import re

import pytest


@pytest.mark.vllm
def test_both_ways_sync_and_the_ratio_is_printed(run_bench, figure):
    out = run_bench("-m", "bench.weight_sync", "--models", "tiny", "--syncs", "2", "--threads", "1")
    rows = {m.group(1): m.group(2).split() for m in re.finditer(r"(?m)^ +(folder|memory|f/m) +(.*)$", out)}
    assert set(rows) == {"folder", "memory", "f/m"}
    assert float(rows["folder"][2]) > 0 and float(rows["memory"][2]) == 0  # MB written per sync
    assert all(float(rows[way][3]) < 1e-4 for way in ("folder", "memory"))  # the probe: the engine serves the policy
    assert figure(r"(?m)^ +f/m +([0-9.]+)", out) > 0
