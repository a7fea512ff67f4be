"""`python train.py trainer=discover` on the tiny model (rlvr/discover/source.py): a short run asserted many ways, and a
run killed mid-way and continued, whose archive equals the uninterrupted run's."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.checkpoint import Checkpoints
from rlvr.outputs import NONDETERMINISTIC_KEYS

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
# B = 4 starts × G = 4 completions: 16 children a step; cap max(64, 2·4·4, 1) = 64, reached at step 3 (1 + 4·16 = 65)
ARGS = ["trainer=discover", f"trainer.max_steps={STEPS}", "trainer.batch_size=4", "trainer.group_size=4",
        "trainer.save_every=2", "trainer.log_every=1", "data.archive_max_entries=1",
        "threads=1"]


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "train.py", *ARGS, f"hydra.run.dir={run_dir}"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_archive(run_dir: Path) -> dict:
    return Checkpoints.read_state(Checkpoints(run_dir / "checkpoints", 0).latest())["data"]


def train(run_dir: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(run_dir), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("discover")
    train(run_dir)
    return run_dir


def test_a_short_run_grows_prunes_and_reports_its_archive(reference):
    steps = rows(reference)
    assert [r["step"] for r in steps] == list(range(STEPS)) and all("loss" in r for r in steps)
    assert [r["discover/archive_size"] for r in steps] == [17, 33, 49, 64, 64, 64]  # 1 + 16·(s + 1), cut at 64
    best = [r["discover/best_reward"] for r in steps]
    assert best == sorted(best) and best[0] > 0  # never decreasing; the untrained model hits some numbers
    assert steps[0]["discover/start_state_mean_reward"] == 0.0  # the first step starts from the root alone
    assert all(r["discover/max_depth"] >= 1 for r in steps) and "discover_beta" in steps[0]  # discover_entropic
    top = json.loads((reference / "archive_top.json").read_text())
    assert top["best_reward"] == best[-1] and top["archive_size"] == 64
    assert [e["reward"] for e in top["entries"]] == sorted((e["reward"] for e in top["entries"]), reverse=True)
    archive = final_archive(reference)
    assert len(archive["entries"]) == 64 and archive["best_reward"] == best[-1]
    assert archive["next_id"] == 1 + STEPS * 16
    # the step's prompts are memory blocks: the root's "=" first, then "<other>+<percent>+…<start>="
    first = json.loads((reference / "samples" / "step_000000.jsonl").read_text().splitlines()[0])
    later = json.loads((reference / "samples" / "step_000005.jsonl").read_text().splitlines()[0])
    assert first["prompt"] == "=" and later["prompt"].endswith("=") and "+" in later["prompt"]
    assert first["reference"] == "4729"


def test_a_killed_run_continues_with_the_same_archive(reference, tmp_path):
    proc = subprocess.Popen(command(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=os.environ.copy())
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # killed once step 3 is logged: step 2 saved
        metrics = tmp_path / "metrics.jsonl"
        if metrics.exists() and sum('"loss"' in line for line in metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    resumed = train(tmp_path)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert final_archive(tmp_path) == final_archive(reference)

    def comparable(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows(run_dir)]

    assert comparable(tmp_path) == comparable(reference)
