"""The SLURM launcher (conf/hydra/launcher/slurm.yaml) against a real cluster: a grid is one job array whose
tasks all complete (a task per run, or per pack of runs with hydra.launcher.pack_size); a task stopped mid-run
(requeued by SLURM, or signalled before its time limit)
checkpoints, is started again in the same folder, resumes and logs every step exactly once, and a requeue in
the middle of a long step loses no more than that step; the preset's GPU request on this GPU-less cluster is
refused before anything is submitted, naming the overrides that then run.

Skipped unless a cluster answers: `bash launchers/ci-slurm.sh` starts one under $SLURM_TEST_ROOT
(default /tmp/rlvr-slurm). The tests take 7-150 s each (~6.5 min in all), mostly job start-up and requeue delays.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from composing import OVERLAP

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "launchers" / "slurm-cluster.sh"
TINY_RUN = ["trainer.warmup.steps=0", "data.eval_size=32", "trainer.eval_every=0", "threads=1",
            "trainer.max_skipped_steps=0"]  # untrained, every group ties: these runs time steps, not learning
TINY_JOB = [  # what one run needs on the single-node test cluster
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=10",
    "hydra.launcher.gpus_per_task=null",
    "hydra.launcher.signal_delay_s=30",
]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment of a client of the dev cluster (SLURM_CONF set), or skip saying why there is none."""
    env = {**os.environ, "SLURM_TEST_ROOT": os.environ.get("SLURM_TEST_ROOT", "/tmp/rlvr-slurm")}
    try:
        exports = subprocess.run(["bash", str(CLUSTER), "env"], env=env, capture_output=True, text=True, timeout=10)
        env["SLURM_CONF"] = exports.stdout.strip().removeprefix("export SLURM_CONF=")
        if not Path(env["SLURM_CONF"]).is_file():
            pytest.skip(f"no SLURM cluster: {env['SLURM_CONF']} does not exist (start one: bash launchers/ci-slurm.sh)")
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"no SLURM cluster answers: {error}")
    if sinfo.returncode != 0 or not sinfo.stdout.strip():
        pytest.skip(
            f"no SLURM cluster answers (sinfo: {sinfo.stderr.strip()[-200:]}); start: bash launchers/ci-slurm.sh"
        )
    return env


def submit(env: dict[str, str], sweep_dir: Path, name: str, *overrides: str) -> subprocess.Popen:
    """`train.py --multirun ... hydra/launcher=slurm` in the background; it returns when every task is done."""
    command = [
        sys.executable,
        "train.py",
        "--multirun",
        "hydra/launcher=slurm",
        *TINY_RUN,
        *TINY_JOB,
        f"hydra.launcher.name={name}",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]
    with open(sweep_dir.parent / f"{name}.log", "w") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def launcher_output(sweep_dir: Path, name: str) -> str:
    return (sweep_dir.parent / f"{name}.log").read_text()


def cancel(env: dict[str, str], name: str, process: subprocess.Popen) -> None:
    """Leave nothing behind: cancel the jobs called `name`, stop the launcher."""
    subprocess.run(["scancel", "--name", name], env=env, capture_output=True, timeout=30)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def training_steps(run_dir: Path) -> list[int]:
    """The `step` of every training row of metrics.jsonl, in order (evaluation rows carry eval/accuracy)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["step"] for row in rows if "eval/accuracy" not in row]


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}
"""sacct states after which an allocation changes no more (REQUEUED is followed by another allocation)."""


def assert_requeued_then_completed(env: dict[str, str], job_id: str, deadline: float) -> None:
    """Once sacct shows the job ended: its last allocation COMPLETED, after at least one REQUEUED."""
    states = wait_until(
        lambda: (s := sacct_states(env, job_id)) and s[-1].split("|")[1].split(" ")[0] in ENDED and s,
        deadline,
        f"sacct to show {job_id} ended",
    )
    assert states[-1].endswith("|COMPLETED"), states
    assert any(s.endswith("|REQUEUED") for s in states[:-1]), states


def sacct_states(env: dict[str, str], job_id: str) -> list[str]:
    """`JobID|State` of every allocation of the job (array), including earlier attempts of requeued ones."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "JobID,State"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def wait_until(condition, deadline: float, what: str, poll_s: float = 0.5):
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def running_task_id(env: dict[str, str], name: str, task: int) -> str:
    """SLURM_JOB_ID of array task `task` of the job called `name`, once it runs ('' until then); every array
    task has its own, which scontrol/scancel/sacct accept. A sweep of one run is a plain job (task `N/A`)."""
    out = subprocess.run(
        ["squeue", "-h", "-n", name, "-t", "R", "-o", "%A %K"], env=env, capture_output=True, text=True, timeout=30
    )
    tasks = {array_task.replace("N/A", "0"): job for job, array_task in map(str.split, out.stdout.splitlines())}
    return tasks.get(str(task), "")


