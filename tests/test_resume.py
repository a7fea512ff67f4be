"""A run killed at any moment and started again in its folder ends with exactly the metrics of a run
that was never interrupted (timing fields aside), and never logs a step twice."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import MIXED, OVERLAP
from rlvr.checkpoint import Checkpoints
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.preemption import INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12
BASE = [
    f"trainer.max_steps={STEPS}", "trainer.save_every=2", "trainer.eval_every=4", "trainer.log_every=1",
    "data.eval_size=64", "threads=1", *MIXED,
]
VARIANTS = {
    "lora": [],
    # full fine-tuning, with DAPO's dynamic sampling: a step draws as many prompts as its rewards ask (groups of 2:
    # half of them tie) and the next step starts where it stopped; overlong punishment and filtering on the untrained
    # policy's long rows
    "full_refill": ["model.lora=null", "trainer.lr=1e-4", "trainer.dynamic_sampling=refill", "trainer.group_size=2",
                    "trainer.overlong.buffer_frac=0.5", "trainer.overlong.filter=true"],
    # auto λ and a gate that opens mid-run: the controller's state matters after a resume
    "sepa": ["condition=maxrl_gtpo_sepa", "transform.schedule.kind=auto", "transform.schedule.warmup_sequences=16",
             "transform.schedule.delay_steps=0", "transform.schedule.correct_rate_gate=0.5"],
    # multi-turn episodes: the games are a function of the data stream's position, the sampling of the step;
    # tl_grpo's branch probes of the step's seed, its EMA baseline in the checkpoint
    "guess": ["env=guess", "turn_credit=tl_grpo", "trainer.sampling.max_tokens=2", "trainer.eval_max_tokens=2"],
    # sampling ahead of training (rlvr/overlap.py): the steps sampled but not trained are checkpoint state
    "ahead": ["trainer.off_policy_steps=2", *OVERLAP],
    # partial rollouts (rlvr/rollout/partial.py): the groups in flight, their tokens' versions, are checkpoint state
    "partial": ["trainer.off_policy_steps=4", "trainer.partial_rollouts=true", *OVERLAP],
    # self-distillation: the policy's EMA re-prompted with a sibling that succeeded (a second pass; the EMA of the
    # weights is checkpoint state)
    "sdpo": ["condition=sdpo"],
    "ahead_guess": ["env=guess", "trainer.sampling.max_tokens=2", "trainer.eval_max_tokens=2",
                    "trainer.off_policy_steps=1", *OVERLAP],
}


def command(run_dir, overrides):
    return [sys.executable, "train.py", *BASE, *overrides, f"hydra.run.dir={run_dir}"]


def train(run_dir, overrides, env=None):
    proc = subprocess.run(command(run_dir, overrides), cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    proc.output = proc.stdout + proc.stderr  # Hydra logs to stdout, errors go to stderr
    return proc


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(run_dir):
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows(run_dir)]


def kill_after(run_dir, overrides, steps_done):
    """Start a run and SIGKILL it once `steps_done` training rows are on disk."""
    proc = subprocess.Popen(command(run_dir, overrides), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and sum('"loss"' in line for line in metrics.read_text().splitlines()) >= steps_done:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run per variant."""
    out = {}
    for name, overrides in VARIANTS.items():
        run_dir = tmp_path_factory.mktemp(f"reference-{name}")
        proc = train(run_dir, overrides)
        assert proc.returncode == 0, proc.output[-3000:]
        out[name] = comparable(run_dir)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_killed_at_a_random_step_then_resumed_is_exact(variant, reference, tmp_path):
    at = random.Random().randint(1, STEPS - 2)
    kill_after(tmp_path, VARIANTS[variant], at)
    checkpoint = Checkpoints(tmp_path / "checkpoints", 0).latest()  # the kill may land before the next one
    proc = train(tmp_path, VARIANTS[variant])
    assert proc.returncode == 0, proc.output[-3000:]
    assert ("resumed from" in proc.output) == (checkpoint is not None), f"killed after {at} steps"
    assert comparable(tmp_path) == reference[variant], f"killed after {at} steps"
    steps = [r["step"] for r in rows(tmp_path) if "loss" in r]
    assert steps == list(range(STEPS)), "a step is missing or logged twice"


