"""How a run starts, continues and ends, as a user meets it with the default folder (issue 21):

- the same command continues an interrupted run (Ctrl-C, a kill), found from its composed config; a finished run
  is not continued (the same command starts a new one); `resume=never` starts a new one and says where;
- a run that cannot learn fails (status `failed`, exit 1) naming why: every step skipped, every reward failed;
- a stop signal while a verifier hangs drops the step and checkpoints the steps done, and the run continues
  exactly; a second signal exits at once but never leaves status.json `running`.

The runs are the tiny model without a warm-up (seconds each), started from a temporary folder so that the default
`outputs/` lands there."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.checkpoint import Checkpoints
from rlvr.errors import RunFailed
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.preemption import INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE
from rlvr.run import run

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["trainer.warmup.steps=0", "trainer.max_skipped_steps=0", "trainer.eval_every=0", "trainer.log_every=1",
         "data.eval_size=32", "threads=1"]
"""No warm-up (the untrained model's rewards all tie: skipped steps, allowed here), a small held-out set."""


def train_py(cwd: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *QUICK, *overrides]


def start(argv: list[str], cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def wait_for(condition, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, "the run ended before the test could act"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def train_rows(folder: Path) -> list[dict]:
    """The training rows written so far: a line the run is still writing is not one yet."""
    text = (folder / "metrics.jsonl").read_text()
    return [r for r in map(json.loads, text[:text.rfind("\n") + 1].splitlines()) if "loss" in r]


def run_folders(cwd: Path) -> list[Path]:
    """The runs of the command, none while Hydra is still making the folders above them."""
    label = cwd / "outputs" / "arithmetic-exact-tiny" / "grpo+none"
    return sorted(label.iterdir()) if label.exists() else []


def test_the_same_command_continues_an_interrupted_run_and_starts_a_new_one_after_a_finished_run(tmp_path):
    argv = train_py(tmp_path, ["trainer.max_steps=40"])
    proc = start(argv, tmp_path, tmp_path / "first.log")
    wait_for(lambda: any((f / "metrics.jsonl").exists() and len(train_rows(f)) >= 3 for f in run_folders(tmp_path)),
             proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == INTERRUPT_EXIT_CODE
    first = (tmp_path / "first.log").read_text()
    [folder] = run_folders(tmp_path)
    done = len(train_rows(folder))
    assert f"continue with: python {' '.join(argv[1:])}" in first, first[-2000:]  # the command, as typed
    assert json.loads((folder / "status.json").read_text())["state"] == "preempted"
    stopped_wall = Checkpoints.read_state(folder / "checkpoints" / f"step_{done}")["progress"]["wall_seconds"]

    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing the interrupted run in {folder}" in again.stdout + again.stderr
    assert run_folders(tmp_path) == [folder]  # Hydra's new folder for the second command was not left behind
    assert [r["step"] for r in train_rows(folder)] == list(range(40))  # every step once
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["resumed_from_step"] == done and summary["condition"] == "grpo+none"
    assert summary["wall_seconds"] > stopped_wall  # the whole run's time, not only the last segment's
    assert "resumed from" in (folder / "train.log").read_text()  # the log goes on in the run's own folder

    # a finished run is not continued: the same command is a new run; so is resume=never, which says where
    assert subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=600).returncode == 0
    assert len(run_folders(tmp_path)) == 2
    never = subprocess.run(argv + ["resume=never"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert never.returncode == 0 and len(run_folders(tmp_path)) == 3
    assert "resume=never: a new run in" in never.stdout + never.stderr


def test_the_same_command_continues_a_killed_run(tmp_path):
    argv = train_py(tmp_path, ["trainer.max_steps=12", "trainer.save_every=2"])
    proc = start(argv, tmp_path, tmp_path / "log")
    wait_for(lambda: any((f / "checkpoints" / "step_4").exists() for f in run_folders(tmp_path)), proc)
    proc.kill()
    proc.wait()
    [folder] = run_folders(tmp_path)
    assert json.loads((folder / "status.json").read_text())["state"] == "running"  # SIGKILL: nobody could say
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_folders(tmp_path) == [folder] and [r["step"] for r in train_rows(folder)] == list(range(12))


def test_a_run_whose_steps_all_tie_fails_naming_why(tmp_path):
    cfg = compose_config(QUICK + ["trainer.max_skipped_steps=3", "trainer.max_steps=10", "reward=function",
                                  "reward.function=interrupt_rewards.scores_nothing"])
    with pytest.raises(RunFailed) as err:
        run(cfg, tmp_path)
    assert "nothing to train on 3 consecutive steps (trainer.max_skipped_steps=3): every completion scored 0.0" in (
        str(err.value))
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "failed" and "trainer.max_skipped_steps=3" in status["reason"]
    assert Checkpoints.read_state(tmp_path / "checkpoints" / "step_3")["step"] == 3  # kept: it can be continued


def test_a_verifier_that_fails_on_every_item_fails_the_run(tmp_path):
    cfg = compose_config(QUICK + ["reward=function", "reward.function=interrupt_rewards.always_raises",
                                  "trainer.max_steps=10"])
    with pytest.raises(RunFailed) as err:
        run(cfg, tmp_path)
    assert "every item's scoring failed (errors or timeouts) on 5 consecutive steps (trainer.max_failed_steps=5)" in (
        str(err.value))
    assert [r["reward/error_frac"] for r in train_rows(tmp_path)] == [1.0] * 5
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "failed"


def test_a_failed_run_exits_1_with_its_reason_and_no_traceback(tmp_path):
    proc = subprocess.run(train_py(tmp_path, ["trainer.max_skipped_steps=2", "trainer.max_steps=5"]), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "rlvr: run failed: nothing to train on 2 consecutive steps" in proc.stderr


def comparable(folder: Path) -> list[dict]:
    rows = map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows]


def test_a_stop_while_the_verifier_hangs_drops_the_step_and_the_run_continues_exactly(tmp_path):
    hang = ["reward=function", "reward.function=interrupt_rewards.hangs_when_flagged", "reward.timeout_s=600",
            "trainer.max_steps=8", "trainer.sampling.temperature=2.0"]
    env = {"RLVR_TEST_HANG": str(tmp_path / "hang"), "PYTHONPATH": str(ROOT / "tests")}
    reference = subprocess.run(train_py(tmp_path, [*hang, f"hydra.run.dir={tmp_path / 'reference'}"]), cwd=ROOT,
                               capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert reference.returncode == 0, reference.stderr[-3000:]

    folder = tmp_path / "run"
    argv = train_py(tmp_path, [*hang, f"hydra.run.dir={folder}"])
    proc = start(argv, ROOT, tmp_path / "log", env)
    wait_for(lambda: (folder / "metrics.jsonl").exists() and len(train_rows(folder)) >= 3, proc)
    (tmp_path / "hang").touch()  # the next scoring hangs
    wait_for(lambda: (tmp_path / "hang.hanging").exists(), proc)
    time.sleep(0.5)
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == REQUEUE_EXIT_CODE
    assert time.monotonic() - stopped_at < 60  # bounded, although the verifier would hang for ever
    log = (tmp_path / "log").read_text()
    done = len(train_rows(folder))
    assert f"while scoring step {done + 1} (dropped); checkpoint of the {done} steps done saved" in log, log[-3000:]
    assert json.loads((folder / "status.json").read_text())["state"] == "preempted"

    (tmp_path / "hang").unlink()
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert again.returncode == 0, again.stderr[-3000:]
    assert comparable(folder) == comparable(tmp_path / "reference")  # the dropped step was sampled again, alike


def test_a_second_signal_exits_at_once_and_marks_the_run(tmp_path):
    folder = tmp_path / "run"
    argv = train_py(tmp_path, ["trainer.warmup.steps=400", "trainer.warmup.cache_dir=null",
                               f"hydra.run.dir={folder}"])
    proc = start(argv, ROOT, tmp_path / "log")
    wait_for(lambda: (folder / "warmup.jsonl").exists() and (folder / "warmup.jsonl").read_text().count("\n") >= 2,
             proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGUSR1)  # another kind: two of one kind may merge while the first is pending (and
    # pending signals are delivered lowest number first, so SIGUSR1 may be the first)
    proc.wait(timeout=120)
    log = (tmp_path / "log").read_text()
    assert "received: stopping the SFT warm-up: nothing is saved" in log  # what a first signal does now
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "preempted" and "second stop signal" in status["reason"], status


def test_a_refused_run_leaves_nothing_under_outputs(tmp_path):
    proc = subprocess.run(train_py(tmp_path, ["trainer.sampling.temperature=0"]), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "trainer.sampling.temperature=0 samples greedily" in proc.stderr
    assert list((tmp_path / "outputs").iterdir()) == []  # not even the empty <task>/<label>/ folders


def test_evaluation_can_be_turned_off(tmp_path):
    summary = run(compose_config(QUICK + ["trainer.max_steps=2", "trainer.evaluate=false"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and not any("eval/accuracy" in r for r in rows)
    assert summary["eval_accuracy_initial"] is summary["eval_accuracy_final"] is summary["eval_accuracy_best"] is None
