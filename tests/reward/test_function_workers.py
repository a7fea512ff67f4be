"""`reward=function` with a sync function: every call is bounded by `timeout_s`, in worker processes that a
hang, a crash or an exit costs one item (rlvr/reward/function.py, rlvr/reward/pool.py). The functions are
in tests/reward/sync_rewards.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from rlvr.errors import ConfigError
from rlvr.reward.function import FunctionReward

MARGIN_S = 1.5
"""Past timeout_s: the kill, and the scheduling of a loaded 2-core machine."""


@pytest.fixture
def made():
    """Build FunctionRewards; every one is closed after the test."""
    rewards = []

    def make(name: str, **kwargs) -> FunctionReward:
        rewards.append(FunctionReward(f"reward.sync_rewards.{name}", **kwargs))
        return rewards[-1]

    yield make
    for reward in rewards:
        reward.close()


def alive(pid: int) -> bool:
    """A process with this pid exists and is not a zombie (an orphan init has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_sync_call_that_hangs_is_a_timeout_and_the_worker_is_replaced(made):
    reward = made("sleeps", timeout_s=1.0, workers=2)
    reward.score(["1"], ["1"])  # the workers started (a first batch also waits for that)
    started = {w.process.pid for w in reward.pool._workers}
    start = time.monotonic()
    scores = reward.score(["x", "1", "a1", "2", "1"], ["1"] * 5)
    elapsed = time.monotonic() - start
    assert (scores.values, scores.timeouts, scores.errors) == ([0.0, 1.0, 1.0, 0.0, 1.0], 1, 0)
    assert elapsed < 1.0 + MARGIN_S, f"{elapsed:.1f} s for a batch with one hanging call (timeout_s=1)"
    assert reward.pool.replaced == 1 and len(reward.pool._workers) == 2
    assert len(started & {w.process.pid for w in reward.pool._workers}) == 1  # the other one persisted
    scores = reward.score(["1", "0", "1", "0"], ["1"] * 4)  # the replacement takes work too
    assert (scores.values, scores.timeouts) == ([1.0, 0.0, 1.0, 0.0], 0)


def test_the_whole_batch_bound_with_every_call_hanging(made):
    """N=4 hanging calls on W=2 workers with T=1: ceil(N/W) * (T + a start-up) (the docstring's bound)."""
    reward = made("sleeps", timeout_s=1.0, workers=2)
    reward.score(["1"], ["1"])
    start = time.monotonic()
    scores = reward.score(["x"] * 4, ["1"] * 4)
    elapsed = time.monotonic() - start
    assert (scores.values, scores.timeouts) == ([0.0] * 4, 4)
    assert 2 * 1.0 <= elapsed < 2 * (1.0 + MARGIN_S), f"{elapsed:.1f} s"


def test_a_sync_call_that_raises_is_an_error_counted_from_a_worker(made, caplog):
    reward = made("raises_with_pid", workers=2)
    scores = reward.score(["x", "1", "exit", "x"], ["1"] * 4)
    assert (scores.values, scores.errors, scores.timeouts) == ([0.0, 1.0, 0.0, 0.0], 3, 0)
    assert "reward.sync_rewards.raises_with_pid': 3 of 4 calls failed" in caplog.text
    pid = int(caplog.text.split("raised RuntimeError: pid ")[1].split()[0])
    assert pid != os.getpid() and pid in {w.process.pid for w in reward.pool._workers}
    assert reward.pool.replaced == 0  # an exception (SystemExit too) is the call's, not the worker's


def test_a_call_that_kills_its_process_is_an_error_and_the_pool_recovers(made, caplog):
    reward = made("exits_on_x", workers=2)
    scores = reward.score(["1", "x", "1"], ["1"] * 3)
    assert (scores.values, scores.errors, scores.timeouts) == ([1.0, 0.0, 1.0], 1, 0)
    assert "its worker process died" in caplog.text
    assert reward.pool.replaced == 1
    assert reward.score(["1", "0"], ["1", "1"]).values == [1.0, 0.0]


def test_a_killed_call_takes_the_processes_it_started_along(made, tmp_path):
    reward = made("spawns", timeout_s=1.0, workers=1)
    scores = reward.score([f"spawn {tmp_path / 'pid'}"], ["1"])
    assert scores.timeouts == 1
    child = int((tmp_path / "pid").read_text())
    assert wait_until(lambda: not alive(child), 5.0), "the call's subprocess outlived its killed worker"


def test_a_function_the_workers_cannot_import_is_a_config_error(monkeypatch):
    """Importable here (a module made in this process only), not in a fresh process: the first batch says so."""
    module = types.ModuleType("only_in_the_test_process")
    module.score = lambda completion, reference: 1.0
    monkeypatch.setitem(sys.modules, module.__name__, module)
    reward = FunctionReward("only_in_the_test_process.score", workers=1)
    try:
        with pytest.raises(ConfigError, match=r"reward.function='only_in_the_test_process.score' cannot be "
                                              r"imported in a reward worker process.*only_in_the_test_process"):
            reward.score(["1"], ["1"])
        assert not reward.pool._workers
    finally:
        reward.close()


def test_a_module_imported_here_without_its_folder_on_sys_path_is_found_in_the_workers(tmp_path, monkeypatch):
    """As pytest's importlib mode imports `tests.backpressure.mixed_rewards` (tests/composing.py's MIXED): the
    module in sys.modules by its dotted name, its root folder not on sys.path. The workers look there too."""
    import importlib.util

    package = tmp_path / "pkg_only_in_sys_modules"
    package.mkdir()
    (package / "rewards.py").write_text("def one(completion, reference):\n    return 1.0\n")
    spec = importlib.util.spec_from_file_location(f"{package.name}.rewards", package / "rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parent = types.ModuleType(package.name)
    parent.__path__ = [str(package)]
    monkeypatch.setitem(sys.modules, package.name, parent)
    monkeypatch.setitem(sys.modules, spec.name, module)
    reward = FunctionReward(f"{spec.name}.one", workers=1)
    try:
        assert reward.score(["a", "b"], ["1", "1"]).values == [1.0, 1.0]
    finally:
        reward.close()


def test_workers_must_be_a_positive_count():
    with pytest.raises(ValueError, match="reward.workers=0"):
        FunctionReward("reward.sync_rewards.equals", workers=0)


class Stop(BaseException):
    """What the test's signal handler raises (a BaseException, as rlvr.preemption.StepInterrupted)."""


def test_an_exception_raised_while_waiting_leaves_the_pool_usable(made):
    reward = made("sleeps", timeout_s=30.0, workers=2)
    reward.score(["1"], ["1"])
    before = {w.process.pid for w in reward.pool._workers}

    def stop(signum, frame):
        raise Stop

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        start = time.monotonic()
        with pytest.raises(Stop):
            reward.score(["x", "1", "1", "x", "1"], ["1"] * 5)
        assert time.monotonic() - start < 0.5 + MARGIN_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not any(alive(pid) for pid in before)  # both held a hanging call of the abandoned batch: killed
    scores = reward.score(["1", "0"], ["1", "1"])  # nothing of the abandoned batch lands in this one
    assert (scores.values, scores.timeouts, scores.errors) == ([1.0, 0.0], 0, 0)
    workers = [w.process.pid for w in reward.pool._workers]
    assert len(workers) == 2
    reward.close()
    assert not reward.pool._workers and not any(alive(pid) for pid in workers)


def test_workers_end_when_the_main_process_is_killed(tmp_path):
    """The main process SIGKILLed while its workers hang in calls: they exit within a few seconds."""
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        from pathlib import Path
        from rlvr.reward.function import FunctionReward

        reward = FunctionReward("reward.sync_rewards.sleeps", timeout_s=600, workers=2)
        marks = [Path({str(tmp_path)!r}) / name for name in ("a", "b")]
        threading.Thread(target=reward.score, args=([f"x {{m}}" for m in marks], ["1", "1"]), daemon=True).start()
        while not all(m.exists() for m in marks):
            time.sleep(0.05)
        print(os.getpid(), *(m.read_text() for m in marks), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: a pipe would wait for the workers to close it
        done = subprocess.run([sys.executable, "-c", script], stdout=stdout, stderr=stderr, timeout=120, env=env)
    assert done.returncode == -signal.SIGKILL, err.read_text()
    main, *workers = [int(pid) for pid in out.read_text().split()]
    assert len(set(workers)) == 2 and main not in workers
    assert wait_until(lambda: not any(alive(pid) for pid in workers), 5.0), "orphaned workers still run"