def test_refill_steps_train_batch_size_groups_that_differ(reference):
    steps = [r for r in reference["full_refill"] if "loss" in r]
    assert all(r["reward_uniform_groups"] == 0 and r["dynamic/kept_groups"] == r["batch_size"] == 8 for r in steps)
    drawn = sum(r["dynamic/prompts"] for r in steps)
    assert drawn == 8 * sum(r["dynamic/sample_batches"] for r in steps) > 8 * STEPS  # some steps drew again
    assert any(r["overlong/punished_frac"] > 0 for r in steps) and any(r["overlong/filtered_frac"] > 0 for r in steps)


def test_killed_while_writing_a_checkpoint_then_resumed_is_exact(reference, tmp_path):
    # RLVR_FAULT kills the process inside its 3rd checkpoint write, after the weights, before the state
    died = train(tmp_path, [], env={"RLVR_FAULT": "checkpoint:3"})
    assert died.returncode == -signal.SIGKILL
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_4"
    assert list((tmp_path / "checkpoints").glob(".step_6.tmp"))  # the half-written one
    proc = train(tmp_path, [])
    assert proc.returncode == 0, proc.output[-3000:]
    assert comparable(tmp_path) == reference["lora"]
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


def sigterm_after_step_2(run_dir, overrides=()):
    """Start a run (stderr piped) and send it SIGTERM once its step 2 is logged."""
    proc = subprocess.Popen(command(run_dir, list(overrides)), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and '"step": 2,' in metrics.read_text()):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    return proc


@pytest.mark.parametrize("variant", ["lora", "ahead"])
def test_stop_signal_checkpoints_and_asks_for_a_requeue(reference, tmp_path, variant):
    proc = sigterm_after_step_2(tmp_path, VARIANTS[variant])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    latest = Checkpoints(tmp_path / "checkpoints", 0).latest()
    state = Checkpoints.read_state(latest)
    assert state["step"] == max(r["step"] + 1 for r in rows(tmp_path) if "loss" in r)  # the step it was in
    assert (latest / "pending.pt").is_file() == (variant == "ahead"), "the steps sampled ahead are kept"
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "preempted"
    again = train(tmp_path, VARIANTS[variant])
    assert again.returncode == 0, again.output[-3000:]
    assert comparable(tmp_path) == reference[variant]


def test_a_signal_while_a_stopped_run_exits_does_not_change_its_exit_status(tmp_path):
    """In a job of several tasks the first task to exit 75 makes srun SIGTERM the others (--kill-on-bad-exit):
    a task that has checkpointed and is on its way out must still exit 75, or srun exits 143 and the job is not
    requeued. Here the second SIGTERM comes after the run printed that it stopped (Python's shutdown is next)."""
    proc = sigterm_after_step_2(tmp_path)
    err = []
    for line in proc.stderr:  # train.py's last line before sys.exit
        err.append(line)
        if line.startswith("rlvr: stopped by SIGTERM"):
            proc.send_signal(signal.SIGTERM)
            break
    err.append(proc.communicate(timeout=120)[1])
    assert proc.returncode == REQUEUE_EXIT_CODE, "".join(err)[-3000:]


