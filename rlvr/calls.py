"""Calls that may hang or fail, run from an event loop: the environment guard's (rlvr/env/guarded.py), the episode
loop's (rlvr/rollout/), a tool's (rlvr/tools/run.py).

A call is first run directly (`started`) until it first awaits something that is not ready: an in-process game's
`step` returns before that, and then costs no task and no timer (a timer could not have stopped it: the event loop
had no turn); one that suspends runs on (`finish`). `gather_eagerly` gathers a turn's calls the same way.
Synchronous code that may hang runs on a thread of its own, whose outcome `settle` hands to the awaiting coroutine;
what any call raised is described in one line by `describe`.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Coroutine, Generator, Iterable
from typing import Any, TypeVar, cast

T = TypeVar("T")


def settle(future: asyncio.Future, outcome: Any, failed: bool) -> None:
    """Hand a thread's outcome to the coroutine awaiting `future` (in the loop's thread): its result, or its
    exception when `failed`; nothing when a timeout gave the future up meanwhile."""
    if future.done():  # cancelled by a timeout meanwhile
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def started(coro: Coroutine[Any, Any, T]) -> tuple[bool, Any]:
    """Run `coro` here until it first suspends: (True, its result) when it returned without suspending (an
    in-process game's step), else (False, the rest of it, for `finish`). What it raises is raised."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, _rest(coro, yielded)


@types.coroutine
def _rest(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """What `await coro` does from where `started` left it: hand what it yields to the event loop, and what the
    loop sends or throws (a cancellation) back to it."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as err:  # noqa: BLE001 - thrown into the coroutine, as `await` would
            try:
                yielded = coro.throw(err)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def finish(rest: Generator[Any, Any, T]) -> T:
    """The rest of a coroutine `started` returned unfinished, awaited (`_rest` is a generator-based coroutine)."""
    return await cast(Awaitable[T], rest)


async def gather_eagerly(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """`asyncio.gather`'s results, in order, each coroutine first run here until it suspends (`started`): those that
    finish without suspending (an in-process game's calls) cost no task, timer or turn of the event loop; the others
    run on concurrently, as gather runs them. What one raises is raised (the others are closed)."""
    coros = list(coros)
    results: list[Any] = [None] * len(coros)
    pending: dict[int, Generator[Any, Any, T]] = {}
    try:
        for i, coro in enumerate(coros):
            done, outcome = started(coro)
            if done:
                results[i] = outcome
            else:
                pending[i] = outcome
    except BaseException:
        for coro in coros[i + 1 :]:
            coro.close()
        for rest in pending.values():
            rest.close()
        raise
    if pending:
        for i, value in zip(pending, await asyncio.gather(*(finish(r) for r in pending.values())), strict=True):
            results[i] = value
    return results


def describe(err: BaseException) -> str:
    """`TypeName: message`, the message cut to 300 characters."""
    text = str(err)
    return f"{type(err).__name__}: {text[:300]}{'…' if len(text) > 300 else ''}" if text else type(err).__name__
