"""`rlvr doctor`: the machine report, and the verdict on what a run's overrides need (exit 0 / 1).

Offline: the only server contacted is a loopback one started here (or a closed port); keys are fakes."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlvr.cli import doctor
from tests.hub_models import answering_hub, cached_model, unused_port

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
FAKE_TINKER = "tml-Zq9fakeTinkerKey7731"
FAKE_OPENAI = "sk-Wv4fakeOpenAIKey5519"
CLOSED_PORT_URL = "http://127.0.0.1:9/v1"  # discard port: nothing listens there


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("TINKER_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", "WANDB_MODE", "HF_HUB_OFFLINE", "SLURM_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def run_doctor(*overrides: str) -> tuple[str, int]:
    return doctor.run(list(overrides), CONF)


def cli(*overrides: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli.main", "doctor", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def line(report: str, item: str, containing: str = "") -> str:
    """The report's first line for `item` (holding `containing`) in the run part (after the "needs" header),
    else the machine part's."""
    machine, _, needs = report.partition("` needs")
    for part in (needs, machine):
        for row in part.splitlines():
            if row.split()[1:2] == [item] and containing in row:
                return row
    raise AssertionError(f"no line for {item!r} holding {containing!r} in:\n{report}")


def run_part(report: str, item: str) -> list[str]:
    """Every line for `item` in the run part."""
    return [row for row in report.partition("` needs")[2].splitlines() if row.split()[1:2] == [item]]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TINKER_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def test_the_default_config_can_run_here_and_every_item_has_a_line():
    proc = cli(env=base_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    items = ("python", "torch", "cuda", "transformers", "peft", "vllm", "tinker", "TINKER_API_KEY", "OPENAI_API_KEY",
             "wandb", "math-verify", "httpx", "slurm-commands", "slurm-cluster", "hub", "config", "backend=local")
    for item in items:
        assert line(out, item).split()[0] in ("ok", "missing", "warning"), item
    assert line(out, "torch").split()[0] == "ok"
    assert line(out, "math-verify").split()[0] == "ok"  # a real parse/verify ran in a child process
    assert out.rstrip().endswith("this run can run here")


def test_tinker_without_its_key_cannot_run_and_names_the_variable():
    report, code = run_doctor("backend=tinker", "model=qwen3_4b", "trainer.warmup.steps=0")
    assert code == 1
    assert line(report, "backend=tinker", "TINKER_API_KEY").startswith("  missing")
    assert "cannot run here" in report.splitlines()[-1] and "backend=tinker" in report.splitlines()[-1]


def test_fake_keys_never_appear_in_stdout_or_stderr(hub_server):
    # online (HF_HUB_OFFLINE unset, a hub that answers): backend=tinker reads only the tokenizer, downloaded at start
    env = base_env() | {"TINKER_API_KEY": FAKE_TINKER, "OPENAI_API_KEY": FAKE_OPENAI, "HF_ENDPOINT": hub_server}
    del env["HF_HUB_OFFLINE"]
    env.pop("TRANSFORMERS_OFFLINE", None)
    proc = cli("backend=tinker", "model=qwen3_4b", "trainer.warmup.steps=0", "reward=judge", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for key in (FAKE_TINKER, FAKE_OPENAI):
        for shown in (key, key[:8], key[-8:]):
            assert shown not in proc.stdout + proc.stderr
    assert "set (the value is never shown)" in line(proc.stdout, "TINKER_API_KEY")
    for item in ("backend=tinker", "reward=judge"):
        assert all(row.startswith("  ok") for row in run_part(proc.stdout, item)), proc.stdout


def test_a_judge_without_its_key_cannot_run():
    report, code = run_doctor("reward=judge")
    assert code == 1 and line(report, "reward=judge", "$OPENAI_API_KEY").startswith("  missing")


def test_an_openai_server_that_does_not_answer():
    report, code = run_doctor("engine=openai", f"engine.base_url={CLOSED_PORT_URL}")
    assert code == 1
    assert line(report, "engine=openai").startswith("  missing")
    assert f"GET {CLOSED_PORT_URL}/models is not answering" in report


class ModelsHandler(BaseHTTPRequestHandler):
    key = FAKE_OPENAI

    def do_GET(self):  # noqa: N802 - the http.server API
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": "policy", "max_model_len": 64}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModelsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def test_an_openai_server_that_answers_with_the_model(models_server, monkeypatch):
    monkeypatch.setenv("MY_VLLM_KEY", FAKE_OPENAI)
    report, code = run_doctor("engine=openai", f"engine.base_url={models_server}", "engine.api_key_env=MY_VLLM_KEY")
    assert code == 0, report
    assert line(report, "engine=openai", "server:").split(maxsplit=2) == [
        "ok", "engine=openai", f"server: {models_server} answers and serves 'policy'"]
    assert FAKE_OPENAI not in report

    report, code = run_doctor("engine=openai", f"engine.base_url={models_server}", "engine.model=other",
                              "engine.api_key_env=MY_VLLM_KEY")
    assert code == 1 and "does not serve engine.model='other' (it serves ['policy'])" in report

    monkeypatch.setenv("MY_VLLM_KEY", "wrong-key-123")
    report, code = run_doctor("engine=openai", f"engine.base_url={models_server}", "engine.api_key_env=MY_VLLM_KEY")
    assert code == 1 and "HTTP 401: the server refuses $MY_VLLM_KEY" in report


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA machine")
def test_cuda_devices_are_checked_and_auto_warns_that_it_trains_on_the_cpu():
    # backend.device=auto: it runs, on the CPU (the tiny model's 32 positions fit no 2048-token completion)
    report, code = run_doctor("trainer=gpu", "trainer.sampling.max_tokens=16", "trainer.eval_max_tokens=16")
    assert code == 0, report
    assert line(report, "backend=local", "device:").startswith("  warning")
    assert "backend.device=auto trains on the CPU" in report
    report, code = run_doctor("backend.device=cuda:1")
    assert code == 1 and "backend.device=cuda:1 needs CUDA" in report


def test_offline_presets_need_their_weights_in_the_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report, code = run_doctor("model=qwen3_0_6b")
    assert code == 1
    assert line(report, "model=qwen3_0_6b").startswith("  missing")
    assert "is not in the local hub cache and HF_HUB_OFFLINE is set" in line(report, "model=qwen3_0_6b")

    hub = f"HF_HUB_OFFLINE=1: nothing is downloaded; cache {tmp_path}"
    assert line(report, "hub").split(maxsplit=2) == ["ok", "hub", hub]
    cached_model(tmp_path, "Qwen/Qwen3-0.6B")  # a real model, saved with save_pretrained, in the cache's layout
    report, code = run_doctor("model=qwen3_0_6b")
    assert code == 0, report
    assert line(report, "model=qwen3_0_6b").startswith("  ok") and "in the hub cache" in report


@pytest.fixture
def hub_server():
    with answering_hub() as url:
        yield url


def test_online_an_unreachable_hub_makes_uncached_presets_missing(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE unset and the hub a closed port: a preset not in the cache cannot run (a run would retry the
    hub for a minute, then fail); one in the cache can. Each part probes the hub once, a closed port at once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    endpoint = f"http://127.0.0.1:{unused_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    report, code = run_doctor("model=qwen3_0_6b")
    assert code == 1
    assert line(report, "hub").startswith(f"  warning  hub                    HF_HUB_OFFLINE unset but {endpoint} does "
                                          "not answer ([Errno 111] Connection refused, within a 3-s probe)")
    assert "set HF_HUB_OFFLINE=1 on this machine" in line(report, "hub")
    machine = report.partition("` needs")[0]
    assert line(machine, "model=qwen3_4b").split(maxsplit=2) == [
        "missing", "model=qwen3_4b", "Qwen/Qwen3-4B-Instruct-2507 is not in the local hub cache: the hub "
        "does not answer"]
    assert line(report, "model=qwen3_0_6b") == (
        f"  missing  model=qwen3_0_6b       files: model.name_or_path='Qwen/Qwen3-0.6B' is not in the local hub cache"
        f" and the hub does not answer (HEAD {endpoint}: [Errno 111] Connection refused, within a 3-s "
        "probe; $HF_ENDPOINT names another hub or mirror), so it cannot be downloaded. Fetch it on a machine with "
        "network (`hf download Qwen/Qwen3-0.6B`, or `huggingface-cli download Qwen/Qwen3-0.6B`) and copy its hub "
        f"cache folder models--Qwen--Qwen3-0.6B into {tmp_path} ($HF_HUB_CACHE, else $HF_HOME/hub), or set "
        "model.name_or_path to a local folder written by save_pretrained")
    assert report.splitlines()[-1] == "rlvr doctor: this run cannot run here: 1 problem(s) in model=qwen3_0_6b"
    cached_model(tmp_path, "Qwen/Qwen3-0.6B")
    report, code = run_doctor("model=qwen3_0_6b")
    assert code == 0, report
    assert line(report, "model=qwen3_0_6b").startswith("  ok       model=qwen3_0_6b       files: Qwen/Qwen3-0.6B: "
                                                       "in the hub cache (1 weight file, ")


def test_online_a_hub_that_answers_downloads_what_is_not_cached(tmp_path, monkeypatch, hub_server):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub_server)
    report, code = run_doctor("model=qwen3_0_6b")
    assert code == 0, report
    hub = f"HF_HUB_OFFLINE unset; {hub_server} answers: what is not cached is downloaded when a run starts; cache " \
          f"{tmp_path}"
    assert line(report, "hub").split(maxsplit=2) == ["ok", "hub", hub]
    assert line(report, "model=qwen3_0_6b") == (
        f"  warning  model=qwen3_0_6b       files: Qwen/Qwen3-0.6B is not in the local hub cache: "
        f"downloaded from {hub_server} when the run starts")


def test_the_slurm_launcher_needs_the_commands(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    report, code = run_doctor("hydra/launcher=slurm")
    assert code == 1
    assert "not on PATH: sbatch, squeue, sacct, scontrol" in line(report, "hydra/launcher=slurm")
    assert line(report, "slurm-cluster").split()[0] == "missing"  # not needed by the run: reported only


def test_a_campaign_checks_every_job_and_a_bad_override_is_an_error():
    report, code = run_doctor("campaign=smoke")
    assert code == 0 and "(4 jobs of the grid checked)" in report
    report, code = run_doctor("model=nope")
    assert code == 1 and "Could not find 'model/nope'" in line(report, "config")
    report, code = run_doctor("backend.micro_batch_size=7")
    assert code == 1 and "backend.micro_batch_size=7 does not divide" in line(report, "config")


def test_math_verify_that_does_not_work_fails_reward_math_only(monkeypatch):
    monkeypatch.setattr("rlvr.reward.math.MATH_VERIFY_PROBE", "raise SystemExit('math-verify broken')")
    report, code = run_doctor("reward=math")
    assert code == 1 and "math-verify broken" in line(report, "reward=math")
    report, code = run_doctor()
    assert code == 0 and line(report, "math-verify").startswith("  missing")
