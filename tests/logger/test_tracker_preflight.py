"""What logger=mlflow, trackio and tensorboard need, refused before any model loads with exit 2 and the fix: an
MLflow tracking server that does not answer, an extra that is not installed."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.config_check import config_problems
from rlvr.logger.mlflow_check import MlflowServer

ROOT = Path(__file__).resolve().parents[2]
WAY_OUT = "or log offline to a file store: logger.tracking_uri=null"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_tracking_server_that_does_not_answer_is_refused_with_the_fix(silent_server):
    url = f"http://127.0.0.1:{closed_port()}"
    refused = MlflowServer(url).check()
    assert refused.status == "missing" and f"the MLflow tracking server {url} does not answer" in refused.detail
    assert WAY_OUT in refused.detail
    start = time.monotonic()
    silent = MlflowServer(silent_server.url).check()
    assert silent.status == "missing" and "does not answer (no answer" in silent.detail
    assert time.monotonic() - start < 30  # bounded by the probe (3 s), not MLflow's minutes of retries; loose: a
    # loaded machine may be slow to run the probe's thread
    assert [MlflowServer(uri).check().status for uri in (None, "file:///tmp/mlruns")] == ["ok", "ok"]


@pytest.mark.parametrize("tracker, module, overrides", [
    ("mlflow", "mlflow", []),
    ("trackio", "trackio", []),
    ("tensorboard", "tensorboard", []),
    ("[wandb,tensorboard]", "tensorboard", ["logger.mode=offline"]),
])
def test_a_missing_extra_is_refused_at_start_with_the_fix(monkeypatch, tracker, module, overrides):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: importlib.util.find_spec says so
    cfg = compose_config([f"logger={tracker}", *overrides])
    _, problems = config_problems(cfg)
    extra = "mlflow" if module == "mlflow" else module
    assert f'logger <rlvr.logger.trackers.Trackers>: {module} is not installed: pip install -e ".[{extra}]"' \
        in problems, problems


def test_a_run_whose_tracking_server_does_not_answer_stops_before_anything_loads(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPROFILEIMPORTTIME": "1"}
    run_dir, port = tmp_path / "run", closed_port()
    proc = subprocess.run([sys.executable, "train.py", "logger=mlflow", f"logger.tracking_uri=http://127.0.0.1:{port}",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    stderr = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert proc.returncode == 2, "\n".join(stderr[-20:])
    assert stderr[0] == "rlvr.errors.ConfigError: invalid config:"
    assert f"the MLflow tracking server http://127.0.0.1:{port} does not answer" in stderr[1] and WAY_OUT in stderr[1]
    assert "Traceback" not in proc.stderr and not run_dir.exists()
    assert not imported & {"torch", "transformers", "mlflow"}  # nothing loaded, MLflow not even imported
