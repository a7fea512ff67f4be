"""bench/eval_memory.py at a few short rows: each setting decodes in its own process, greedily to the same tokens,
and the peak memory ratio is printed."""


def test_both_settings_decode_the_same_tokens(run_bench, figure):
    out = run_bench("-m", "bench.eval_memory", "--rows", "4", "--prompt-tokens", "16", "--max-tokens", "2")
    assert "failed" not in out
    assert [line.endswith("yes") for line in out.splitlines() if "chunk (before)" in line or "auto (after)" in line] \
        == [True, True]
    assert figure(r"= ([0-9.]+)x; time", out) > 0
