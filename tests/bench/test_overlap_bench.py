"""bench/overlap.py at two steps of the default task (warm-up off): `python train.py` with k=0 and k=1, and the
ratio of their wall per step."""


def test_both_loops_run_and_the_ratio_is_printed(run_bench, figure):
    out = run_bench("-m", "bench.overlap", "--steps", "2", "trainer.warmup.steps=0", "data.eval_size=8", "--tasks",
                    "default")
    assert figure(r"wall per step k=1 / k=0: ([0-9.]+)×", out) > 0
    for k in (0, 1):
        assert figure(rf"(?m)^ +{k} +([0-9.]+) ", out) > 0
