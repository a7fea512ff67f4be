"""What logger=wandb's mode needs, checked before any model loads by `python train.py` and `rlvr doctor` alike
(rlvr/logger/preflight.py), against the real wandb package and a loopback server that never answers."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.logger.preflight import WANDB_PROBE_TIMEOUT_S, WandbKey, WandbServer, key_problem, wandb_requirements

wandb = pytest.importorskip("wandb")
ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "local-" + "0123456789abcdef" * 3  # an on-premises key's shape: prefix, dash, 48 characters
WAY_OUT = "choose logger.mode=offline (or WANDB_MODE=offline)"


def test_the_key_check_is_wandbs_own():
    from wandb.sdk.lib.wbauth.validation import check_api_key

    keys = ["", "short", "x" * 39, "x" * 40, "a" * 40 + "!", "prefix-" + "b" * 39, "prefix-" + "b" * 40,
            "p-q-" + "c" * 38, "eyJh.eyJz.c2ln", "k" * 86, GOOD_KEY]
    assert [key_problem(key) for key in keys] == [check_api_key(key) for key in keys]
    assert key_problem("short") == "API key must have 40+ characters, has 5."


@pytest.mark.parametrize("env, overrides, mode", [
    ({}, [], "online"),
    ({"WANDB_MODE": "offline"}, [], "offline"),
    ({"WANDB_MODE": "offline"}, ["logger.mode=online"], "online"),  # an explicit logger.mode= wins
    ({"WANDB_MODE": "dryrun"}, [], "offline"),  # wandb's older name
])
def test_the_mode_is_the_environments_unless_given(monkeypatch, env, overrides, mode):
    monkeypatch.delenv("WANDB_MODE")  # tests/conftest.py sets it
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    logger = compose_config(["logger=wandb", *overrides]).logger
    assert logger.mode in (mode, env.get("WANDB_MODE"))
    from hydra.utils import instantiate

    assert instantiate(logger).loggers["wandb"].mode == mode


def test_online_needs_a_well_formed_key_and_a_server_that_answers(silent_server, monkeypatch):
    missing = WandbKey("online").check()
    assert missing.status == "missing" and "neither $WANDB_API_KEY nor a netrc entry" in missing.detail
    assert WAY_OUT in missing.detail
    monkeypatch.setenv("WANDB_API_KEY", "short")
    malformed = WandbKey("online").check()
    assert malformed.status == "missing" and "API key must have 40+ characters, has 5" in malformed.detail
    monkeypatch.setenv("WANDB_API_KEY", GOOD_KEY)
    assert WandbKey("online").check().status == "ok"
    start = time.monotonic()
    server = WandbServer("online").check()
    seconds = time.monotonic() - start
    assert server.status == "missing" and f"the W&B server {silent_server.url} does not answer" in server.detail
    assert WAY_OUT in server.detail
    assert WANDB_PROBE_TIMEOUT_S <= seconds < WANDB_PROBE_TIMEOUT_S + 2  # bounded: not wandb's minutes of retries
    assert len(silent_server.connections) == 1


@pytest.mark.parametrize("key", [None, "short", GOOD_KEY])
def test_offline_needs_no_key_and_no_network(silent_server, monkeypatch, key):
    if key is not None:
        monkeypatch.setenv("WANDB_API_KEY", key)
    for mode in ("offline", "dryrun", "disabled"):
        assert [r.check().status for r in wandb_requirements(mode)] == ["ok", "ok"]
    assert silent_server.connections == []
    assert wandb_requirements("sometimes")[0].check().detail.startswith("logger.mode='sometimes' (from $WANDB_MODE")


def doctor_rows(*overrides: str) -> list[str]:
    """`rlvr doctor`'s lines for what the run needs (its run part: rlvr.cli.doctor.needs), logger=wandb's only."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from rlvr.cli.doctor.needs import compose_jobs, run_lines

    jobs, error = compose_jobs(list(overrides), ROOT / "conf")
    assert error is None
    no_slurm: Future = Future()  # read only under hydra/launcher=slurm
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [str(line) for line in run_lines(jobs, pool, no_slurm) if line.item == "logger=wandb"]


def test_doctor_runs_the_same_checks(silent_server):
    rows = doctor_rows("logger=wandb", "logger.mode=online")
    for item in ("wandb key", "wandb server"):
        assert any(row.split()[:2] == ["missing", "logger=wandb"] and f"{item}:" in row and WAY_OUT in row
                   for row in rows), (item, rows)
    rows = doctor_rows("logger=wandb", "logger.mode=offline")
    assert len(rows) == 3 and all(row.startswith("  ok") for row in rows), rows


def test_a_run_online_without_network_stops_before_anything_loads(silent_server, tmp_path):
    """No key and a server that never answers: exit 2 in seconds, both problems named, no traceback, no folder."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPROFILEIMPORTTIME": "1"}
    env.pop("WANDB_MODE")
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py", "logger=wandb", f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    stderr = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert proc.returncode == 2, "\n".join(stderr[-20:])
    assert stderr[0] == "rlvr.errors.ConfigError: invalid config:"
    assert "needs a well-formed W&B key: neither $WANDB_API_KEY" in stderr[1] and WAY_OUT in stderr[1]
    assert f"the W&B server {silent_server.url} does not answer" in stderr[2] and WAY_OUT in stderr[2]
    assert "Traceback" not in proc.stderr and not run_dir.exists()
    assert not imported & {"torch", "transformers"}  # nothing loaded
    assert seconds < 30, seconds  # the probe's 3 s and Python's start