def test_grid_is_one_job_array_and_every_run_completes(slurm_env, tmp_path):
    name = f"rlvr-grid-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "sweep"
    deadline = time.monotonic() + 120
    process = submit(slurm_env, sweep, name, "seed=0,1", "trainer.max_steps=3")
    try:
        process.wait(timeout=deadline - time.monotonic())
        output = launcher_output(sweep, name)
        assert process.returncode == 0, output[-3000:]
        # one array: one submission script, with --array=0-1, and the two tasks <array id>_0, <array id>_1
        scripts = list((sweep / ".submitit").glob("*/*_submission.sh"))
        assert len(scripts) == 1, scripts
        assert "#SBATCH --array=0-1%" in scripts[0].read_text()
        array_id = scripts[0].parent.name
        assert sorted(p.name for p in (sweep / ".submitit").glob(f"{array_id}_*")) == [f"{array_id}_0", f"{array_id}_1"]
        for run in ("0", "1"):
            assert training_steps(sweep / run) == [0, 1, 2]
            assert json.loads((sweep / run / "summary.json").read_text())["steps"] == 3
        # accounting lags the job by a moment
        states = wait_until(
            lambda: (
                (s := sacct_states(slurm_env, array_id))
                and all(x.endswith("|COMPLETED") for x in s)
                and len(s) == 2
                and s
            ),
            deadline,
            f"sacct to show {array_id} done",
        )
        assert sorted(states) == [f"{array_id}_0|COMPLETED", f"{array_id}_1|COMPLETED"]
    finally:
        cancel(slurm_env, name, process)


