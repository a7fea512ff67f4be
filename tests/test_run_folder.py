"""A run folder belongs to one run (issue 37, requirements 1-3), as a user meets it through train.py:

- a refused relaunch (another seed on a finished run's folder) leaves every byte of the folder as it was; a resumed
  one keeps Hydra's `.hydra/` record and appends its segment to `resumes.jsonl`;
- one writer per folder: a second process on a running run's folder exits 2 at once naming the first one's pid and
  host; after a SIGKILL the lock is gone with the process, and the same command continues the run;
- `hydra.run.dir=''`, the checkout or $HOME are refused with exit 2, nothing written;
- "the same command continues" adopts only a run of the whole same config that has a checkpoint.

The runs are the tiny model without a warm-up (seconds each), in a temporary folder."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.cli.runs import load_run

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["trainer.warmup.steps=0", "trainer.max_skipped_steps=0", "trainer.eval_every=0", "data.eval_size=32",
         "threads=1"]
CONFIG_ERROR = 2


def train(cwd: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *QUICK, *overrides], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) → its bytes' hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-step run in `<tmp>/run`."""
    cwd = tmp_path_factory.mktemp("finished")
    done = train(cwd, "trainer.max_steps=3", "hydra.run.dir=run")
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd


def test_a_refused_relaunch_leaves_every_byte_of_the_folder_as_it_was(finished):
    folder = finished / "run"
    before = fingerprint(folder)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "train.log", ".lock"} <= set(before)
    refused = train(finished, "trainer.max_steps=3", "hydra.run.dir=run", "seed=1")
    assert refused.returncode == CONFIG_ERROR, refused.stderr[-3000:]
    assert "these keys differ from the checkpoint's config: seed" in refused.stderr
    assert fingerprint(folder) == before
    assert "seed: 0" in (folder / ".hydra" / "config.yaml").read_text()


def test_a_resumed_run_keeps_its_record_and_appends_its_segment(finished, tmp_path):
    folder = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished / "run"), str(folder)], check=True)
    record = {name: digest for name, digest in fingerprint(folder).items() if name.startswith(".hydra/")}
    log_before = (folder / "train.log").read_text()
    more = train(tmp_path, "trainer.max_steps=5", "hydra.run.dir=run")
    assert more.returncode == 0, more.stderr[-3000:]
    assert {n: d for n, d in fingerprint(folder).items() if n.startswith(".hydra/")} == record
    [segment] = [json.loads(line) for line in (folder / "resumes.jsonl").read_text().splitlines()]
    assert segment["from_step"] == 3 and segment["changed"] == {"trainer.max_steps": [3, 5]}
    assert "trainer.max_steps=5" in segment["overrides"] and segment["pid"] != json.loads(
        (finished / "run" / ".lock").read_text())["pid"]
    log = (folder / "train.log").read_text()
    assert log.startswith(log_before) and f"continuing the run in {folder} from step 3" in log
    assert f"continuing the run in {folder} from step 3" in more.stdout  # and on the console


def test_one_writer_per_folder_and_no_stale_lock_after_a_kill(tmp_path):
    argv = [sys.executable, str(ROOT / "train.py"), *QUICK, "trainer.max_steps=400", "trainer.save_every=1",
            "hydra.run.dir=run"]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    folder = tmp_path / "run"
    try:
        deadline = time.monotonic() + 300
        while not (folder / "checkpoints" / "step_2").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        second = train(tmp_path, "trainer.max_steps=400", "trainer.save_every=1", "hydra.run.dir=run")
        assert second.returncode == CONFIG_ERROR, second.stderr[-3000:]
        assert f"run folder {folder} is in use by pid {first.pid} on host " in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first run goes on
        assert load_run(folder).state() == "running"  # rlvr status: its lock is held
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert json.loads((folder / "status.json").read_text())["state"] == "running"  # SIGKILL: nobody could say
    assert load_run(folder).state() == "dead"  # the lock went with the process
    done = int((folder / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    again = train(tmp_path, f"trainer.max_steps={done + 2}", "hydra.run.dir=run")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing the run in {folder} from step {done}" in again.stdout
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(done + 2))  # every step once


@pytest.mark.parametrize("run_dir", ["''", "ROOT", "HOME"])
def test_a_folder_that_is_not_a_runs_own_is_refused(tmp_path, run_dir):
    run_dir = {"ROOT": str(ROOT), "HOME": str(Path.home())}.get(run_dir, run_dir)
    before = sorted(p.name for p in tmp_path.iterdir())
    refused = train(tmp_path, "trainer.max_steps=1", f"hydra.run.dir={run_dir}", timeout=120)
    assert refused.returncode == CONFIG_ERROR, refused.stderr[-3000:]
    assert "a run needs a folder of its own" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (ROOT / "metrics.jsonl").exists() and not (ROOT / "status.json").exists()


def test_the_same_command_continues_only_a_run_of_its_whole_config_with_a_checkpoint(tmp_path):
    """The issue's case: a `trainer.max_steps=150` command took over a `threads=… trainer.max_steps=1` run stopped
    in its warm-up. Here: a run of other bookkeeping keys, and a run stopped before its first checkpoint, are left
    alone (the first named in the log, with how to continue it); the same command's own stopped run is continued."""
    label = tmp_path / "outputs" / "arithmetic-exact-tiny" / "grpo+none"

    def stopped_run(*overrides: str, checkpoint: bool) -> Path:
        out = train(tmp_path, *overrides)
        assert out.returncode == 0, out.stderr[-3000:]
        folder = max(label.iterdir(), key=lambda p: p.stat().st_mtime)
        status = json.loads((folder / "status.json").read_text())
        (folder / "status.json").write_text(json.dumps({**status, "state": "preempted"}))  # as a stop leaves it
        if not checkpoint:
            subprocess.run(["rm", "-rf", str(folder / "checkpoints")], check=True)
        return folder

    other = stopped_run("trainer.max_steps=2", "trainer.log_every=2", checkpoint=True)
    early = stopped_run("trainer.max_steps=2", checkpoint=False)
    time.sleep(1.1)  # Hydra's folder names are to the second
    new = train(tmp_path, "trainer.max_steps=2")
    assert new.returncode == 0, new.stderr[-3000:]
    assert "- continuing the interrupted run" not in new.stdout
    assert f"not continuing the interrupted run in {other}: this command differs from it in trainer.log_every" in (
        new.stdout)
    assert len(list(label.iterdir())) == 3 and json.loads((early / "status.json").read_text())["state"] == "preempted"
    mine = stopped_run("trainer.max_steps=3", checkpoint=True)
    again = train(tmp_path, "trainer.max_steps=3")
    assert again.returncode == 0 and f"continuing the interrupted run in {mine}" in again.stdout


def test_a_forked_child_does_not_keep_a_killed_runs_folder_locked(tmp_path):
    """The sampler's worker and reward pools are forked from the run: one that outlives its SIGKILLed parent must not
    hold the folder (a flock is shared by every copy of the descriptor)."""
    from rlvr.folder_lock import FolderLock, is_held

    parent = os.fork()
    if parent == 0:  # the run: takes the lock, forks a worker, waits to be killed
        FolderLock.take(tmp_path).claim()
        if os.fork() == 0:
            time.sleep(20)
            os._exit(0)
        time.sleep(60)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not is_held(tmp_path):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(parent, signal.SIGKILL)
    os.waitpid(parent, 0)
    assert is_held(tmp_path) is False  # the worker lives on, the lock went with the run
