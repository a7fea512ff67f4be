"""`hydra/launcher=packed`: each cell of a packed grid writes the very rows its run alone writes (timing fields
aside), single-turn and multi-turn; a cell fails alone; a stop signal checkpoints a pack's cells and starts no
later pack; a pack killed with SIGKILL and launched again resumes every cell to the rows of an uninterrupted pack,
and skips the cells that had finished."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import MIXED
from rlvr.outputs import NONDETERMINISTIC_KEYS

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
BASE = [f"trainer.max_steps={STEPS}", "trainer.save_every=2", "trainer.eval_every=3", "trainer.log_every=1",
        "data.eval_size=64", "threads=1", *MIXED]
GUESS = ["env=guess", "trainer.sampling.max_tokens=2", "trainer.eval_max_tokens=2"]
CONDITIONS, SEEDS = ("grpo", "maxrl"), (0, 1)
JOBS = [(condition, seed) for condition in CONDITIONS for seed in SEEDS]
"""The sweep's jobs in Hydra's order (the last override varies fastest): job number i is JOBS[i]."""


def train(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})
    proc.output = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def packed_grid(sweep_dir: Path, extra: list[str]) -> list[str]:
    return ["--multirun", f"condition={','.join(CONDITIONS)}", f"seed={','.join(map(str, SEEDS))}", *BASE, *extra,
            "hydra/launcher=packed", f"hydra.sweep.dir={sweep_dir}"]


def comparable(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows]


def alone_and_packed(tmp: Path, extra: list[str]) -> tuple[list, Path, str]:
    """The four runs alone (a process each) and the packed grid of the same four: their comparable rows, the
    packed grid's folder, its console output."""
    alone = []
    for condition, seed in JOBS:
        out = tmp / f"alone-{condition}-{seed}"
        proc = train([*BASE, *extra, f"condition={condition}", f"seed={seed}", f"hydra.run.dir={out}"])
        assert proc.returncode == 0, proc.output[-3000:]
        alone.append(comparable(out))
    proc = train(packed_grid(tmp / "packed", extra))
    assert proc.returncode == 0, proc.output[-3000:]
    return alone, tmp / "packed", proc.output


@pytest.fixture(scope="module")
def single_turn(tmp_path_factory):
    return alone_and_packed(tmp_path_factory.mktemp("single_turn"), [])


@pytest.fixture(scope="module")
def guess(tmp_path_factory):
    return alone_and_packed(tmp_path_factory.mktemp("guess"), GUESS)


@pytest.fixture(params=["single_turn", "guess"])
def runs(request):
    """Per variant: the variant, the four runs alone and the packed grid of the same four."""
    return request.param, *request.getfixturevalue(request.param)


def test_each_cell_writes_the_rows_of_its_run_alone(runs):
    variant, alone, packed, output = runs
    for number, rows in enumerate(alone):
        assert comparable(packed / str(number)) == rows, f"{variant}: job {number} {JOBS[number]}"
    assert "pack 1 of 1: jobs 0, 1, 2, 3" in output
    if variant == "single_turn":  # every step's and evaluation's sampling of all four cells in one decoding loop
        requests = len(JOBS) * (STEPS + 3)  # its steps and its 3 evaluations (before, after step 3, after the last)
        assert f"{requests} of {requests} sampling requests decoded together" in output


def test_each_cell_is_an_ordinary_run_folder(runs):
    _, _, packed, _ = runs
    for number, (_, seed) in enumerate(JOBS):
        folder = packed / str(number)
        status = json.loads((folder / "status.json").read_text())
        assert status["state"] == "finished" and status["pack"].startswith("1 of 1: jobs 0, 1, 2, 3 in process ")
        config = (folder / ".hydra" / "config.yaml").read_text()
        assert f"seed: {seed}" in config
        log = (folder / "train.log").read_text()
        assert f"run folder {folder}" in log and f"run folder {packed / str(1 - number % 2)}" not in log
        assert (folder / "checkpoints" / "latest").exists() and (folder / "summary.json").exists()


def test_a_failing_cell_fails_alone(tmp_path):
    proc = train(["--multirun", "trainer.lr=1e-3,1e30", *BASE, "hydra/launcher=packed", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.output[-3000:]
    states = [json.loads((tmp_path / str(n) / "status.json").read_text()) for n in (0, 1)]
    assert states[0]["state"] == "finished"
    assert states[1]["state"] == "failed" and "not finite" in states[1]["reason"]


def signal_after(args: list[str], sweep_dir: Path, rows: int, signum: int) -> subprocess.Popen:
    """Start a packed grid and send it `signum` once its cells have written `rows` training rows in all."""
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        written = [sweep_dir / str(n) / "metrics.jsonl" for n in range(len(JOBS))]
        if sum(f.read_text().count('"loss"') for f in written if f.exists()) >= rows:
            break
        time.sleep(0.02)
    proc.send_signal(signum)
    proc.wait()
    return proc


def test_a_stop_signal_checkpoints_every_cell_and_ends_the_sweep(single_turn, tmp_path):
    alone, _, _ = single_turn
    args = [*packed_grid(tmp_path, []), "hydra.launcher.pack_size=2"]  # jobs 0, 1 then jobs 2, 3
    stopped = signal_after(args, tmp_path, 2 * 2, signal.SIGTERM)  # 2 rows a cell of the first pack
    assert stopped.returncode == 75  # checkpointed: requeue me
    for number in (0, 1):
        status = json.loads((tmp_path / str(number) / "status.json").read_text())
        assert status["state"] == "preempted" and "checkpoint saved" in status["reason"]
    assert not (tmp_path / "2").exists() and not (tmp_path / "3").exists()  # the second pack never started
    again = train(args)
    assert again.returncode == 0, again.output[-3000:]
    for number, rows in enumerate(alone):
        assert comparable(tmp_path / str(number)) == rows, f"job {number}"


def test_a_killed_pack_resumes_every_cell_exactly(single_turn, tmp_path):
    alone, _, _ = single_turn
    args = packed_grid(tmp_path, [])
    at = random.Random().randint(1, len(JOBS) * STEPS - 2)  # training rows written by all cells together
    proc = signal_after(args, tmp_path, at, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, "the pack ended before it could be killed"
    again = train(args)
    assert again.returncode == 0, again.output[-3000:]
    for number, rows in enumerate(alone):
        assert comparable(tmp_path / str(number)) == rows, f"killed after {at} rows: job {number}"
    once_more = train(args)  # every cell finished: nothing to do
    assert once_more.returncode == 0 and once_more.output.count("already finished") == len(JOBS)