def test_a_packed_grid_is_one_task_per_pack(slurm_env, tmp_path):
    """hydra.launcher.pack_size=2: a grid of 4 runs is an array of 2 tasks, each the cells of one process
    (rlvr/launcher/packed.py), each run an ordinary run folder that says which pack it ran in."""
    name = f"rlvr-packs-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "sweep"
    deadline = time.monotonic() + 180
    process = submit(slurm_env, sweep, name, "condition=grpo,maxrl", "seed=0,1", "trainer.max_steps=3",
                     "hydra.launcher.pack_size=2")
    try:
        process.wait(timeout=deadline - time.monotonic())
        output = launcher_output(sweep, name)
        assert process.returncode == 0, output[-3000:]
        assert "pack 1 of 2 (a task): jobs 0, 1" in output and "pack 2 of 2 (a task): jobs 2, 3" in output
        scripts = list((sweep / ".submitit").glob("*/*_submission.sh"))
        assert len(scripts) == 1 and "#SBATCH --array=0-1%" in scripts[0].read_text()
        for run in range(4):
            status = json.loads((sweep / str(run) / "status.json").read_text())
            assert status["state"] == "finished" and training_steps(sweep / str(run)) == [0, 1, 2]
            assert status["pack"].startswith(f"{run // 2 + 1} of 2: jobs {run - run % 2}, {run - run % 2 + 1} ")
            assert status["slurm_array_task_id"] == str(run // 2)
    finally:
        cancel(slurm_env, name, process)


@pytest.mark.parametrize("stop", ["scontrol-requeue", "time-limit-signal"])
def test_a_stopped_task_is_requeued_and_resumes_without_repeating_a_step(slurm_env, tmp_path, stop):
    """scontrol-requeue: SLURM sends SIGTERM and requeues the task itself (as on preemption).
    time-limit-signal: SIGUSR1 to the job step, which SLURM sends `signal_delay_s` before the time limit; the
    run checkpoints and exits 75, and the batch script's trap (slurm.yaml `setup`) requeues it; those runs also
    sample a step ahead of training (trainer.off_policy_steps=1, docs/overlap.md), so what was sampled and not yet
    trained travels in the checkpoint."""
    name = f"rlvr-requeue-{uuid.uuid4().hex[:8]}"
    sweep, steps = tmp_path / "sweep", 150  # ~0.08 s a step with a checkpoint every 2: ~12 s of training
    deadline = time.monotonic() + 150
    ahead = ["trainer.off_policy_steps=1", *OVERLAP] if stop == "time-limit-signal" else []
    process = submit(slurm_env, sweep, name, "seed=0,1", f"trainer.max_steps={steps}", "trainer.save_every=2",
                     *ahead)
    try:
        run = sweep / "0"
        wait_until(
            lambda: len(training_steps(run)) >= 10 and (run / "checkpoints" / "latest").exists(),
            deadline,
            "the run to pass step 10 with a checkpoint",
        )
        job_id = wait_until(lambda: running_task_id(slurm_env, name, 0), deadline, "squeue to show task 0")
        signal = ["scontrol", "requeue", job_id] if stop == "scontrol-requeue" else ["scancel", "--signal=USR1", job_id]
        subprocess.run(signal, env=slurm_env, check=True, timeout=30)
        stopped_at = len(training_steps(run))
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        output = launcher_output(sweep, name)
        assert process.returncode == 0, output[-3000:]
        assert stopped_at < steps, "the run ended before it was stopped; make it longer"
        assert training_steps(run) == list(range(steps))  # every step once, in order
        assert training_steps(sweep / "1") == list(range(steps))  # the other task ran undisturbed
        assert json.loads((run / "summary.json").read_text())["steps"] == steps
        assert "resumed from" in (run / "train.log").read_text()
        trained = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
        assert [r.get("async/policy_version") for r in trained] == ([0, *range(steps - 1)] if ahead else [None] * steps)
        assert_requeued_then_completed(slurm_env, job_id, deadline)
    finally:
        cancel(slurm_env, name, process)


def test_a_task_at_its_time_limit_checkpoints_requeues_itself_and_finishes(slurm_env, tmp_path):
    """A real time limit: 2 min per attempt, SIGUSR1 45 s before it, which SLURM may send up to 60 s early (man
    sbatch) and checks every 30 s: it comes 15-75 s in. (With the 1-min limit this test had, it once came 1 s in,
    before Python had a handler; the pre-submit check now refuses that.) The run needs more training than the
    first attempt can give it (600 steps at 0.14-0.25 s, a verifier that waits 0.1 s a step: slow_reward.py), so
    the task checkpoints and requeues itself via the trap. Once the first attempt has the signal, the job's limit
    is raised to 10 min (`scontrol update`), so the requeued attempt resumes and finishes however slow the machine
    (with short limits a busy machine needed more attempts than max_num_timeout allows)."""
    name = f"rlvr-timelimit-{uuid.uuid4().hex[:8]}"
    sweep, steps = tmp_path / "sweep", 600  # the first attempt trains at most ~65 s: ≤ 470 steps
    deadline = time.monotonic() + 480
    env = {**slurm_env, "PYTHONPATH": str(Path(__file__).parent)}
    process = submit(
        env,
        sweep,
        name,
        "seed=0",
        f"trainer.max_steps={steps}",
        "trainer.save_every=10",
        "reward=function",
        "reward.function=slow_reward.exact_after_a_pause",
        "hydra.launcher.timeout_min=2",
        "hydra.launcher.signal_delay_s=45",
    )
    try:
        run = sweep / "0"
        wait_until(lambda: (run / "train.log").is_file() and "SIGUSR1 received" in (run / "train.log").read_text(),
                   deadline, "the time limit's SIGUSR1")
        job_id = next((sweep / ".submitit").glob("*/*_submission.sh")).parent.name
        wait_until(lambda: subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], env=slurm_env,
                                          capture_output=True, timeout=30).returncode == 0,
                   deadline, f"scontrol to raise {job_id}'s time limit", poll_s=1.0)  # refused while it completes
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        output = launcher_output(sweep, name)
        assert process.returncode == 0, output[-3000:]
        assert training_steps(run) == list(range(steps))
        assert "SIGUSR1 received" in (run / "train.log").read_text()
        assert "resumed from" in (run / "train.log").read_text()
        assert "rlvr: exit 75, requeueing" in (sweep / ".submitit" / job_id / f"{job_id}_0_log.out").read_text()
        assert_requeued_then_completed(slurm_env, job_id, deadline)
    finally:
        cancel(slurm_env, name, process)


