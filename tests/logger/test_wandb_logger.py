"""The W&B logger, for real, in offline mode (no network, no key)."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from composing import FAST, compose_config
from rlvr.logger.wandb import WandbLogger
from rlvr.run import run

pytest.importorskip("wandb")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def run_ids(folder: Path) -> set[str]:
    """The W&B run ids logged under `folder` (from the `run-<id>.wandb` files: the folder name is not enough,
    wandb adds a suffix when a run is continued within the same second)."""
    return {f.stem.removeprefix("run-") for f in (folder / "wandb").glob("offline-run-*/run-*.wandb")}


def test_naming_and_a_stable_id_per_folder(tmp_path):
    logger = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    logger.start("maxrl_gtpo_sepa_s1", "maxrl_gtpo_sepa", ["maxrl_gtpo_sepa", "seed1"], tmp_path / "a", {"seed": 1})
    run_a = logger.run
    assert (run_a.name, run_a.group, tuple(run_a.tags)) == ("maxrl_gtpo_sepa_s1", "maxrl_gtpo_sepa",
                                                              ("maxrl_gtpo_sepa", "seed1"))
    assert run_a.settings.finish_timeout == 120.0  # an online run's end waits for its upload at most this long
    logger.log({"step": 0, "mean_reward": 0.5, "condition": "maxrl+sepa", "loss": float("nan")})
    logger.finish()
    again = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    again.start("x", "x", [], tmp_path / "a", {})
    same_id = again.run.id
    again.finish()
    other = WandbLogger(project="rlvr-test", entity=None, mode="offline", dir=None)
    other.start("x", "x", [], tmp_path / "b", {})
    assert same_id == run_a.id and other.run.id != run_a.id
    other.finish()


@pytest.mark.parametrize("key", [None, "short", "local-" + "0123456789abcdef" * 3])
def test_offline_by_the_environment_with_any_key_contacts_no_server(tmp_path, silent_server, monkeypatch, key):
    """No key, a malformed one, a well-formed one: WANDB_MODE=offline and no logger.mode, and wandb starts, logs
    and finishes without a connection to the server (which would never answer: a try would hang)."""
    from hydra.utils import instantiate

    if key is not None:
        monkeypatch.setenv("WANDB_API_KEY", key)
    logger = instantiate(compose_config(["logger=wandb"]).logger).loggers["wandb"]
    assert logger.mode == "offline"
    start = time.monotonic()
    logger.start("x_s0", "x", ["x", "seed0"], tmp_path, {})
    logger.log({"step": 0, "mean_reward": 0.5})
    logger.finish()
    assert silent_server.connections == [] and logger.failures == 0
    assert time.monotonic() - start < 30
    assert len(run_ids(tmp_path)) == 1


def test_each_job_in_one_process_gets_its_own_run_and_a_resume_continues_it(tmp_path):
    overrides = FAST + ["logger=wandb", "logger.mode=offline", "trainer.max_steps=2"]
    run(compose_config(overrides), tmp_path / "a")
    run(compose_config(overrides + ["seed=1"]), tmp_path / "b")
    (id_a,), (id_b,) = run_ids(tmp_path / "a"), run_ids(tmp_path / "b")
    assert id_a != id_b
    for folder in "ab":
        assert all(f.stat().st_size > 0 for f in (tmp_path / folder / "wandb").glob("offline-run-*/run-*.wandb"))
    run(compose_config(FAST + ["logger=wandb", "logger.mode=offline", "trainer.max_steps=3"]), tmp_path / "a")
    assert run_ids(tmp_path / "a") == {id_a}  # the same run, continued


def wandb_records(path: Path) -> list:
    """Every record of a run's transaction log (`run-<id>.wandb`, what `wandb sync` uploads), read as wandb-core
    writes it: a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB-log chunks in 32-KiB blocks (CRC-32
    of type byte and data, length, type: full, or first/middle/last), each record one of wandb's own protobuf
    `Record`s. A torn or corrupt file fails here."""
    from wandb.proto import wandb_internal_pb2

    data, block, records, pending = path.read_bytes(), 32768, [], b""
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos = 7
    while pos < len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        assert len(chunk) == length and zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"corrupt at {pos}"
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
    return records


def values(items) -> dict:
    """A record's items (history, summary, config) as a dict; a key is `key`, or `nested_key` joined by "/"."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_a_run_offline_by_the_environment_survives_its_logger_failing(tmp_path, silent_server):
    """One real run as on a compute node: WANDB_MODE=offline, a malformed key, a server that never answers, no
    logger.mode. It starts (no key check, no network), wandb's service is killed after the first evaluation,
    and the training goes on: every row in metrics.jsonl, the failure reported once, the run reopened offline
    with every row, in files that hold the whole run."""
    psutil = pytest.importorskip("psutil")
    max_steps, run_dir = 6, tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "short", "WANDB_SILENT": "true",
           "HF_HUB_OFFLINE": "1"}
    env.pop("WANDB_SERVICE", None)  # set by a wandb run of this process: the run would share its service
    proc = subprocess.Popen([sys.executable, "train.py", "logger=wandb", f"trainer.max_steps={max_steps}",
                             "trainer.warmup.steps=0", "data.eval_size=16", "threads=1", f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = []
    deadline = time.monotonic() + 240
    while not killed and proc.poll() is None and time.monotonic() < deadline:
        log = run_dir / "train.log"
        if log.exists() and "eval before training" in log.read_text():  # logged after its row went to wandb
            killed = [p.pid for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "wandb-core"]
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=240)
    stderr = stderr[-6000:] + stdout[-2000:]  # Hydra logs to stdout
    assert proc.returncode == 0 and killed, stderr[-3000:]
    assert "Traceback" not in stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "eval/accuracy" not in r]) == max_steps and rows[-1]["step"] == max_steps
    failed = [line for line in stderr.splitlines() if "wandb: logging a row failed at step" in line]
    assert len(failed) == 1 and "the training goes on" in failed[0], stderr[-3000:]
    tally = [line for line in stderr.splitlines() if "wandb: 1 call(s) failed in this run; 0 row(s) did not reach "
             "wandb (metrics.jsonl holds every row); `wandb sync " in line]
    assert len(tally) == 1, stderr[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert silent_server.connections == []  # offline: nothing tried the network, with or without a key
    assert "mode: ${oc.env:WANDB_MODE,online}" in (run_dir / ".hydra" / "config.yaml").read_text()
    first, reopened = sorted((run_dir / "wandb").glob("offline-run-*"))  # the same run id, opened twice
    assert first.name.split("-")[-1] == reopened.name.split("-")[-1]
    assert tally[0].endswith(f"`wandb sync {reopened}` uploads the whole run")
    records = wandb_records(next(reopened.glob("run-*.wandb")))
    config = values(item for r in records if r.HasField("run") for item in r.run.config.update)
    assert config["logger"]["mode"] == "offline", config.get("logger")  # the mode the run used, resolved
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds.count("run") == 1 and kinds[-1] == "exit"  # finished, so `wandb sync` uploads a complete run
    logged = [values(r.history.item) for r in records if r.HasField("history")]
    assert [r["step"] for r in logged] == [r["step"] for r in rows]  # every row, those before the failure too
    assert logged[-1]["eval/accuracy"] == rows[-1]["eval/accuracy"]
    summary = values(item for r in records if r.HasField("summary") for item in r.summary.update)
    assert summary["logger/failures"] == 1


def test_the_cells_of_a_packed_grid_log_to_runs_of_their_own(tmp_path):
    """Alive at once in one process (rlvr/pack/), two runs each log every row of their own to their own W&B run."""
    args = [sys.executable, "train.py", "--multirun", "seed=0,1", *FAST, "trainer.max_steps=3", "logger=wandb",
            "logger.mode=offline", "hydra/launcher=packed", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    ids = [run_ids(tmp_path / cell) for cell in "01"]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]
    for cell in "01":
        rows = [json.loads(line) for line in (tmp_path / cell / "metrics.jsonl").read_text().splitlines()]
        (log,) = (tmp_path / cell / "wandb").glob("offline-run-*/run-*.wandb")
        logged = [values(r.history.item) for r in wandb_records(log) if r.HasField("history")]
        assert [h["step"] for h in logged] == [r["step"] for r in rows]
        assert [h.get("mean_reward") for h in logged] == [r.get("mean_reward") for r in rows]
