"""A pretrained model's files (`PretrainedWeights`, the `files` requirement of model=pretrained and the qwen presets):
known before anything loads. A local folder must hold what from_pretrained reads; a hub id must be in the local
hub cache at its revision, or the hub must be on (not HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) and answer a
bounded probe. Real models throughout: saved with save_pretrained, or as a real hub cache entry; the only hub
is a loopback server started here, or a closed loopback port."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlvr.model.pretrained import PretrainedWeights
from rlvr.requirements import HUB_PROBE_TIMEOUT_S, unanswered
from tests.hub_models import COMMIT, cached_model, saved_model, unused_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache, the one this process reads (huggingface_hub read $HF_HUB_CACHE when imported)."""
    from huggingface_hub import constants

    folder = tmp_path / "hub-cache"
    folder.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    return folder


@pytest.fixture
def online(monkeypatch):
    """The hub is not switched off (tests/conftest.py switches it off for every test)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


class Answers(BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 - the http.server API
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    """A loopback server answering every HEAD request: a hub that is up."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_local_folder_needs_config_tokenizer_and_weights(tmp_path):
    folder = saved_model(tmp_path / "model")
    found = PretrainedWeights(str(folder), None).check()
    assert (found.status, found.detail) == ("ok", f"local folder {folder}")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    found = PretrainedWeights(str(folder), None).check()
    assert found.status == "missing"
    assert found.detail.startswith(f"model.name_or_path={str(folder)!r}: the folder lacks tokenizer files (any of "
                                   "tokenizer.json, tokenizer.model, vocab.json")
    (folder / "model.safetensors").unlink()
    found = PretrainedWeights(str(folder), None).check()
    assert found.status == "missing" and "lacks tokenizer files (any of" in found.detail
    assert "weights (model.safetensors or model.safetensors.index.json or pytorch_model.bin" in found.detail
    (folder / "config.json").unlink()
    found = PretrainedWeights(str(folder), None).check()
    assert found.status == "missing" and "no model folder there" in found.detail


def test_a_real_hub_cache_entry_is_found_at_its_revision(cache, monkeypatch):
    snapshot = cached_model(cache, "org/name")
    for revision in (None, "main", COMMIT):
        found = PretrainedWeights("org/name", revision).check()
        assert found.status == "ok", (revision, found)
        assert found.detail == f"org/name: in the hub cache (1 weight file, {snapshot})"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = PretrainedWeights("org/name", "v2").check()  # a revision the cache does not hold
    assert found.status == "missing" and "is not in the local hub cache at revision v2" in found.detail
    assert "hf download org/name --revision v2" in found.detail
    (snapshot / "model.safetensors").unlink()  # the weights never arrived: config and tokenizer alone
    found = PretrainedWeights("org/name", None).check()
    assert found.status == "missing", found
    assert f"is only partly in the local hub cache ({snapshot} lacks weights (model.safetensors" in found.detail


