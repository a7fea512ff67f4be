"""Sampling ahead of training (rlvr/overlap.py, trainer.off_policy_steps).

The scheduler alone, with a simulated trainer that sleeps (no model, no torch; as SkyRL tests its async generator):
which version each step is sampled from, the bound, the idle fractions, errors, checkpointed jobs. Then real runs:
the rows of a k = 1 run against the synchronous run of the same config, and the settings refused at start. Exact
resume after SIGKILL, single-turn and env=guess: tests/test_resume.py (variants ahead, ahead_guess)."""

import json
import random
import threading
import time

import pytest

from composing import FAST, MIXED, OVERLAP, compose_config
from rlvr.config_check import config_problems
from rlvr.overlap import Job, SampleAhead


class SimulatedTrainer:
    """Steps that sleep `train_s` and bump the version; a sampler that sleeps `sample_s` and records the version
    the engine held when it sampled (the engine's weights change only in `sync`, or, `staged`, in the load that
    `stage` returns)."""

    def __init__(self, k: int, mode: str, steps: int, sample_s, train_s, everywhere=lambda holds: holds,
                 staged: bool | str = False) -> None:
        """`staged`: True, an engine that stages every version; "odd": one that declines the odd ones (None), which
        are then synced (engine=openai under full fine-tuning declines them all)."""
        self.staged = staged
        self.version, self.engine, self.sampling = 0, -1, 0
        self.sample_s, self.train_s, self.steps = sample_s, train_s, steps
        self.lock = threading.Lock()
        self.syncs_while_sampling = 0
        self.stages_while_sampling = 0
        self.ahead = SampleAhead(k, mode, steps, work=lambda step: f"examples of step {step}", sample=self.sample,
                                 sync=self.sync, everywhere=everywhere, stage=self.stage if staged else None)

    def sample(self, job: Job):
        with self.lock:
            self.sampling += 1
        time.sleep(self.sample_s())
        with self.lock:
            self.sampling -= 1
        return {"step": job.step, "engine": self.engine, "work": job.work}

    def sync(self, version: int) -> dict:
        assert version == self.version, "the trainer syncs the weights it holds"
        with self.lock:
            self.syncs_while_sampling += self.sampling
        self.engine = version
        return {"engine/sync_s": 0.0}

    def stage(self, version: int):
        """The weights of `version` copied now (the trainer holds them), the engine's once loaded."""
        assert version == self.version, "the trainer stages the weights it holds"
        if self.staged == "odd" and version % 2:
            return None
        with self.lock:
            self.stages_while_sampling += self.sampling

        def load():
            with self.lock:
                self.syncs_while_sampling += self.sampling
            self.engine = version

        return load, {"engine/sync_s": 0.0}

    def run(self, first: int = 0, restored=(), until=None):
        self.ahead.start(first, list(restored))
        out = []
        for step in range(first, until or self.steps):
            job, fields = self.ahead.next(step)
            out.append((step, job, fields))
            time.sleep(self.train_s())
            self.version += 1
            fields.update(self.ahead.meter())
        return out


