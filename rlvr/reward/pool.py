"""A pool of grading processes with a hard time bound per item, enforced from outside.

A verifier running model output can hang in ways no in-process timeout stops: math-verify's `signal.alarm`
cannot interrupt one long C-level computation (a big-integer power), and a thread cannot be killed. So
each item is graded in a worker process, in that process's main thread (where alarms work), and the
parent watches the clock: a worker that has not answered `item_timeout_s` after it started an item is
killed (SIGKILL, with its process group: whatever it started, a sandbox's subprocess, goes too) and
replaced; that item is reported as a timeout and the items queued behind it go back to the front of the
queue. A worker that dies (out of memory under `memory_mb`, a segfault, `os._exit`) costs its item an error.
A grader returns `(value, status)`, or `(value, status, detail)` where `detail` (a string) says what went
wrong; the pool's own verdicts (a timeout, a dead worker) are `(0.0, status)`.

Scheduling: a worker claims a chunk of at most `chunk_items` consecutive items that share a key (the
trainer's G completions of one prompt share a reference, so the worker parses it once and math-verify's
caches see the repeats: a third less CPU per honest item than dealing items out one by one). Items go to
it one at a time, each as soon as no more than `prefetch_items` of its items are unanswered, so it never
waits for a round trip; answers come back one item at a time, so the time bound is per item. A worker
with nothing left to claim takes the back half of the largest claim not yet sent, so a run of slow items
spreads over the workers instead of holding up one of them while the others idle (as whole chunks sent at
once did: set `prefetch_items` >= `chunk_items` to get that back).

Workers are spawned once, when the first batch comes (each runs `warm_up`, if given, before it takes
work: imports, caches; a `warm_up` that raises stops the pool with `WarmUpFailed`, its error's text in the
message), and live until `close` (or the end of the process); a replacement starts while the others keep
grading. `grade` may be called from any thread, one call at a time.

Interrupted: an exception raised in `grade`'s thread while it waits (a signal handler's: a stop request
that abandons the step) propagates, after the workers still holding items of the abandoned batch are
killed; the next `grade` starts their replacements, and `close` works as ever. No orphans: workers are
daemons (ended at the parent's normal exit), an idle one exits when the parent's end of its pipe closes,
and a busy one checks every second that its parent is alive and exits when it is not (the parent was
SIGKILLed while the worker hung in a call). Being daemons, workers cannot start `multiprocessing`
processes of their own (subprocesses are fine).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

log = logging.getLogger("rlvr")

OK, PARSE_FAIL, TIMEOUT, ERROR = "ok", "parse_fail", "timeout", "error"
"""What happened to an item; a grader returns `(value, one of these)`."""
STARTUP_TIMEOUT_S = 120.0
PARENT_CHECK_S = 1.0
"""How often a worker checks that the process that started it is alive."""


class WorkerStartFailed(RuntimeError):
    """A worker did not start (died, or not ready within STARTUP_TIMEOUT_S); the pool stopped every worker."""


class WarmUpFailed(WorkerStartFailed):
    """A worker's `warm_up` raised; `reason` is its error, as text (its traceback is on the worker's stderr)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"a grading worker failed to start: {reason}")
        self.reason = reason


def _serve(grader: Callable[..., tuple], conn: Connection, memory_mb: int | None,
           warm_up: Callable[[], None] | None, parent_pid: int) -> None:
    """A worker: grade chunks until the parent closes the pipe, answering `(index, value, status[, detail])`
    per item. It leads its own process group (so a kill takes what it started along), and so does not see
    Ctrl-C in a terminal, which the trainer, finishing its step before it stops, needs its graders through;
    it ignores SIGINT too, for a SIGINT sent to the trainer's group by other means."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    if memory_mb:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        if warm_up is not None:
            warm_up()
        greeting: Any = "ready"
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises WarmUpFailed
        traceback.print_exc()
        greeting = ("failed", f"{type(err).__name__}: {err}")
    try:
        conn.send(greeting)
    except OSError:  # the pool closed while this worker was starting
        return
    if greeting != "ready":
        return
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        for index, args in chunk:
            try:
                value, status, *detail = grader(*args)
            except MemoryError:
                value, status, detail = 0.0, ERROR, []
            conn.send((index, float(value), status, *detail))


def _exit_with_parent(parent_pid: int) -> None:
    """In a worker: exit once the parent is gone (SIGKILLed while this worker was stuck in a call, which no
    closed pipe interrupts). A thread, so it runs while a call waits; a call that holds the GIL in one C-level
    computation holds this off until it ends."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