def test_a_sharded_model_needs_every_shard(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = cached_model(cache, "org/sharded")
    (snapshot / "model.safetensors").rename(snapshot / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    found = PretrainedWeights("org/sharded", None).check()
    assert found.status == "missing"
    assert "lacks 1 of 2 weight files (model-00002-of-00002.safetensors, …)" in found.detail
    (snapshot / "model-00002-of-00002.safetensors").write_bytes(b"")
    found = PretrainedWeights("org/sharded", None).check()
    assert found.status == "ok" and "(2 weight files," in found.detail


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_a_hub_id_not_in_the_cache_is_missing_at_once(cache, online, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # never asked: offline is offline
    start = time.monotonic()
    found = PretrainedWeights("org/no-such-model", None).check()
    assert time.monotonic() - start < 1
    assert found.status == "missing"
    assert found.detail == (
        f"model.name_or_path='org/no-such-model' is not in the local hub cache and {var} is set ({var}=1): "
        "nothing is downloaded. Fetch it on a machine with network (`hf download org/no-such-model`, or "
        "`huggingface-cli download org/no-such-model`) and copy its hub cache folder models--org--no-such-model "
        f"into {cache} ($HF_HUB_CACHE, else $HF_HOME/hub), or set model.name_or_path to a local folder written by "
        "save_pretrained")


def test_online_a_hub_that_does_not_answer_makes_it_missing_fast(cache, online, monkeypatch):
    endpoint = f"http://127.0.0.1:{unused_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    start = time.monotonic()
    found = PretrainedWeights("org/no-such-model", None).check()
    assert time.monotonic() - start < HUB_PROBE_TIMEOUT_S
    assert found.status == "missing"
    assert (f"model.name_or_path='org/no-such-model' is not in the local hub cache and the hub does not "
            f"answer (HEAD {endpoint}: [Errno 111] Connection refused, within a 3-s probe") in found.detail
    assert "`hf download org/no-such-model`" in found.detail
    cached_model(cache, "org/name")  # in the cache: the hub is not needed (nor asked)
    assert PretrainedWeights("org/name", None).check().status == "ok"


def test_online_a_hub_that_answers_downloads_at_start(cache, online, monkeypatch, hub):
    monkeypatch.setenv("HF_ENDPOINT", hub)
    found = PretrainedWeights("org/no-such-model", None).check()
    assert found.status == "warning"
    assert found.detail == f"org/no-such-model is not in the local hub cache: downloaded from {hub} when " \
                           "the run starts"


def test_the_probe_waits_at_most_its_bound():
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        why = unanswered(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        assert time.monotonic() - start < 1.0
    assert why is not None and ("timed out" in why or "no answer within 0.5 s" in why), why
    assert unanswered("http://127.0.0.1:9", timeout_s=0.5) is not None


def train(*overrides: str, cwd: Path, **env: str | None) -> subprocess.CompletedProcess:
    """`python train.py …` as typed, from `cwd` (its outputs/ is the run folders' root)."""
    environ = {k: v for k, v in os.environ.items() if k not in env} | {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_train_offline_without_the_model_is_a_config_error_before_anything(tmp_path):
    cache = tmp_path / "hub-cache"
    proc = train("model=qwen3_0_6b", "trainer=gpu", cwd=tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    start = lines.index("rlvr.errors.ConfigError: invalid config:")
    assert lines[start + 1] == (
        f"  model <rlvr.model.pretrained.Pretrained>: model.name_or_path='Qwen/Qwen3-0.6B' is not in the local hub "
        f"cache and HF_HUB_OFFLINE is set (HF_HUB_OFFLINE=1): nothing is downloaded. Fetch it on a "
        "machine with network (`hf download Qwen/Qwen3-0.6B`, or `huggingface-cli download Qwen/Qwen3-0.6B`) and "
        f"copy its hub cache folder models--Qwen--Qwen3-0.6B into {cache} ($HF_HUB_CACHE, else $HF_HOME/hub), or "
        "set model.name_or_path to a local folder written by save_pretrained")
    assert files_under(tmp_path) == [], "no run folder (.hydra/, train.log) is left behind"


def test_train_online_with_the_hub_unreachable_is_a_config_error_in_seconds(tmp_path):
    endpoint = f"http://127.0.0.1:{unused_port()}"
    start = time.monotonic()
    proc = train("model=pretrained", "model.name_or_path=org/name", "trainer=gpu", cwd=tmp_path,
                 HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None, HF_ENDPOINT=endpoint,
                 HF_HUB_CACHE=str(tmp_path / "hub-cache"))
    assert time.monotonic() - start < 60  # python, hydra and the checks; the hub retries alone took ~50 s
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert (f"model.name_or_path='org/name' is not in the local hub cache and the hub "
            f"does not answer (HEAD {endpoint}: [Errno 111] Connection refused") in proc.stderr
    assert files_under(tmp_path) == []


def test_train_from_a_populated_hub_cache_runs(tmp_path):
    """The cached model loads offline (HF_HUB_OFFLINE=1) and trains a step; base/ points at the cached commit."""
    cache = tmp_path / "hub-cache"
    cached_model(cache, "org/name")
    run_dir = tmp_path / "run"
    proc = train("model=pretrained", "model.name_or_path=org/name", "model.dtype=float32",
                 "model.attn_implementation=eager", "model.lora.rank=4", "model.lora.alpha=8", "trainer=gpu",
                 "trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_every=0",
                 "trainer.sampling.max_tokens=4", "trainer.eval_max_tokens=4", "data.eval_size=4", "threads=1",
                 f"hydra.run.dir={run_dir}", cwd=tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1
    assert json.loads((run_dir / "base" / "base.json").read_text())["weights"] == {
        "name_or_path": "org/name", "revision": None, "commit": COMMIT}
