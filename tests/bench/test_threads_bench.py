"""bench/threads.py at one run of one RL step: `python train.py` runs at a thread count and the table shows it."""


def test_one_run_is_timed_and_tabled(run_bench, figure):
    out = run_bench("-m", "bench.threads", "--threads", "1", "--busy", "0", "--rounds", "1", "--warmup-steps", "0",
                    "--steps", "1")
    assert figure(r"(?m)^ +0 +1 +([0-9.]+) +1\.00×", out) > 0  # busy 0, threads 1: its own baseline
