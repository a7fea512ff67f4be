"""What the default run's start-up imports, and how: the libraries and rlvr modules of options it did not choose stay
unimported (a module imported at the top of a file the run reaches would add its import to every run's start-up),
and a heavy library imports with the cyclic garbage collector paused, which is then as it was (rlvr/lazy.py).
`python -m bench.startup` measures what the start-up takes."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlvr.lazy import collector_paused, import_paused, lazy_import

ROOT = Path(__file__).resolve().parents[1]
NOT_IMPORTED = (
    # libraries of other engines, backends, loggers, launchers, rewards and data sets
    "vllm", "sglang", "mlx", "tinker", "openai", "wandb", "submitit", "math_verify", "reasoning_gym", "textarena",
    "datasets", "trl", "unsloth", "bitsandbytes", "deepspeed",
    # analysis libraries nothing in a run needs
    "pandas", "sklearn", "scipy", "matplotlib",
    # transformers' parts rlvr does not use (its own imports reach generation and the auto classes)
    "transformers.pipelines", "transformers.trainer",
    # rlvr's modules of the options not chosen, and its command line
    "rlvr.engine.vllm", "rlvr.backend.fsdp", "rlvr.logger.wandb", "rlvr.reward.math", "rlvr.launcher.slurm",
    "rlvr.cli",
)
"""Modules the default run (model=tiny, engine=pytorch, backend=local, logger=none, reward=exact) never uses."""
DEFAULT_RUN = """
import json, runpy, sys
sys.argv = ["train.py", "trainer.max_steps=1", "trainer.warmup.steps=0", "data.eval_size=20", "trainer.save_every=0",
            "hydra.run.dir=" + sys.argv[1]]
try:
    runpy.run_path("train.py", run_name="__main__")
except SystemExit as done:
    assert not done.code, done.code
print(json.dumps(sorted(sys.modules)))
"""


def test_the_default_run_imports_nothing_of_the_options_it_did_not_choose(tmp_path):
    proc = subprocess.run([sys.executable, "-c", DEFAULT_RUN, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert {"torch", "transformers.models.llama.modeling_llama", "peft"} <= imported  # it did run the model
    assert sorted(name for name in NOT_IMPORTED if name in imported) == []


@pytest.fixture
def collector_enabled():
    """The collector on for the test, and as it was after it."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """The name of a fresh module that records, when imported, whether the collector was on."""
    (tmp_path / "startup_probe.py").write_text("import gc\ncollector_on = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "startup_probe"
    sys.modules.pop("startup_probe", None)


def test_a_lazy_module_imports_with_the_collector_paused_then_restores_it(collector_enabled, probe_module):
    probe = lazy_import(probe_module)
    assert probe_module not in sys.modules
    assert probe.collector_on is False  # the first read imports it, with the collector off
    assert gc.isenabled()


def test_a_collector_already_off_stays_off(collector_enabled, probe_module):
    gc.disable()
    assert import_paused(probe_module).collector_on is False
    assert not gc.isenabled()


def test_overlapping_pauses_restore_the_collector_when_the_last_ends(collector_enabled):
    first_in, release = threading.Event(), threading.Event()

    def hold() -> None:
        with collector_paused():
            first_in.set()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    first_in.wait(10)
    with collector_paused():
        release.set()
        worker.join(10)
        assert not gc.isenabled()  # the worker's pause ended inside this one
    assert gc.isenabled()


def test_a_pause_that_imported_modules_freezes_what_is_alive_then(collector_enabled, probe_module):
    gc.unfreeze()
    import_paused(probe_module)
    assert gc.get_freeze_count() > 0  # the module's objects, out of the collector's sight until fit's gc.unfreeze
    gc.unfreeze()


def test_a_module_another_thread_is_importing_is_returned_once_it_is_whole(tmp_path, monkeypatch):
    """`rlvr doctor` checks side by side: one thread's `import torch` was seen half done by another's import_paused
    (`partially initialized module 'torch' has no attribute 'cuda'`); it now waits for the import to end."""
    started = tmp_path / "started"
    (tmp_path / "slow_probe.py").write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(1.0)\nfinished = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importer = threading.Thread(target=importlib.import_module, args=("slow_probe",))
    try:
        importer.start()
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "slow_probe" in sys.modules  # half-initialised: the other thread is inside its body
        assert import_paused("slow_probe").finished is True
    finally:
        importer.join(30)
        sys.modules.pop("slow_probe", None)
