"""bench/engines.py at its smallest (one policy, two new tokens, one timed call each): both engines, built by the
run's own factories, sample every row to max_tokens and the ratio vLLM / pytorch is printed. Needs vLLM (its CPU
build, installed by .ci/run)."""

import pytest


@pytest.mark.vllm
def test_both_engines_sample_and_the_ratio_is_printed(run_bench, figure):
    out = run_bench("-m", "bench.engines", "--policy", "full", "--max-tokens", "2", "--repeats", "1", "--threads", "1")
    assert figure(r"(?m)^full +pytorch +([0-9,]+)", out) > 0 and figure(r"(?m)^full +vllm +([0-9,]+)", out) > 0
    assert figure(r"(?m)^full +vllm/pt +([0-9.]+)", out) > 0
