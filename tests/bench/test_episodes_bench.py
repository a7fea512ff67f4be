"""bench/episodes.py at its smallest on the real trainers (warm-ups off, one uncounted and one measured step a side,
inside `Trainer.stepping` as `fit` steps): both sides step through `Trainer.step` with 128 rows, the guess side plays
episodes, the table's ratio is guess's rows per second over single's, and the engine's forward passes are timed inside
the sampling."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "episodes.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_episodes", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_both_sides_train_128_rows_a_step_and_the_table_compares_them(bench, capsys):
    sides = bench.main(["--skip", "1", "--steps", "1", "trainer.warmup.steps=0"])  # its smallest: one step measured
    single, guess = sides
    assert [len(s.walls) for s in sides] == [1, 1] and all(s.rows_per_s() > 0 for s in sides)
    assert guess.rows[0]["env/turns_mean"] >= 1 and "env/turns_mean" not in single.rows[0]
    assert [s.rows[0]["batch_size"] * s.rows[0]["group_size"] for s in sides] == [bench.ROWS] * 2
    text = bench.table(sides)
    assert text in capsys.readouterr().out
    wall = float(re.search(r"guess / single: ([0-9.]+)× \(wall\)", text).group(1))
    assert wall == pytest.approx(guess.rows_per_s() / single.rows_per_s(), abs=0.006)
    assert text.splitlines()[1].split()[0] == "single" and text.splitlines()[2].split()[0] == "guess"
    for s in sides:  # the engine's forward passes are timed within the sampling, never the training's
        assert 0 < s.forward_s[0] < s.rows[0]["sample_time_s"]
    swapped = float(re.search(r"as long as single's .*: ([0-9.]+)×", text).group(1))
    rollout = {s.name: s.rows[0]["sample_time_s"] + s.rows[0]["score_time_s"] for s in sides}
    assert swapped == pytest.approx(single.walls[0] / (guess.walls[0] - rollout["guess"] + rollout["single"]),
                                    abs=0.006)
