"""engine=pytorch sampling in a worker process beside training (rlvr/engine/sampler_process.py): the draws are the
trainer process's own, the trainer's syncs reach it through shared memory, stop signals do not, and it ends with the
engine or with the trainer's process, SIGKILL included."""

import copy
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rlvr.backend.local import LocalBackend, prepare
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "v_proj", "down_proj"])
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
PARAMS = SamplingParams(1.0, 1.0, 6)
ROOT = Path(__file__).resolve().parents[2]


def trained_and_sampling_copy(merge_lora: bool):
    """The policy the backend trains, and an engine on a copy of its own, as the trainer builds them when it samples
    ahead (rlvr/trainer.py: sampling_copy, local_policy)."""
    model, tok = TINY.load(0)
    own = prepare(copy.deepcopy(model), LORA, 0, gradient_checkpointing=False)
    backend = LocalBackend(model, LORA, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    engine = PyTorchEngine(own, [tok.eos_token_id], tok.pad_token_id, 64, merge_lora)
    return backend, engine


def train_a_little(backend, amount):
    """Stands in for an optimizer step: moves every LoRA B matrix (zero at init)."""
    with torch.no_grad():
        for name, p in backend.policy.named_parameters():
            if "lora_B" in name:
                p.add_(amount)


def draw(engine):
    return engine.sample(PROMPTS, 4, PARAMS, seeds=prompt_seeds(3, len(PROMPTS)), with_entropy=True)


def same(a, b):
    return all(torch.equal(getattr(a, f), getattr(b, f))
               for f in ("tokens_PG_T", "logprobs_PG_T", "mask_PG_T", "finished_PG", "entropy_PG_T"))


@pytest.fixture
def one_thread():
    """The worker decodes on one torch thread: a trainer's process of one draws the same bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_workers_turns_keep_the_episodes_caches_and_draw_what_the_trainers_process_draws(one_thread):
    """Episodes sampled beside training keep their KV caches between turns in the worker (`WorkerTurns`): two turns
    there are bit for bit the two turns of the trainer process's own `Turns` (re-encoding the second turn's contexts
    would change the log-probabilities' float summation order)."""
    backend, engine = trained_and_sampling_copy(merge_lora=True)
    train_a_little(backend, 0.2)
    engine.sync(backend.policy)
    keys = [10, 11, 12]

    def two_turns(turns):
        first = turns.sample(keys, PROMPTS, PARAMS, [5, 6, 7])
        contexts = [p + t[m].tolist() + [13] for p, t, m in zip(PROMPTS, first.tokens_PG_T, first.mask_PG_T,
                                                                  strict=True)]
        second = turns.sample(keys, contexts, PARAMS, [8, 9, 10])
        turns.close()
        return [getattr(r, f) for r in (first, second) for f in ("tokens_PG_T", "logprobs_PG_T", "mask_PG_T")]

    here = two_turns(engine.turn_sampler())
    engine.sample_beside_training(True)
    try:
        turns = engine.turn_sampler()
        assert type(turns).__name__ == "WorkerTurns"
        there = two_turns(turns)
        assert all(torch.equal(a, b) for a, b in zip(here, there, strict=True))
    finally:
        engine.close()


@pytest.mark.parametrize("merge_lora", [True, False])
def test_the_worker_draws_what_the_trainers_process_draws_from_the_weights_of_the_last_sync(merge_lora, one_thread):
    backend, engine = trained_and_sampling_copy(merge_lora)
    train_a_little(backend, 0.2)
    engine.sync(backend.policy)
    here = draw(engine)
    engine.sample_beside_training(True)
    worker = engine.worker.process
    assert worker.pid != os.getpid() and worker.is_alive()
    assert same(draw(engine), here)  # bit for bit: the same module, memory and thread count

    train_a_little(backend, 0.3)  # the trainer trains while the worker holds the old weights...
    assert same(draw(engine), here)
    engine.sync(backend.policy)  # ...which change only at a sync
    moved = draw(engine)
    assert not torch.equal(moved.logprobs_PG_T, here.logprobs_PG_T)

    engine.sample_beside_training(False)
    assert engine.worker is None and not worker.is_alive()
    assert same(draw(engine), moved)  # back in this process, from the same weights


@pytest.mark.parametrize("merge_lora", [True, False])
def test_staged_weights_are_the_ones_of_the_stage_call_and_reach_the_worker_only_when_loaded(merge_lora, one_thread):
    """`stage` copies the trainer's weights as they are (version a); the trainer trains on (version b); the worker
    samples the old weights until `load`, then exactly what a sync at version a would have given."""
    backend, engine = trained_and_sampling_copy(merge_lora)
    reference_backend, reference = trained_and_sampling_copy(merge_lora)
    engine.sample_beside_training(True)
    before = draw(engine)
    for b in (backend, reference_backend):
        train_a_little(b, 0.2)
    reference.sync(reference_backend.policy)
    version_a = draw(reference)

    staged = engine.stage(backend.policy)
    train_a_little(backend, 0.3)  # the trainer goes on: version b
    assert staged.bytes_written == 0
    assert same(draw(engine), before), "nothing changes until the load"
    staged.load()  # in the sampler thread, between jobs
    assert same(draw(engine), version_a)
    engine.close()


def test_the_worker_ignores_stop_signals_and_reports_a_failed_call(one_thread):
    backend, engine = trained_and_sampling_copy(True)
    engine.sample_beside_training(True)
    try:
        here = draw(engine)
        pid = engine.worker.process.pid
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # the trainer's to handle (rlvr/preemption.py)
            os.kill(pid, signum)
        time.sleep(0.2)
        assert engine.worker.process.is_alive() and same(draw(engine), here)
        with pytest.raises(RuntimeError, match=r"sampler process failed:(.|\n)*ValueError"):
            engine.sample(PROMPTS, 4, PARAMS, seeds=[1, 2])  # one seed short
        assert same(draw(engine), here)  # a failed call leaves it serving
    finally:
        engine.close()


def ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"  # unreaped: ended all the same
    except FileNotFoundError:
        return True


def test_a_worker_forked_from_a_trainer_of_two_threads_samples_and_ends_when_the_trainer_is_killed():
    """A trainer of two torch threads has started OpenMP's team before the fork (its own draw): the worker, on one
    thread, still samples (on two it would hang). SIGKILLed, the trainer leaves no worker behind."""
    script = textwrap.dedent("""
        import os, signal, sys, torch
        sys.path.insert(0, sys.argv[1])
        from test_sampler_process import draw, trained_and_sampling_copy
        torch.set_num_threads(2)
        backend, engine = trained_and_sampling_copy(True)
        draw(engine)
        engine.sample_beside_training(True)
        draw(engine)
        print(engine.worker.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while not ended(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended(pid), f"the sampler process {pid} outlived the trainer's"
