"""rlvr.openai_api.OpenAIClient against the loopback OpenAI-compatible server (tests/openai_compatible_server.py):
what is sent, what is retried and how long it waits, timeouts, bounded concurrency, the key."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from openai_compatible_server import OpenAICompatibleServer

from rlvr.errors import ConfigError
from rlvr.openai_api import OpenAIClient, ServerError, probe_models

KEY_ENV = "RLVR_TEST_CLIENT_KEY"
KEY = "sk-fake-client-0123456789abcdef"


def client(base_url: str, **knobs) -> OpenAIClient:
    settings = {"api_key_env": KEY_ENV, "timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, "max_concurrency": 8,
                "owner": "test=client", "config": "test"} | knobs
    return OpenAIClient(base_url, **settings)


def chat(text: str) -> dict:
    return {"model": "test-model", "messages": [{"role": "user", "content": text}]}


def content(outcome) -> str:
    return outcome.response.json()["choices"][0]["message"]["content"]


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with OpenAICompatibleServer(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def closed_url():
    with OpenAICompatibleServer() as fake:
        url = fake.base_url
    return url  # nothing listens there any more: connections are refused


def test_5xx_and_429_are_retried_other_4xx_are_not(server):
    texts = ["[[status:500:2]] a", "[[status:429:1]] b", "[[status:503]] c", "[[status:400]] d", "[[status:401]] e",
             "[[status:404]] f", "plain g"]
    outcomes = client(server.base_url, retries=2).post_all("chat/completions", [chat(t) for t in texts])
    assert [o.attempts for o in outcomes] == [3, 2, 3, 1, 1, 1, 1]
    assert [server.attempts[t] for t in texts] == [3, 2, 3, 1, 1, 1, 1]
    assert [o.ok for o in outcomes] == [True, True, False, False, False, False, True]
    assert [o.response.status_code for o in outcomes] == [200, 200, 503, 400, 401, 404, 200]
    assert outcomes[2].failure.startswith("HTTP 503: ") and "fake HTTP 503" in outcomes[2].failure
    assert not any(o.timed_out for o in outcomes)


def test_backoff_doubles_from_backoff_s(closed_url, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    start = time.monotonic()
    (outcome,) = client(closed_url, retries=3, backoff_s=0.2).post_all("chat/completions", [chat("x")])
    elapsed = time.monotonic() - start
    assert outcome.response is None and outcome.attempts == 4 and not outcome.timed_out
    assert outcome.failure.startswith("ConnectError")
    assert 0.2 + 0.4 + 0.8 <= elapsed < 1.4 + 1.0, elapsed  # refused at once: the waits are all there is


def test_a_timeout_is_retried_then_reported_as_one(server):
    start = time.monotonic()
    outcomes = client(server.base_url, timeout_s=0.3, retries=1).post_all(
        "chat/completions", [chat("[[sleep:5]] slow"), chat("fast")])
    elapsed = time.monotonic() - start
    slow, fast = outcomes
    assert slow.timed_out and slow.response is None and slow.attempts == 2
    assert slow.failure == "no reply within test.timeout_s=0.3"
    assert fast.ok and not fast.timed_out
    assert elapsed < 0.3 * 2 + 0.01 + 1.5, elapsed  # timeout_s × (retries + 1) + backoff + slack


def test_concurrency_is_bounded_and_replies_keep_their_order(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with OpenAICompatibleServer(api_key=KEY, hold_s=0.2) as server:
        outcomes = client(server.base_url, max_concurrency=3).post_all(
            "chat/completions", [chat(f"[[reply:{i}]]") for i in range(12)])
    assert [content(o) for o in outcomes] == [str(i) for i in range(12)]
    assert server.max_in_flight == 3


def test_the_key_is_sent_as_a_bearer_header_with_json_bodies(server):
    c = client(server.base_url)
    (outcome,) = c.post_all("/chat/completions", [chat("nul\x00 é \ud83d\ude00")])
    assert outcome.ok
    (request,) = server.requests
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["body"]["messages"][0]["content"] == "nul\x00 é \U0001F600"
    assert KEY not in repr(c) and KEY not in repr(vars(c))
    assert c.redact(f"echo: Bearer {KEY}") == "echo: Bearer <key>"


def test_no_key_env_sends_no_key(server):
    (outcome,) = client(server.base_url, api_key_env=None).post_all("chat/completions", [chat("x")])
    assert outcome.response.status_code == 401 and outcome.attempts == 1
    assert "Authorization" not in server.requests[0]["headers"]


@pytest.mark.parametrize("value", [None, "", "   ", "sk-secret\nline", "sk-sécret"])
def test_an_unusable_key_is_a_config_error_naming_the_variable_not_the_value(monkeypatch, server, value):
    if value is None:
        monkeypatch.delenv(KEY_ENV)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    c = client(server.base_url)
    for call in (c.read_key, lambda: c.post_all("chat/completions", [chat("x")]), lambda: c.list_models(),
                 lambda: c.request("GET", "models"), lambda: c.post_all_json("chat/completions", [])):
        with pytest.raises(ConfigError) as err:
            call()
        message = str(err.value)
        assert f"${KEY_ENV} (test.api_key_env)" in message
        assert ("needs an API key" in message) == (not (value or "").strip())
        assert "sk-s" not in message
    assert not server.requests  # nothing was sent


def test_request_returns_the_last_response_or_raises_when_none_came(server, closed_url):
    c = client(server.base_url)
    response = c.request("POST", "no/such/route", {"a": 1})
    assert response.status_code == 404 and server.requests[-1]["path"] == "/v1/no/such/route"
    assert c.request("POST", f"{server.base_url}/chat/completions", chat("x")).json()["object"] == "chat.completion"
    with pytest.raises(ServerError, match=r"^test=client: GET .*/models failed after 3 attempts: ConnectError"):
        client(closed_url).request("GET", "models")


def test_post_all_json_raises_on_the_first_failure(server):
    c = client(server.base_url)
    replies = c.post_all_json("chat/completions", [chat("[[reply:a]]"), chat("[[status:502:1]] [[reply:b]]")])
    assert [r["choices"][0]["message"]["content"] for r in replies] == ["a", "b"]
    with pytest.raises(ServerError, match=r"^test=client: POST .*/chat/completions answered HTTP 502: "):
        c.post_all_json("chat/completions", [chat("ok"), chat("[[status:502]]")])
    with pytest.raises(ServerError, match="with a body that is not JSON"):
        c.post_all_json("chat/completions", [chat("[[malformed]]")])


def test_list_models(monkeypatch, closed_url):
    monkeypatch.setenv(KEY_ENV, KEY)
    with OpenAICompatibleServer(api_key=KEY, models=["b-model", "a-model"]) as server:
        listing = client(server.base_url).list_models()
        assert (listing.status, listing.failure, list(listing.models)) == (200, None, ["b-model", "a-model"])
        assert listing.models["a-model"]["max_model_len"] == 64 and listing.url == f"{server.base_url}/models"
        refused = client(server.base_url, api_key_env=None).list_models()
        assert refused.status == 401 and refused.failure.startswith("HTTP 401: ") and not refused.models
    gone = client(closed_url).list_models()
    assert gone.status is None and gone.attempts == 3 and gone.failure.startswith("ConnectError")


def test_probe_models_makes_one_quick_attempt_with_the_key_if_usable(monkeypatch, closed_url):
    with OpenAICompatibleServer(api_key=KEY) as server:
        monkeypatch.setenv(KEY_ENV, KEY)
        assert list(probe_models(server.base_url, KEY_ENV, 3.0).models) == ["test-model"]
        assert server.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
        for value in ("", "sk-secret\nline"):  # unusable: sent none, reported by the server's 401
            monkeypatch.setenv(KEY_ENV, value)
            listing = probe_models(server.base_url, KEY_ENV, 3.0)
            assert listing.status == 401 and listing.attempts == 1
            assert "Authorization" not in server.requests[-1]["headers"]
        assert probe_models(server.base_url, None, 3.0).status == 401
    gone = probe_models(closed_url, None, 3.0)
    assert gone.status is None and gone.attempts == 1 and gone.failure.startswith("ConnectError")
    with OpenAICompatibleServer(hold_s=5.0) as slow:
        start = time.monotonic()
        listing = probe_models(slow.base_url, None, 0.3)
        assert listing.status is None and listing.failure == "no reply within 0.3 s"
        assert time.monotonic() - start < 1.5


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="http"):
        client("127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="max_concurrency >= 1"):
        client("http://127.0.0.1:9/v1", max_concurrency=0)


class Streams(BaseHTTPRequestHandler):
    """Server-sent events, as vLLM streams a completion: `{"prompt": [n]}` gets 3·n events 20 ms apart, the last
    with a finish_reason, then `data: [DONE]`; n = 0 is answered HTTP 500. Whether each stream's client left
    before its end goes to `server.left[n]`."""

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"][0]
        if n == 0:
            self.send_response(500)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"oops!")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(3 * n):
                end = "length" if i == 3 * n - 1 else None
                self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, 'finish_reason': end}]})}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.02)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.server.left[n] = False  # type: ignore[attr-defined]
        except (BrokenPipeError, ConnectionResetError):
            self.server.left[n] = True  # type: ignore[attr-defined]

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet
        pass


def test_streams_are_read_as_events_arrive_and_closed_once_enough(monkeypatch):
    """stream_all (engine=openai's partial rollouts): once `event` says enough, the streams still open are closed
    (a vLLM server then aborts their requests); a stream answered with an error status raises, naming it."""
    monkeypatch.setenv(KEY_ENV, KEY)
    listener = ThreadingHTTPServer(("127.0.0.1", 0), Streams)
    listener.left = {}  # type: ignore[attr-defined]
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{listener.server_address[1]}/v1"
    try:
        events: dict[int, int] = {}

        def event(i: int, data: dict) -> bool:
            events[i] = events.get(i, 0) + 1
            return data["choices"][0]["finish_reason"] is not None  # the first stream to end is enough

        client(url).stream_all("completions", [{"prompt": [n]} for n in (1, 20, 40)], event)
        assert events[0] == 3 and events[1] < 60 and events[2] < 120, events
        deadline = time.monotonic() + 10
        while len(listener.left) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.left == {1: False, 20: True, 40: True}
        with pytest.raises(ServerError, match="answered HTTP 500: 'oops!'"):
            client(url).stream_all("completions", [{"prompt": [0]}, {"prompt": [5]}], lambda i, data: False)
    finally:
        listener.shutdown()
