"""bench/guess_feedback.py on a real env=guess run of one step (warm-up off): the checkpoint's policy and the run's
base play the held-out games, each policy's column is printed."""


def test_the_base_and_the_checkpoint_play_the_held_out_games(run_bench, figure, tmp_path):
    run = tmp_path / "run"
    run_bench("train.py", "env=guess", "trainer.max_steps=1", "trainer.warmup.steps=0", "data.eval_size=4",
              f"hydra.run.dir={run}")
    out = run_bench("-m", "bench.guess_feedback", str(run), "data.eval_size=4")
    header, games, success = out.splitlines()[:3]
    assert header.split() == ["warm-up", "step", "1"]
    assert games.split()[1:] == ["4", "4"]
    assert all(0 <= float(x) <= 1 for x in success.split()[1:])
    assert "warm-up: g2 - g1 after higher" in out and "step 1: g2 - g1 after lower" in out
