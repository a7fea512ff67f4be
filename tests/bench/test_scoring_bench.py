"""bench/scoring.py on a few items (without the hostile corpus, which takes seconds by design): inline, one worker
and every worker score alike, each at a finite rate."""


def test_every_configuration_scores_alike(run_bench, figure):
    out = run_bench("-m", "bench.scoring", "--items", "16", "--step", "8", "--hostile", "none")
    assert "same rewards in all three: True" in out and "workers started once per run: True" in out
    assert figure(r"(?m)^inline +([0-9.]+)", out) > 0
    assert figure(r"/ pool ×1 = ([0-9.]+)×", out) > 0 and figure(r"/ inline = ([0-9.]+)×", out) > 0
    assert "hostile corpus" not in out
