"""A SLURM job of several tasks (`hydra.launcher.tasks_per_node=2`, conf/hydra/launcher/slurm.yaml) is ONE
distributed run with backend=fsdp (rlvr/distributed.py reads srun's SLURM_PROCID/SLURM_NTASKS): both tasks
train, rank 0 writes the run folder and each rank its checkpoint shard. A task that dies ends the job at once
(srun --kill-on-bad-exit, set by the preset), and a job stopped before its time limit requeues itself and
resumes with both tasks.

The job tests are skipped unless the dev cluster answers (`bash launchers/ci-slurm.sh`), as in
tests/launchers/test_slurm.py, whose helpers they use. A 2-task job takes 2 of the dev node's slots (1 CPU per
task); the tests take ~15 s (completes), ~25 s (a task dies) and ~50 s (requeue), mostly start-up. The
first tests, of what a task reads from srun's environment (rlvr.distributed.World.from_env), need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from launchers.test_slurm import (
    REPO,
    assert_requeued_then_completed,
    cancel,
    launcher_output,
    running_task_id,
    sacct_states,
    slurm_env,  # noqa: F401 - the dev cluster's fixture, which two_task_env asks for
    submit,
    training_steps,
    wait_until,
)

from rlvr.distributed import PORT_BASE, World

TWO_TASKS = ["hydra.launcher.tasks_per_node=2", "backend=fsdp"]
SRUN_TASK = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
             "SLURM_JOB_NODELIST": "node[03-04]"}
"""What srun gives task 3 of a 2 tasks × 2 nodes job: the second task of its node, node04."""


@pytest.mark.parametrize("visible,gpu", [
    (None, 1),          # no GPU (the dev cluster), or GPUs SLURM does not manage: the task's index on its node
    ("0,1", 1),         # `gres: gpu:2`: every task of the node sees both GPUs
    ("1", 0),           # `gpus_per_task: 1`: the task sees its own GPU only, as cuda:0
])
def test_an_srun_task_is_its_rank_of_the_step_on_its_own_gpu_with_the_first_node_as_rendezvous(visible, gpu):
    env = {**SRUN_TASK, **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
    assert World.from_env(env) == World(rank=3, size=4, local_rank=gpu)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node03", str(PORT_BASE + 123456 % 20_000))


def test_a_one_task_job_is_a_plain_run_and_a_given_rendezvous_is_kept():
    one = {**SRUN_TASK, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert World.from_env(one) == World.single() and "MASTER_ADDR" not in one
    chosen = {**SRUN_TASK, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}  # set in the preset's `setup`, say
    World.from_env(chosen)
    assert (chosen["MASTER_ADDR"], chosen["MASTER_PORT"]) == ("10.0.0.7", "29500")


@pytest.fixture(scope="module")
def two_task_env(slurm_env: dict[str, str]) -> dict[str, str]:  # noqa: F811 - the fixture imported above
    """The dev cluster's client environment, where its node has the 2 slots a 2-task job needs (else skip)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], env=slurm_env, capture_output=True, text=True, timeout=30)
    cpus = max((int(c) for c in out.stdout.split() if c.isdigit()), default=0)
    if cpus < 2:
        pytest.skip(f"the SLURM cluster's nodes have {cpus} CPUs; a 2-task job needs 2 (SLURM_TEST_CPUS)")
    return slurm_env


def job_folder(sweep: Path) -> Path:
    """submitit's folder of the sweep's one job: <sweep>/.submitit/<job id>/ (logs, pickles, the sbatch script)."""
    return next((sweep / ".submitit").glob("*/*_submission.sh")).parent


