"""Whole runs of backend=fsdp as real processes: `torchrun --nproc-per-node 2 train.py backend=fsdp …` against the
same command as one process (`python train.py backend=fsdp …`, a world of one). The 2-rank run's metrics.jsonl
equals the 1-rank run's but for timing fields and float summation order (each group samples from its own seeded
generator, so the rollouts are the same however the groups are shared); rank 0 alone writes the run folder; a run
resumes from a checkpoint written by another number of processes (2 → 1, 1 → 2) to the metrics of an
uninterrupted run; and a rank killed with SIGKILL takes the run down within a bound instead of hanging it."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.outputs import NONDETERMINISTIC_KEYS

REPO = Path(__file__).resolve().parents[2]
RUN = ["backend=fsdp", "trainer.warmup.steps=0", "trainer.eval_every=2", "trainer.log_every=1", "data.eval_size=32",
       "threads=1", "trainer.save_every=2", "reward=function",
       "reward.function=tests.backpressure.mixed_rewards.parity"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
DEATH_BOUND_S = 60
"""How long the surviving rank may take to exit after its peer died (gloo reports the closed connection at once;
the process-group timeout, backend.timeout_s, bounds a hang)."""


GUESS = ["env=guess", "backend=fsdp", "trainer.warmup.steps=10", "trainer.warmup.cache_dir=null",
         "data.eval_size=16", "trainer.eval_every=2", "trainer.log_every=1", "threads=1"]
"""Multi-turn: the guess game (16 games × 8 episodes a step), after a short warm-up so that the rewards differ."""


def command(processes: int, folder: Path, *extra: str, run: list[str] = RUN) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    return [*(launcher if processes > 1 else [sys.executable]), "train.py", *run, f"hydra.run.dir={folder}", *extra]


def train(processes: int, folder: Path, *extra: str, run: list[str] = RUN) -> None:
    proc = subprocess.run(command(processes, folder, *extra, run=run), cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y)
        for key in set(x) - NONDETERMINISTIC_KEYS:
            if isinstance(x[key], float):
                assert math.isclose(x[key], y[key], rel_tol=1e-5, abs_tol=1e-6), (x["step"], key, x[key], y[key])
            else:
                assert x[key] == y[key], (x["step"], key)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> Path:
    """4 steps as one process: the reference."""
    folder = tmp_path_factory.mktemp("one") / "run"
    train(1, folder, "trainer.max_steps=4")
    return folder


def test_two_ranks_log_what_one_rank_logs_and_rank_0_alone_writes(one_rank, tmp_path):
    folder = tmp_path / "run"
    train(2, folder, "trainer.max_steps=4")
    assert_same_metrics(rows(folder), rows(one_rank))
    assert json.loads((folder / "status.json").read_text())["state"] == "finished"
    log = (folder / "train.log").read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" not in log, "rank 1 logs warnings only, and not to train.log"
    shards = sorted(p.name for p in (folder / "checkpoints" / "step_4" / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], "each rank wrote its shard"
    assert (folder / "checkpoints" / "step_4" / "adapter_model.safetensors").is_file(), "rank 0 wrote the adapter"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "no second folder from rank 1's Hydra"


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
def test_a_run_resumes_on_another_number_of_processes(one_rank, tmp_path, first, then):
    folder = tmp_path / "run"
    train(first, folder, "trainer.max_steps=2")
    train(then, folder, "trainer.max_steps=4")
    assert_same_metrics(rows(folder), rows(one_rank))
    state = json.loads((folder / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and json.loads((folder / "summary.json").read_text())["resumed_from_step"] == 2


def test_a_killed_rank_takes_the_run_down_within_the_bound(tmp_path):
    folder = tmp_path / "run"
    proc = subprocess.Popen(command(2, folder, "trainer.max_steps=100000", "trainer.save_every=0"), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline, metrics = time.monotonic() + 120, folder / "metrics.jsonl"  # counted in whole lines
        while not (metrics.is_file() and metrics.read_text().count("\n") > 3) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, "the run is training"
        victim = rank_pid(proc.pid, 1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=DEATH_BOUND_S + 30)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own session, never pytest's group
    assert proc.returncode != 0 and took < DEATH_BOUND_S, (proc.returncode, took)
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "failed" and "remote worker" in status["reason"], status


def usr1_to_rank_1(argv: list[str], env: dict, ready, settle_s: float = 0.0) -> str:
    """Start a 2-rank run in its own session; once `ready()` (within 120 s) and `settle_s` later, send SIGUSR1 to
    rank 1 alone; return the run's stderr once it ended (within 120 s). A run still going is killed with its
    session, never pytest's process group."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run is still going when rank 1 is signalled"
        time.sleep(settle_s)
        os.kill(rank_pid(proc.pid, 1), signal.SIGUSR1)
        return proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of torchrun's worker of `rank` (its environment says RANK=<rank>)."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no worker of rank {rank} under torchrun (pid {launcher})")


