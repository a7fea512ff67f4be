"""bench/lm_head.py at a small vocabulary: each head runs in its own process, the ratios are printed, and the two
heads' values and gradients agree."""

import re


def test_both_heads_run_and_agree(run_bench, figure):
    out = run_bench("-m", "bench.lm_head", "--vocab", "512", "--hidden", "16", "--tokens", "32", "--check-tokens", "8")
    for name in ("log p", "log p + entropy"):
        line = re.search(rf"^{re.escape(name)} +(.*)$", out, re.M)
        assert line, out
        time_ratio, peak_ratio = (float(x) for x in line.group(1).split()[-2:])
        assert time_ratio > 0 and peak_ratio > 0
    for what in ("log p", "entropy", "∂/∂h", "∂/∂W"):
        assert figure(rf"{re.escape(what)} ([0-9.e+-]+)", out.split("max |chunked")[1]) < 1e-4