def test_a_stop_signal_while_the_job_is_still_starting_is_not_fatal(tmp_path):
    """SLURM may signal a requeued task while it is still importing torch: the request is remembered and
    acted on after the first step (checkpoint, exit 75), not the default action of SIGUSR1 (death)."""
    proc = subprocess.Popen(command(tmp_path, []), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    while proc.poll() is None and not (tmp_path / "train.log").exists():  # Hydra made the job's log: main is next
        time.sleep(0.01)
    time.sleep(0.3)  # inside main, still importing torch (no training row yet)
    assert not (tmp_path / "metrics.jsonl").exists()
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    assert Checkpoints.read_state(Checkpoints(tmp_path / "checkpoints", 0).latest())["step"] == 1
    assert "SIGUSR1 received" in (tmp_path / "train.log").read_text()


def ctrl_c(argv, run_dir, when, log):
    """Start the command `argv` in its own process group and, once `when(run_dir)` holds, send SIGINT to the whole
    group, as Ctrl-C in a terminal does (the trainer and any grading processes it started)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not when(run_dir):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    return proc.returncode, log.read_text()


def test_ctrl_c_finishes_the_step_checkpoints_and_exits_quietly(tmp_path):
    # reward=math grades in worker processes: Ctrl-C reaches them too, and the step must still be scored
    run_dir = tmp_path / "run"
    math = [sys.executable, "train.py", *(o for o in BASE if o not in MIXED), "trainer.warmup.steps=0", "reward=math",
            "reward.pool_workers=1", f"hydra.run.dir={run_dir}"]
    code, output = ctrl_c(math, run_dir, lambda d: (d / "metrics.jsonl").exists()
                          and '"step": 2,' in (d / "metrics.jsonl").read_text(), tmp_path / "log")
    assert code == INTERRUPT_EXIT_CODE, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    done = max(r["step"] + 1 for r in rows(run_dir) if "loss" in r)
    assert f"stopped by Ctrl-C after step {done}; checkpoint saved" in output
    assert Checkpoints.read_state(Checkpoints(run_dir / "checkpoints", 0).latest())["step"] == done
    assert json.loads((run_dir / "status.json").read_text())["state"] == "preempted"
    again = subprocess.run(math, cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert [r["step"] for r in rows(run_dir) if "loss" in r] == list(range(STEPS))


def test_ctrl_c_during_the_warm_up_stops_at_its_next_step(tmp_path):
    warm = ["trainer.warmup.steps=400", "trainer.warmup.batch_size=16", "trainer.warmup.cache_dir=null"]
    started = lambda d: (d / "warmup.jsonl").exists() and (d / "warmup.jsonl").read_text().count("\n") >= 3  # noqa: E731
    code, output = ctrl_c(command(tmp_path / "run", warm), tmp_path / "run", started, tmp_path / "log")
    assert code == INTERRUPT_EXIT_CODE, output[-3000:]
    assert "Traceback" not in output and "stopped by Ctrl-C during the SFT warm-up" in output, output[-3000:]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "preempted"


def test_resume_must_without_a_checkpoint_fails(tmp_path):
    proc = train(tmp_path / "empty", ["resume=must", "trainer.warmup.steps=0"])
    assert proc.returncode == 2 and "resume=must" in proc.output and "no complete checkpoint" in proc.output
    assert not (tmp_path / "empty").exists()  # nothing half-written left behind


def test_resume_with_a_changed_config_lists_the_keys(tmp_path):
    fast = ["trainer.max_steps=2", "trainer.eval_every=0"]
    assert train(tmp_path, fast).returncode == 0
    proc = train(tmp_path, fast + ["trainer.lr=0.5", "trainer.group_size=4"])
    assert proc.returncode == 2 and "Traceback" not in proc.output
    assert "trainer.group_size, trainer.lr" in proc.output and "resume_allow_changes" in proc.output
    more = train(tmp_path, ["trainer.max_steps=4", "trainer.eval_every=0"])  # more steps is fine
    assert more.returncode == 0, more.output[-3000:]
    assert [r["step"] for r in rows(tmp_path) if "loss" in r] == [0, 1, 2, 3]


def test_resume_never_starts_fresh_in_a_new_folder(tmp_path):
    fast = ["trainer.max_steps=1", "trainer.eval_every=0"]
    run_dir = tmp_path / "run"
    assert train(run_dir, fast).returncode == 0
    before = (run_dir / "metrics.jsonl").read_text()
    assert train(run_dir, fast + ["resume=never"]).returncode == 0
    assert (run_dir / "metrics.jsonl").read_text() == before  # untouched
    assert (tmp_path / "run.1" / "summary.json").is_file() and (tmp_path / "run.1" / ".hydra").is_dir()
