"""bench/transforms.py on one small shape: every arm is timed and matches its per-sequence reference."""

import re


def test_every_arm_is_timed_and_exact_on_a_small_shape(run_bench, figure):
    out = run_bench("-m", "bench.transforms", "--shapes", "2x4x64", "--seconds", "0.05")
    arms = re.findall(r"2 × 4 ×\s+64  (.+?)\s+1 thread\(s\): median", out)
    assert arms == ["sepa", "delight", "delight (adaptive η)", "delight (mad_scale)", "delight_sepa", "hard_delight"]
    assert figure(r"= +([0-9.]+) M padded tokens/s", out) > 0
    assert out.count("  OK\n") == len(arms) and "FAIL" not in out
    assert "target: ≥ 30 M padded tokens/s" in out