def test_a_two_task_job_is_one_distributed_run_that_completes(two_task_env, tmp_path):
    name = f"rlvr-dist-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "sweep"
    process = submit(two_task_env, sweep, name, *TWO_TASKS, "seed=0", "trainer.max_steps=3")
    try:
        process.wait(timeout=180)  # ~10 s on an idle dev cluster; more while other tests' jobs hold its slots
        assert process.returncode == 0, launcher_output(sweep, name)[-3000:]
        run, job = sweep / "0", job_folder(sweep)
        assert "#SBATCH --ntasks-per-node=2" in (job / f"{job.name}_submission.sh").read_text()
        assert training_steps(run) == [0, 1, 2]
        final = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
        assert final.name == "step_3" and json.loads((final / "trainer_state.json").read_text())["final"]
        assert sorted(p.name for p in (final / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
        assert json.loads((run / "status.json").read_text())["state"] == "finished"
        status = subprocess.run([sys.executable, "-m", "rlvr.cli.main", "status", str(run)], cwd=REPO,
                                env={**two_task_env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                                timeout=120)
        assert status.returncode == 0 and "1 runs: 1 finished" in status.stdout, status.stdout + status.stderr
        # both tasks took part in one world of 2: rank 0 says so, and each task left its result
        assert "rank 0 of 2 (local rank 0)" in (job / f"{job.name}_0_log.out").read_text()
        assert sorted(p.name for p in job.glob("*_result.pkl")) == [f"{job.name}_0_result.pkl",
                                                                    f"{job.name}_1_result.pkl"]
        step = wait_until(lambda: srun_step(two_task_env, job.name), time.monotonic() + 60,
                          f"sacct to show step {job.name}.0")
        assert step.split("|")[2] == "2", step  # srun's step had 2 tasks
    finally:
        cancel(two_task_env, name, process)


def test_a_task_that_dies_ends_the_other_and_the_job_fails_without_a_requeue(two_task_env, tmp_path):
    """SIGKILL to rank 1 in the middle of training: srun ends the step at once (--kill-on-bad-exit: "Terminating
    StepId", which srun does not do without it) and the job FAILS, not requeued (its exit status is not 75). (The
    command then fails naming task 1, once submitit next asks sacct: up to half the job's age later, so this test
    does not wait for it.)"""
    name = f"rlvr-dist-kill-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "sweep"
    deadline = time.monotonic() + 180
    process = submit(two_task_env, sweep, name, *TWO_TASKS, "seed=0", "trainer.max_steps=2000", "trainer.save_every=0")
    try:
        run = sweep / "0"
        wait_until(lambda: len(training_steps(run)) >= 3, deadline, "the run to pass step 3")
        job_id = wait_until(lambda: running_task_id(two_task_env, name, 0), deadline, "squeue to show the job")
        os.kill(task_pid(job_id, rank=1), signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not running_task_id(two_task_env, name, 0), deadline, "the job to end")
        assert time.monotonic() - killed < 30  # far below the collectives' timeout (backend.timeout_s: 600 s)
        log = (job_folder(sweep) / f"{job_id}_0_log.err").read_text()
        assert f"Terminating StepId={job_id}.0" in log, log[-3000:]
        assert "requeueing" not in (job_folder(sweep) / f"{job_id}_0_log.out").read_text()
        states = wait_until(lambda: (s := sacct_states(two_task_env, job_id)) and not s[-1].endswith("|RUNNING") and s,
                            deadline, f"sacct to show {job_id} ended")
        assert states == [f"{job_id}|FAILED"], states
        assert training_steps(run)[-1] < 1999  # it did not finish
    finally:
        cancel(two_task_env, name, process)


def test_a_two_task_job_signalled_before_its_time_limit_requeues_itself_and_resumes(two_task_env, tmp_path):
    """SIGUSR1 (what SLURM sends `signal_delay_s` before the time limit) reaches both tasks; they stop at the same
    step, write one checkpoint with a shard each and exit 75; srun exits 75, the batch script's trap requeues
    the job, both tasks start again in the same folder and resume: every step logged once."""
    name = f"rlvr-dist-requeue-{uuid.uuid4().hex[:8]}"
    sweep, steps = tmp_path / "sweep", 80  # 0.05-0.15 s a step: 4-12 s of training
    deadline = time.monotonic() + 240
    process = submit(two_task_env, sweep, name, *TWO_TASKS, "seed=0", f"trainer.max_steps={steps}",
                     "trainer.save_every=10")
    try:
        run = sweep / "0"
        wait_until(lambda: len(training_steps(run)) >= 10 and (run / "checkpoints" / "latest").exists(), deadline,
                   "the run to pass step 10 with a checkpoint")
        job_id = wait_until(lambda: running_task_id(two_task_env, name, 0), deadline, "squeue to show the job")
        subprocess.run(["scancel", "--signal=USR1", job_id], env=two_task_env, check=True, timeout=30)
        stopped_at = len(training_steps(run))
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        output = launcher_output(sweep, name)
        assert process.returncode == 0, output[-3000:]
        assert stopped_at < steps, "the run ended before it was stopped; make it longer"
        assert training_steps(run) == list(range(steps))  # every step once, in order
        log = (run / "train.log").read_text()
        assert "SIGUSR1 received" in log and "resumed from" in log, log[-3000:]
        job = job_folder(sweep)
        assert "rlvr: exit 75, requeueing" in (job / f"{job_id}_0_log.out").read_text()  # the trap, after srun's 75
        stops = [re.search(r"stopped by SIGUSR1 after step (\d+)", (job / f"{job_id}_{rank}_log.err").read_text())
                 for rank in (0, 1)]
        assert all(stops) and stops[0].group(1) == stops[1].group(1), stops  # both ranks, at the same step
        assert json.loads((run / "status.json").read_text())["state"] == "finished"
        assert_requeued_then_completed(two_task_env, job_id, deadline)
    finally:
        cancel(two_task_env, name, process)


def srun_step(env: dict[str, str], job_id: str) -> str:
    """`<job id>.0|State|NTasks` of the job's srun step ('' until accounting has it; its state lags the job's)."""
    out = subprocess.run(["sacct", "-n", "-P", "-j", f"{job_id}.0", "-o", "JobID,State,NTasks"], env=env,
                         capture_output=True, text=True, timeout=30)
    rows = out.stdout.splitlines()
    return rows[-1] if rows else ""


def task_pid(job_id: str, rank: int) -> int:
    """The pid of task `rank`'s Python process of job `job_id` on this machine (the dev cluster's one node)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:  # gone, or not a process
            continue
        if (Path(argv[0].decode()).name.startswith("python") and b"submitit.core._submit" in argv
                and f"SLURM_JOB_ID={job_id}".encode() in environ and f"SLURM_PROCID={rank}".encode() in environ):
            return int(proc.name)
    raise AssertionError(f"no Python process of task {rank} of job {job_id} on this machine")
