"""bench/packing.py at its smallest: both layouts train the same rows (same loss and gradient norm), the ratios are
printed."""

import re


def test_padded_and_packed_steps_agree_and_are_compared(run_bench, figure):
    out = run_bench("-m", "bench.packing", "--rows", "2", "--min-tokens", "4", "--max-tokens", "16", "--prompt", "4",
                    "--micro-batch-size", "1", "--steps", "1", "--hidden", "32", "--layers", "1", "--heads", "2",
                    "--threads", "1")
    rows = {m.group(1): m.group(2).split() for m in re.finditer(r"^(padded|packed) +(.*)$", out, re.M)}
    assert set(rows) == {"padded", "packed"}
    assert abs(float(rows["padded"][-2]) - float(rows["packed"][-2])) < 1e-5  # the loss
    assert abs(float(rows["padded"][-1]) - float(rows["packed"][-1])) < 1e-4  # the gradient norm
    assert figure(r"packed/padded: time ([0-9.]+)x", out) > 0
    assert 0 < figure(r"tokens ([0-9.]+)x", out) < 1  # packing drops the padding