def test_smoke_campaign_is_one_array_with_stable_folders_and_slurm_ids_in_the_manifest(slurm_env, tmp_path):
    name = f"rlvr-campaign-{uuid.uuid4().hex[:6]}"
    sweep = tmp_path / "smoke"
    process = subprocess.Popen(
        [sys.executable, "train.py", "campaign=smoke", "hydra/launcher=slurm", *TINY_RUN, *TINY_JOB,
         "trainer.max_steps=2", f"hydra.launcher.name={name}", f"hydra.sweep.dir={sweep}"],
        cwd=REPO, env=slurm_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert process.wait(timeout=180) == 0
        manifest = json.loads((sweep / "manifest.json").read_text())
        runs = manifest["runs"]
        assert sorted((r["condition"], r["seed"]) for r in runs) == [
            ("grpo", "0"), ("grpo", "1"), ("maxrl_gtpo_sepa", "0"), ("maxrl_gtpo_sepa", "1")]
        assert {r["state"] for r in runs} == {"finished"}
        assert len({r["slurm_job_id"] for r in runs}) == 1  # one job array
        assert sorted(r["slurm_array_task_id"] for r in runs) == ["0", "1", "2", "3"]
        for r in runs:
            assert (sweep / r["condition"] / f"seed={r['seed']}" / "summary.json").is_file()
    finally:
        cancel(slurm_env, name, process)


def test_a_requeue_in_the_middle_of_a_long_step_loses_at_most_that_step(slurm_env, tmp_path):
    """`scontrol requeue` while a 6 s step runs (slow_reward.py), with no periodic checkpoint: SLURM sends SIGTERM,
    and SIGKILL KillWait seconds later (slurm.conf; launchers/slurm-cluster.sh). The run must finish the step,
    checkpoint and exit 75 in between, so the requeued task resumes where it was stopped: at most one step
    is done twice (none when the step in flight completes). With KillWait=5 the run was killed mid-step and
    started again from step 0."""
    name = f"rlvr-killwait-{uuid.uuid4().hex[:8]}"
    sweep, steps = tmp_path / "sweep", 4
    deadline = time.monotonic() + 240
    env = {**slurm_env, "PYTHONPATH": str(Path(__file__).parent)}
    process = submit(env, sweep, name, "seed=0", f"trainer.max_steps={steps}", "trainer.save_every=0",
                     "reward=function", "reward.function=slow_reward.exact_after_a_long_pause")
    try:
        run = sweep / "0"
        wait_until(lambda: len(training_steps(run)) >= 2, deadline, "the run to finish two steps")
        job_id = wait_until(lambda: running_task_id(slurm_env, name, 0), deadline, "squeue to show the task")
        done = len(training_steps(run))  # steps finished when the signal comes; the next one is in flight
        subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, timeout=30)
        requeued = time.monotonic()
        checkpoint = wait_until(lambda: next(run.glob("checkpoints/step_*"), None), deadline, "the stop checkpoint")
        stopped_after = time.monotonic() - requeued
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert process.returncode == 0, launcher_output(sweep, name)[-3000:]
        log = (run / "train.log").read_text()
        resumed = re.search(r"resumed from \S+: (\d+) steps done", log)
        assert "SIGTERM received" in log and resumed, log[-3000:]
        assert done - int(resumed.group(1)) <= 1, (done, resumed.group(0), checkpoint)  # steps lost by the requeue
        assert training_steps(run) == list(range(steps))  # every step once, in order
        assert stopped_after < 60, stopped_after  # the checkpoint came before KillWait's SIGKILL would have
        assert_requeued_then_completed(slurm_env, job_id, deadline)
    finally:
        cancel(slurm_env, name, process)


