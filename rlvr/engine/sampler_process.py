"""engine=pytorch sampling in a process of its own, beside the trainer (trainer.off_policy_steps ≥ 1 on a CPU).

Why a process. Sampling ahead of training runs in a thread (rlvr/overlap.py). A model's kernels release Python's
GIL, but a small model's decoding on a CPU is mostly Python (a step's matrices are small), and so is the trainer's
side: in one process the two take turns at the interpreter lock and overlap only in part (bench/overlap.py). Here
the sampler thread hands each `sample` call to a worker process and waits on a pipe, which releases the lock.

The weights are not sent. The module the engine samples from (its copy of the policy, or that copy's merged LoRA
model) is moved to shared memory, then the worker is forked: it holds the same module on the same memory. The
trainer changes those weights only in `sync`, in its main thread, while the sampler is idle (rlvr/overlap.py), so
a call is sampled from exactly the weights it was made with. Each call sends its prompts, settings and seeds, and
gets the `Rollouts` back; the worker runs `PyTorchEngine.sample` (or, for an episode's turn, `Turns.sample` with the
episodes' KV caches it keeps: `WorkerTurns`) on the shared module, on one torch thread: its
draws are bit for bit those of the same engine in a trainer's process of one thread (`threads: auto` on 2 cores),
and equal up to float summation order on more.

Why fork. A spawned interpreter would import torch and transformers again before its first step (about 7 s on the
2-core machine); a forked one starts at once. It is forked from the main thread before the sampler thread starts,
and touches nothing but the module, its pipe and torch (as a DataLoader's forked workers do), on one thread: GNU
OpenMP does not survive a fork, and a forked process that starts a team of threads hangs
(tests/engine/test_sampler_process.py forks from a trainer of two threads). The price is memory: the pages are
shared copy-on-write, so each one the trainer writes after the fork (its trainable weights; their gradients and
optimizer state when a warm-up made them before) is then held twice. On a GPU the sampler stays a thread.

Stops. The worker ignores SIGINT, SIGTERM and SIGUSR1 (blocked from its first instruction: they are blocked in the
starting thread while it forks): a stop signal sent to every process of a job (Ctrl-C, SLURM) is the trainer's to
handle, and the trainer still needs the worker to finish the step it samples before it checkpoints. The worker ends
when the trainer closes the pipe, at the latest when the trainer's process ends (SIGKILL included: the pipe closes).
"""

from __future__ import annotations

import atexit
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from torch import nn

torch = lazy_import("torch")

STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
"""The signals the trainer handles (rlvr/preemption.py); the worker ignores them."""


class SamplerProcess:
    """`sample` calls of an engine=pytorch engine, made in a worker process on `module`'s shared weights."""

    def __init__(self, module: nn.Module, engine: Callable[[nn.Module], Any]) -> None:
        """`engine(module)`: the engine the worker samples with (engine=pytorch's, on the shared module)."""
        import multiprocessing

        module.share_memory()  # in place: every module holding these tensors (the engine's source) keeps them
        ctx = multiprocessing.get_context("fork")  # module docstring: why fork
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(theirs, self.conn, module, engine), name="rlvr-sampler",
                                   daemon=True)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the worker would write what was buffered again when it ends
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # inherited by the worker; here, delivered later
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        theirs.close()
        atexit.register(self.close)  # before multiprocessing's own exit hook, which would wait on a daemon forever

    def sample(self, *args: Any) -> Any:
        """The worker's engine's `sample(*args)`."""
        return self.call("sample", args)

    def turn_sampler(self) -> WorkerTurns:
        """The worker's engine's `turn_sampler()`: the episodes' KV caches stay in the worker between turns."""
        return WorkerTurns(self)

    def call(self, method: str, args: tuple) -> Any:
        """What the worker answers to `method` (`serve`) called with `args`."""
        try:
            self.conn.send_bytes(pickle.dumps((method, args)))
            ok, result = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as err:
            self.process.join(timeout=5)
            raise RuntimeError(f"engine=pytorch's sampler process (pid {self.process.pid}) ended, exit code "
                               f"{self.process.exitcode}") from err
        if not ok:
            raise RuntimeError(f"engine=pytorch's sampler process failed:\n{result}")
        return result

    def close(self) -> None:
        """End the worker: the closed pipe ends its loop; one that does not end soon is killed."""
        atexit.unregister(self.close)
        self.conn.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class WorkerTurns:
    """A played batch's turns (`PyTorchEngine.turn_sampler`, rlvr/engine/pytorch.py `Turns`) sampled in the worker,
    which keeps the episodes' KV caches from one turn to the next until `close`. The weights do not change while a
    batch is played (the trainer syncs between steps, the sampler idle), so the caches stay valid."""

    def __init__(self, process: SamplerProcess) -> None:
        self.process = process

    def sample(self, *args: Any) -> Any:
        """The worker's `Turns.sample(*args)`."""
        return self.process.call("turn", args)

    def close(self) -> None:
        """The worker frees the caches (nothing to free where the worker has ended: its error was raised)."""
        if self.process.process.is_alive():
            self.process.call("close_turns", ())


def serve(conn: Connection, trainers: Connection, module: nn.Module, build: Callable[[nn.Module], Any]) -> None:
    """The worker: answer calls until the pipe closes (`trainers`, the trainer's end, is closed here: held open, the
    pipe would not close when the trainer's process ends). A call is `sample`, a turn of a played batch (`turn`:
    that batch's `Turns`, made at its first turn) or the batch's end (`close_turns`)."""
    trainers.close()
    for signum in STOPS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    torch.set_num_threads(1)  # module docstring: an OpenMP team would hang here
    engine = build(module)
    turns = None
    while True:
        try:
            method, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        reply: tuple[bool, Any]
        try:
            if method == "sample":
                reply = (True, engine.sample(*args))
            elif method == "continue":  # partial rollouts' segment (PyTorchEngine.continue_rows)
                reply = (True, engine.continue_rows(*args))
            elif method == "turn":
                turns = turns or engine.turn_sampler()
                reply = (True, turns.sample(*args))
            else:  # close_turns
                if turns is not None:
                    turns.close()
                turns = None
                reply = (True, None)
        except Exception:  # noqa: BLE001 - the trainer raises it, with this traceback
            reply = (False, traceback.format_exc())
        try:
            conn.send_bytes(pickle.dumps(reply))
        except OSError:
            return
