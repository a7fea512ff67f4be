"""bench/overlap.py at two steps of the default task (warm-up off): `python train.py` with k=0, k=1 and k=1 with
partial rollouts, and the ratios of their wall per step."""


def test_every_arm_runs_and_the_ratios_are_printed(run_bench, figure):
    out = run_bench("-m", "bench.overlap", "--steps", "2", "trainer.warmup.steps=0", "data.eval_size=8", "--tasks",
                    "default", "--partial")
    for arm in ("k=0", "k=1", "k=1 partial"):
        assert figure(rf"(?m)^ +{arm} +([0-9.]+) ", out) > 0  # its wall per step
    assert figure(r"(?m)^ +k=1 +[0-9.]+ +([0-9.]+)×", out) > 0  # against k=0's
    assert figure(r"k=1: partial rollouts ([0-9.]+)× the step without", out) > 0