def test_the_gpu_preset_on_a_cluster_without_gpus_is_refused_before_submission_then_the_named_overrides_run(
        slurm_env, tmp_path):
    """The preset as it is (`gpus_per_task: 1`, 8 CPUs, 64 GB) on the dev cluster (no GRES, 4 slots, ~20 GB): the
    command stops before sbatch, exit status 2, no traceback, no sweep folder, no job; the overrides it names
    then submit a grid that completes."""
    name = f"rlvr-gres-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "sweep"
    command = [sys.executable, "train.py", "--multirun", "hydra/launcher=slurm", "seed=0,1", *TINY_RUN,
               "trainer.max_steps=2", f"hydra.launcher.name={name}", f"hydra.sweep.dir={sweep}"]
    refused = subprocess.run(command, cwd=REPO, env=slurm_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr and "sbatch" not in refused.stdout
    lines = refused.stderr.splitlines()
    assert "  hydra.launcher.gpus_per_task=1: no node of partition debug has a GPU (sinfo GRES: (null))" in lines
    advice = "rlvr: to submit, add: "
    fixes = next(line for line in lines if line.startswith(advice)).removeprefix(advice).split()
    assert fixes[0] == "hydra.launcher.gpus_per_task=null", fixes
    assert not sweep.exists()
    assert not subprocess.run(["sacct", "-n", "-X", "--name", name], env=slurm_env, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    process = subprocess.Popen([*command, *fixes], cwd=REPO, env=slurm_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0, output[-3000:]
        assert training_steps(sweep / "0") == [0, 1] and training_steps(sweep / "1") == [0, 1]
    finally:
        cancel(slurm_env, name, process)


def test_doctor_reports_what_the_preset_asks_for_that_the_cluster_lacks(slurm_env):
    """`rlvr doctor hydra/launcher=slurm`: the same problems, from the same function, one line each."""
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli.main", "doctor", "hydra/launcher=slurm"], cwd=REPO,
                          env={**slurm_env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    needs = proc.stdout.partition("` needs")[2].splitlines()
    assert ("  missing  hydra/launcher=slurm   hydra.launcher.gpus_per_task=1: no node of partition debug has a GPU "
            "(sinfo GRES: (null)); add hydra.launcher.gpus_per_task=null") in needs, needs
    assert any(line.startswith("  missing  hydra/launcher=slurm   hydra.launcher.mem_gb=64") for line in needs)
    fixed = subprocess.run([sys.executable, "-m", "rlvr.cli.main", "doctor", "hydra/launcher=slurm", *TINY_JOB],
                           cwd=REPO, env={**slurm_env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                           timeout=300)
    assert fixed.returncode == 0, fixed.stdout
    assert re.search(r"^  ok +hydra/launcher=slurm +sinfo answers", fixed.stdout, re.M), fixed.stdout