class _Worker:
    def __init__(self, context, grader: Callable, memory_mb: int | None, warm_up: Callable[[], None] | None) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(grader, child, memory_mb, warm_up, os.getpid()),
                                       daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        """It has sent "ready"; until then `deadline` is its start-up deadline."""
        self.outstanding: deque[int] = deque()  # items sent and not answered, in order
        self.claim: deque[int] = deque()  # items this worker is to grade next, not sent yet
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S

    def kill(self) -> None:
        _kill_group(self.process)
        self.process.join(timeout=10)
        self.conn.close()


def _kill_group(process) -> None:
    """SIGKILL `process` and its process group (what it started and left there), or just `process` if it
    has not made its group yet."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.kill()


class GradingPool:
    def __init__(self, grader: Callable[..., tuple], workers: int, item_timeout_s: float,
                 memory_mb: int | None, chunk_items: int, prefetch_items: int,
                 warm_up: Callable[[], None] | None = None) -> None:
        if chunk_items < 1 or prefetch_items < 0:
            raise ValueError(f"chunk_items={chunk_items} must be >= 1 and prefetch_items={prefetch_items} >= 0")
        self.grader, self.size, self.item_timeout_s, self.memory_mb = grader, workers, item_timeout_s, memory_mb
        self.chunk_items, self.prefetch_items, self.warm_up = chunk_items, prefetch_items, warm_up
        self._context = get_context("spawn")  # forking a process that holds torch's threads can deadlock
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.replaced = 0
        """Workers killed (past the time bound) or dead, and started again, since the pool started."""
        self._finalizer = weakref.finalize(self, _stop, self._workers)

    def grade(self, items: Sequence[tuple], keys: Sequence[Any]) -> list[tuple]:
        """`grader(*item)` for each item: `(value, status[, detail])`, in order; `keys[i]` groups items into
        chunks. Raises WorkerStartFailed when a worker does not start (WarmUpFailed: its `warm_up` raised)."""
        with self._lock:
            try:
                if len(self._workers) < self.size:  # the first batch, or workers abandoned by an interrupted one
                    new = self.size - len(self._workers)
                    self._start(new)
                    for worker in self._workers[-new:]:
                        self._wait_ready(worker)
                return self._run(items, keys)
            except BaseException:
                self._abandon()
                raise

    def close(self) -> None:
        self._finalizer()

    def _abandon(self) -> None:
        """After `_run` was interrupted: kill every worker that is not idle and ready (its answers would land
        in the next batch), and forget the batch's claims. The next `grade` starts replacements."""
        for worker in list(self._workers):
            worker.claim.clear()
            if worker.outstanding or not worker.ready:
                worker.kill()
                self._workers.remove(worker)

    def _start(self, n: int) -> None:
        self._workers.extend(_Worker(self._context, self.grader, self.memory_mb, self.warm_up) for _ in range(n))

    def _wait_ready(self, worker: _Worker) -> None:
        """Block until `worker` says "ready"; past its start-up deadline, or dead, stop every worker and raise."""
        try:
            greeting = worker.conn.recv() if worker.conn.poll(max(0.0, worker.deadline - time.monotonic())) else None
        except (EOFError, OSError):
            greeting = None
        if isinstance(greeting, tuple) and greeting[0] == "failed":
            worker.process.join(timeout=5)
            _stop(self._workers)
            raise WarmUpFailed(greeting[1])
        if greeting != "ready":
            worker.process.join(timeout=1)  # a worker that just died: its exit code
            code = worker.process.exitcode
            _stop(self._workers)
            raise WorkerStartFailed(f"a grading worker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                               f"(exit code {code}; its error, if any, is printed above)")
        worker.ready = True

    def _run(self, items: Sequence[tuple], keys: Sequence[Any]) -> list[tuple]:
        results: list[tuple | None] = [None] * len(items)
        queue = deque(_chunks(keys, self.chunk_items))
        for worker in self._workers:
            worker.claim.clear()
        while queue or any(w.outstanding or w.claim for w in self._workers):
            for worker in list(self._workers):
                while worker.ready and len(worker.outstanding) <= self.prefetch_items:
                    index = self._next_item(worker, queue)
                    if index is None or not self._send(worker, index, items, results, queue):
                        break
            watched = [w for w in self._workers if w.outstanding or not w.ready]
            if not watched:  # every send found its worker dead: the replacements take the queue next round
                continue
            next_deadline = min(w.deadline for w in watched)
            ready = wait([w.conn for w in watched], timeout=max(0.0, next_deadline - time.monotonic()))
            for worker in watched:
                if worker.conn in ready and not worker.ready:
                    self._wait_ready(worker)
                elif worker.conn in ready:
                    self._receive(worker, results, queue)
                elif time.monotonic() > worker.deadline:
                    if not worker.ready:
                        self._wait_ready(worker)  # raises
                    self._replace(worker, results, queue, TIMEOUT)
        return results  # type: ignore[return-value]

    def _next_item(self, worker: _Worker, queue: deque[list[int]]) -> int | None:
        """The next item for `worker`: from its claim; else it claims the next chunk; else it takes the back
        half of the largest claim another worker has not been sent yet. None: nothing is left to send."""
        if not worker.claim:
            if queue:
                worker.claim.extend(queue.popleft())
            else:
                victim = max(self._workers, key=lambda w: len(w.claim))
                stolen = [victim.claim.pop() for _ in range((len(victim.claim) + 1) // 2)]
                worker.claim.extend(reversed(stolen))
        return worker.claim.popleft() if worker.claim else None

    def _send(self, worker: _Worker, index: int, items: Sequence[tuple], results: list, queue: deque) -> bool:
        """Send item `index` to `worker`; False when it turned out dead (replaced, the item requeued)."""
        try:
            worker.conn.send([(index, items[index])])
        except OSError:  # died: the item goes back, the one it was on (if any) is lost
            worker.claim.appendleft(index)
            self._replace(worker, results, queue, ERROR)
            return False
        if not worker.outstanding:  # idle until now: its next item starts now
            worker.deadline = time.monotonic() + self.item_timeout_s
        worker.outstanding.append(index)
        return True

    def _receive(self, worker: _Worker, results: list, queue: deque) -> None:
        try:
            while worker.conn.poll():
                index, *result = worker.conn.recv()
                results[index] = tuple(result)
                worker.outstanding.popleft()
                worker.deadline = time.monotonic() + self.item_timeout_s  # it starts the next item now
        except (EOFError, OSError):  # died (memory, a crash): the item it was on is lost
            self._replace(worker, results, queue, ERROR)

    def _replace(self, worker: _Worker, results: list, queue: deque, status: str) -> None:
        """Kill `worker` and start another (which takes work once it is ready); the item it was on gets
        `status`, the items queued behind it and the rest of its claim go back to the front of the queue."""
        if worker.outstanding:
            index = worker.outstanding.popleft()
            results[index] = (0.0, status)
            log.warning("grading worker %s on item %d (bound %g s): replaced",
                        "timed out" if status == TIMEOUT else "died", index, self.item_timeout_s)
        if worker.outstanding or worker.claim:
            queue.appendleft([*worker.outstanding, *worker.claim])
        worker.kill()
        self._workers.remove(worker)
        self.replaced += 1
        self._start(1)


def _chunks(keys: Sequence[Any], max_items: int) -> list[list[int]]:
    """Runs of consecutive indices with equal keys, at most `max_items` long."""
    chunks: list[list[int]] = []
    for i, key in enumerate(keys):
        if chunks and keys[chunks[-1][-1]] == key and len(chunks[-1]) < max_items:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def _stop(workers: list[_Worker]) -> None:
    """Close every worker's pipe (an idle worker's recv sees EOF and it exits); one still alive 5 s later (a
    call that hangs) is killed."""
    for worker in workers:
        worker.conn.close()
    deadline = time.monotonic() + 5
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            _kill_group(worker.process)
            worker.process.join(timeout=10)
    workers.clear()


def available_cores() -> int:
    """CPU cores this process may run on (a SLURM allocation's, not the node's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