@pytest.mark.parametrize("staged", [False, True, "odd"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_fixed_samples_step_n_from_version_n_minus_k_whatever_the_timing(k, staged):
    rng = random.Random(k)
    sim = SimulatedTrainer(k, "fixed", 12, lambda: rng.uniform(0, 0.02), lambda: rng.uniform(0, 0.02),
                           staged=staged)
    rows = sim.run()
    sim.ahead.close()
    for step, job, fields in rows:
        assert job.sampled == {"step": step, "engine": max(0, step - k), "work": f"examples of step {step}"}
        assert job.version == max(0, step - k) == fields["async/policy_version"]
        assert fields["async/staleness_max"] == fields["async/staleness_mean"] == min(step, k)
        assert fields["async/dropped_groups"] == 0
    assert sim.syncs_while_sampling == 0, "the engine's weights never change while it samples"


def test_a_staged_sync_lets_the_trainer_go_on_while_older_steps_sample():
    """k = 2, sampling slower than training. Synced, the trainer waits at every step until the sampler is idle
    before the engine takes the new weights: no sync ever happens while it samples. Staged, the trainer copies
    version n and goes on while the sampler still samples step n + 1 (from version n − 1), which it then loads
    before step n + 2: the same versions, sampled with the trainer never waiting but for its own step."""
    synced = SimulatedTrainer(2, "fixed", 10, lambda: 0.02, lambda: 0.005)
    staged = SimulatedTrainer(2, "fixed", 10, lambda: 0.02, lambda: 0.005, staged=True)
    rows = {}
    for name, sim in (("synced", synced), ("staged", staged)):
        rows[name] = [job.sampled for _, job, _ in sim.run()]
        sim.ahead.close()
    assert rows["synced"] == rows["staged"]
    assert synced.stages_while_sampling == synced.syncs_while_sampling == 0
    assert staged.stages_while_sampling >= 5, "the trainer staged versions while the sampler sampled older ones"
    assert staged.syncs_while_sampling == 0, "a staged load still happens between jobs"


def test_a_failed_staged_load_reaches_the_trainer_and_nothing_after_it_is_sampled():
    sampled = []

    def stage(version):
        def load():
            if version == 2:
                raise OSError("no room for the adapter")
        return load, {}

    ahead = SampleAhead(2, "fixed", 8, work=lambda s: s, sample=lambda job: sampled.append(job.step), sync=lambda v: {},
                        stage=stage)
    ahead.start(0, [])
    with pytest.raises(RuntimeError, match="loading staged weights into the engine failed: OSError"):
        for step in range(8):
            ahead.next(step)
    ahead.close()
    assert 4 not in sampled, "step 4 was to be sampled from version 2, which never loaded"


def test_bounded_takes_the_newest_weights_and_never_exceeds_the_bound():
    rng = random.Random(0)
    sim = SimulatedTrainer(2, "bounded", 30, lambda: rng.choice([0.0, 0.03]), lambda: rng.choice([0.0, 0.01]))
    rows = sim.run()
    sim.ahead.close()
    staleness = [step - job.sampled["engine"] for step, job, _ in rows]
    assert all(0 <= s <= 2 for s in staleness) and [f["async/staleness_max"] for *_, f in rows] == staleness
    assert all(f["async/dropped_groups"] == 0 for *_, f in rows)  # never submitted beyond the bound
    assert sim.syncs_while_sampling == 0


def test_bounded_ranks_sync_alike_when_their_samplers_differ_in_speed():
    """backend=fsdp: a sync is a collective, so every rank must sync at the same steps. Rank 0 samples at once, rank
    1 slowly at random: each step the ranks vote (a barrier stands in for the gather), and they sync only when both
    samplers are idle. Every step is then sampled from the same version on both ranks."""
    votes, barrier = {}, threading.Barrier(2)

    def everywhere(rank):
        def vote(holds):
            votes[rank] = holds
            barrier.wait()
            agreed = all(votes.values())
            barrier.wait()  # both have read the votes before the next vote overwrites them
            return agreed
        return vote

    rng = random.Random(1)
    ranks = [SimulatedTrainer(2, "bounded", 24, sample, lambda: 0.005, everywhere(rank))
             for rank, sample in enumerate([lambda: 0.0, lambda: rng.choice([0.0, 0.02])])]
    results: dict = {}
    threads = [threading.Thread(target=lambda r=r, sim=sim: results.update({r: sim.run()}))
               for r, sim in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for sim in ranks:
        sim.ahead.close()
    versions = [[job.sampled["engine"] for _, job, _ in results[r]] for r in (0, 1)]
    assert len(versions[0]) == 24 and versions[0] == versions[1]
    assert all(0 <= step - v <= 2 for step, v in enumerate(versions[0]))
    assert len(set(versions[0])) > 3  # the versions moved: the slow rank's sampler was idle at some steps


def test_the_idle_fractions_say_which_side_waits():
    """Sampling 4x faster than training: the trainer never waits, the sampler idles ~3/4 of each step; 4x slower:
    the reverse. Bounds are loose (a busy machine stretches sleeps); the order of sides is what is asserted."""
    fast = SimulatedTrainer(1, "fixed", 8, lambda: 0.01, lambda: 0.04)
    slow = SimulatedTrainer(1, "fixed", 8, lambda: 0.04, lambda: 0.01)
    for sim in (fast, slow):
        sim.rows = sim.run()
        sim.ahead.close()
    mid = slice(2, 7)  # the first step waits for step 0's sampling, the last has nothing left to sample
    fast_rows = [f for *_, f in fast.rows[mid]]
    slow_rows = [f for *_, f in slow.rows[mid]]
    assert max(f["async/trainer_idle_frac"] for f in fast_rows) < 0.3 < min(f["async/sampler_idle_frac"]
                                                                             for f in fast_rows)
    assert max(f["async/sampler_idle_frac"] for f in slow_rows) < 0.3 < min(f["async/trainer_idle_frac"]
                                                                             for f in slow_rows)


def test_pending_jobs_continue_a_run_as_if_never_stopped():
    """After 5 steps (k = 2) the jobs of steps 5 and 6 are sampled (from versions 3 and 4) and pending; a new
    scheduler started from them samples the rest exactly as the uninterrupted one did."""
    whole = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    reference = [job.sampled for _, job, _ in whole.run()]
    whole.ahead.close()
    first = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    head = first.run(until=5)
    pending = first.ahead.pending(5)
    first.ahead.close()
    assert [(j.step, j.version) for j in pending] == [(5, 3), (6, 4)]
    second = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    second.version = 5
    tail = second.run(first=5, restored=pending)
    second.ahead.close()
    assert [job.sampled for _, job, _ in head + tail] == reference


def test_a_step_dropped_by_a_stop_continues_with_the_same_syncs():
    """A stop while step 5 scores: next(5) had already synced version 5 and submitted step 7, so the checkpoint of 5
    steps holds steps 5, 6 and 7. The continued run syncs at step 5 all the same (the same weights), so every row
    carries what the uninterrupted run's does (the sync's fields), and step 7 is not sampled twice."""
    whole = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    reference = [(job.sampled, set(fields)) for _, job, fields in whole.run()]
    whole.ahead.close()
    first = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    head = first.run(until=5)
    first.ahead.next(5)  # step 5 taken, then dropped
    pending = first.ahead.pending(5)
    first.ahead.close()
    assert [(j.step, j.version) for j in pending] == [(5, 3), (6, 4), (7, 5)]
    second = SimulatedTrainer(2, "fixed", 10, lambda: 0.0, lambda: 0.0)
    second.version = 5
    tail = second.run(first=5, restored=pending)
    second.ahead.close()
    assert [(job.sampled, set(fields)) for _, job, fields in head + tail] == reference


def test_a_sampling_error_reaches_the_trainer():
    def sample(job):
        if job.step == 2:
            raise ValueError("engine died")
        return job.step

    ahead = SampleAhead(1, "fixed", 5, work=lambda s: s, sample=sample, sync=lambda v: {})
    ahead.start(0, [])
    ahead.next(0)
    ahead.next(1)
    with pytest.raises(RuntimeError, match="sampling step 2 ahead of training failed: ValueError"):
        ahead.next(2)
    ahead.close()


# Real runs: the synchronous loop and k = 1 on one config.

STEPS = ["trainer.max_steps=6", "data.eval_size=16", *FAST, *MIXED, *OVERLAP]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from rlvr.run import run

    out = {}
    for k, mode in ((0, "fixed"), (1, "fixed"), (2, "bounded")):
        folder = tmp_path_factory.mktemp(f"k{k}")
        run(compose_config([*STEPS, f"trainer.off_policy_steps={k}", f"trainer.off_policy_mode={mode}"]), folder)
        out[k] = folder
    out["full"] = tmp_path_factory.mktemp("full")  # all weights trained: the engine samples from a copy of its own
    run(compose_config([*STEPS, "trainer.off_policy_steps=1", "model.lora=null", "trainer.lr=1e-4"]), out["full"])
    return out


def rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_a_run_one_step_off_policy_trains_on_the_same_prompts_from_older_weights(runs):
    sync, ahead = rows(runs[0]), rows(runs[1])
    assert [r["step"] for r in ahead] == list(range(6))
    assert [r["async/policy_version"] for r in ahead] == [0, 0, 1, 2, 3, 4]
    assert [r["async/staleness_max"] for r in ahead] == [0, 1, 1, 1, 1, 1]
    assert all(0 <= r["async/trainer_idle_frac"] <= 1 and 0 <= r["async/sampler_idle_frac"] <= 1 for r in ahead)
    assert not any(k.startswith("async/") for r in sync for k in r), "the synchronous loop's rows are as before"
    # step 0 is the same step in both; later steps sample the same prompts from weights one update older, which
    # the decoupled correction sees: π_old (the trainer's weights) differs from π_engine (the sampler's)
    assert ahead[0]["loss"] == pytest.approx(sync[0]["loss"], abs=1e-7)
    assert ahead[0]["mismatch/kl"] < 1e-6 and all(r["mismatch/kl"] > 10 * ahead[0]["mismatch/kl"] for r in ahead[1:])
    prompts = {k: [json.loads(line)["prompt"] for f in sorted((runs[k] / "samples").iterdir()) for line in f.open()]
               for k in (0, 1)}
    assert prompts[0] and prompts[0] == prompts[1]


def test_full_fine_tuning_samples_ahead_from_the_engines_own_copy(runs):
    """engine=pytorch samples from the trainer's module in the synchronous loop; ahead of training it samples from
    a copy made before the backend wrapped the module, into which each sync copies every trained weight."""
    ahead = rows(runs["full"])
    assert [r["async/policy_version"] for r in ahead] == [0, 0, 1, 2, 3, 4]
    assert ahead[0]["mismatch/kl"] < 1e-6 and all(r["mismatch/kl"] > 10 * ahead[0]["mismatch/kl"] for r in ahead[1:])


def test_a_bounded_run_trains_within_its_bound(runs):
    """k = 2, bounded: which versions depends on timing; that none is more than 2 behind does not."""
    ahead = rows(runs[2])
    assert [r["step"] for r in ahead] == list(range(6))
    assert all(0 <= r["step"] - r["async/policy_version"] == r["async/staleness_max"] <= 2 for r in ahead)
    assert all(r["async/dropped_groups"] == 0 for r in ahead)


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "add correction=token_tis algorithm.loss.correction.pi_old=decoupled"),
    ([*OVERLAP, "backpressure=usl"], "use backpressure=none"),
    ([*OVERLAP, "backend=prime_rl"], "needs the mismatch correction's per-token weights"),  # its loss is its own
    ([*OVERLAP, "engine=vllm", "engine.sleep_level=1"], "use engine.sleep_level=0"),
    ([*OVERLAP, "trainer.off_policy_mode=eager"], "trainer.off_policy_mode='eager': expected fixed or bounded"),
])
def test_what_cannot_overlap_is_refused_at_start_naming_the_setting(overrides, message):
    _, errors = config_problems(compose_config(["trainer.off_policy_steps=1", *overrides]), at_start=False)
    assert any(message in e for e in errors), errors