def test_a_stop_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SLURM signals every task, but a signal reaching one rank (SIGUSR1 to rank 1 alone, here) must stop them all
    after the same step: they agree at each step boundary, checkpoint together and exit; the same command continues."""
    folder = tmp_path / "run"
    steps = ["trainer.max_steps=30", "trainer.save_every=0", "trainer.eval_every=0"]
    stderr = usr1_to_rank_1(command(2, folder, *steps), ENV,
                            lambda: (folder / "metrics.jsonl").is_file() and len(rows(folder)) > 3)
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "preempted", (status, stderr[-2000:])
    done = int((folder / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert 0 < done < 30 and [r["step"] for r in rows(folder) if "loss" in r] == list(range(done))
    shards = {p.name for p in (folder / "checkpoints" / f"step_{done}" / "dcp").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards, "both ranks wrote their shard of the same step"
    train(2, folder, *steps)
    assert [r["step"] for r in rows(folder) if "loss" in r] == list(range(30))
    assert json.loads((folder / "summary.json").read_text())["resumed_from_step"] == done


def test_a_stop_signal_to_one_rank_while_it_scores_drops_the_evaluation_on_every_rank(one_rank, tmp_path):
    """A stop signal interrupts a wait on the verifier at once (rlvr/preemption.py). The interrupted rank still
    joins the gather, where every rank learns of it and drops the evaluation alike; before, rank 1 went on to
    checkpoint while rank 0 waited in the gather, and both hung. Here the first evaluation hangs on both ranks and
    rank 1 alone gets SIGUSR1; rank 0's verifier times out (reward.timeout_s); both checkpoint the 0 steps done and
    exit. The same command then makes the dropped evaluation first and logs what the uninterrupted run logs."""
    hang, folder = tmp_path / "hang", tmp_path / "run"
    hang.touch()
    steps = ["trainer.max_steps=4", "reward.function=tests.interrupt_rewards.parity_hangs_when_flagged",
             "reward.timeout_s=5"]
    env = {**ENV, "RLVR_TEST_HANG": str(hang)}
    stderr = usr1_to_rank_1(command(2, folder, *steps), env, Path(f"{hang}.hanging.1").exists, settle_s=0.5)
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "preempted", (status, stderr[-2000:])
    assert "while evaluating after step 0 (dropped); checkpoint of the 0 steps done" in status["reason"], status
    hang.unlink()
    proc = subprocess.run(command(2, folder, *steps), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_metrics(rows(folder), rows(one_rank))
    assert json.loads((folder / "summary.json").read_text())["resumed_from_step"] == 0


AHEAD = ["trainer.off_policy_steps=1", "correction=token_tis", "algorithm.loss.correction.pi_old=decoupled",
         "trainer.max_steps=6"]


def test_two_ranks_sample_ahead_as_one_rank_does_and_resume_on_as_many(tmp_path):
    """trainer.off_policy_steps=1 (docs/overlap.md) on 2 ranks: each rank's engine samples its share from a copy of
    its own while the ranks train, syncs between steps (a collective); the rows equal one process's. Killed while
    writing its step-4 checkpoint (RLVR_FAULT), the run continues from step 2, whose checkpoint holds each rank's
    share of step 2, sampled ahead: only on 2 processes (1 is refused, naming why), to the same rows."""
    reference = tmp_path / "one"
    train(1, reference, *AHEAD)
    folder = tmp_path / "run"
    died = subprocess.run(command(2, folder, *AHEAD), cwd=REPO, env={**ENV, "RLVR_FAULT": "checkpoint:2"},
                          capture_output=True, text=True, timeout=300)
    assert died.returncode != 0 and (folder / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert {p.name for p in (folder / "checkpoints" / "step_2").glob("pending*")} == {"pending.pt",
                                                                                      "pending.rank1.pt"}
    refused = subprocess.run(command(1, folder, *AHEAD), cwd=REPO, env=ENV, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0
    assert "holds steps sampled ahead of training by 2 process(es), each its share; continue it on 2 (this run " \
           "has 1)" in refused.stderr, refused.stderr[-2000:]
    train(2, folder, *AHEAD)
    assert_same_metrics(rows(folder), rows(reference))
    assert [r["async/policy_version"] for r in rows(folder) if "loss" in r] == [0, 0, 1, 2, 3, 4]


def test_two_ranks_sample_ahead_in_bounded_mode_syncing_at_the_same_steps(tmp_path):
    """trainer.off_policy_mode=bounded syncs when the sampler is idle, which a rank alone cannot decide (a sync is a
    collective): the ranks vote, and sync only when every sampler is idle. The run ends, within its bound."""
    folder = tmp_path / "run"
    train(2, folder, *AHEAD, "trainer.off_policy_mode=bounded")
    steps = [r for r in rows(folder) if "loss" in r]
    assert [r["step"] for r in steps] == [0, 1, 2, 3, 4, 5]
    assert all(0 <= r["step"] - r["async/policy_version"] == r["async/staleness_max"] <= 1 for r in steps)


PARTIAL = ["trainer.off_policy_steps=2", "trainer.partial_rollouts=true", "correction=token_tis",
           "algorithm.loss.correction.pi_old=decoupled", "trainer.max_steps=6", "trainer.sampling.max_tokens=20",
           "trainer.group_size=2", "trainer.warmup.steps=10", "trainer.warmup.cache_dir=null"]
"""Partial rollouts at k = 2 (docs/overlap.md), after a short warm-up: its policy ends completions at an EOS after
a few tokens or runs on to 20, so a job cuts groups not yet due (the untrained policy runs every row to 20 tokens:
all the groups of a job end together)."""


def test_two_ranks_continue_their_shares_of_partial_rollouts_and_resume_on_as_many(tmp_path):
    """trainer.partial_rollouts=true on 2 ranks: each rank admits its share of every batch and trains its share of
    the step, the first of its groups to complete; the run keeps the bound, its row fields count both ranks' tokens,
    and killed while writing its step-2 checkpoint it continues (each rank from its own pool) to the rows of the run
    never stopped."""
    reference = tmp_path / "whole"
    train(2, reference, *PARTIAL)
    steps = [r for r in rows(reference) if "loss" in r]
    assert [r["step"] for r in steps] == list(range(6)) and all(r["num_datums"] == 16 for r in steps)
    assert all(r["async/staleness_max"] <= min(2, r["step"]) for r in steps)
    assert all(sum(r[f"async/staleness_frac/{d}"] for d in range(3)) == pytest.approx(1.0) for r in steps)
    assert any(r["async/partial_frac"] > 0 for r in steps), "some rows crossed an update"
    folder = tmp_path / "run"
    died = subprocess.run(command(2, folder, *PARTIAL), cwd=REPO, env={**ENV, "RLVR_FAULT": "checkpoint:2"},
                          capture_output=True, text=True, timeout=300)
    assert died.returncode != 0 and (folder / "checkpoints" / "latest").read_text().strip() == "step_2"
    train(2, folder, *PARTIAL)
    assert_same_metrics(rows(folder), rows(reference))


def adapter(folder: Path, step: int) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "checkpoints" / f"step_{step}" / "adapter_model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert float((a[key] - b[key]).abs().max()) <= 1e-5, key


@pytest.fixture(scope="module")
def one_rank_guess(tmp_path_factory) -> Path:
    """3 steps of the guess game as one process: the reference."""
    folder = tmp_path_factory.mktemp("guess") / "run"
    train(1, folder, "trainer.max_steps=3", run=GUESS)
    return folder


def test_two_ranks_play_multi_turn_episodes_as_one_rank_does(one_rank_guess, tmp_path):
    """Each rank plays its share of the games (every episode from its own seeds) and the batch is gathered: the
    2-rank run logs and trains what the 1-rank run does, to float summation order."""
    folder = tmp_path / "run"
    train(2, folder, "trainer.max_steps=3", run=GUESS)
    reference = rows(one_rank_guess)
    assert_same_metrics(rows(folder), reference)
    assert_same_weights(adapter(folder, 3), adapter(one_rank_guess, 3))
    assert any(float(v.abs().max()) > 0 for k, v in adapter(folder, 3).items() if "lora_B" in k), "it trained"
    trained = [r for r in reference if "loss" in r]
    assert len(trained) == 3 and all(r["env/turns_mean"] > 1 for r in trained), "several turns per episode"
    assert len({r["mean_reward"] for r in trained}) > 1 and [r["eval/examples"] for r in reference
                                                             if "eval/examples" in r] == [16, 16, 16]


def test_a_multi_turn_run_resumes_from_two_ranks_on_one(one_rank_guess, tmp_path):
    folder = tmp_path / "run"
    train(2, folder, "trainer.max_steps=2", "trainer.save_every=2", run=GUESS)
    train(1, folder, "trainer.max_steps=3", run=GUESS)
    assert_same_metrics(rows(folder), rows(one_rank_guess))
    assert_same_weights(adapter(folder, 3), adapter(one_rank_guess, 3))


def test_branch_probes_over_two_ranks_value_what_one_rank_does(tmp_path):
    """turn_credit=tl_grpo: each rank probes its own episodes' turns (seeded by each episode's own seed); the
    gathered values, the credit and its running baseline are the 1-rank run's."""
    probes = ["turn_credit=tl_grpo", "trainer.max_steps=2", "trainer.eval_every=0"]
    train(1, tmp_path / "one", *probes, run=GUESS)
    train(2, tmp_path / "two", *probes, run=GUESS)
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert_same_metrics(two, one)
    assert all("env/probe_time_s" in r for r in one if "loss" in r)
    assert_same_weights(adapter(tmp_path / "two", 2), adapter(tmp_path / "one", 2))
