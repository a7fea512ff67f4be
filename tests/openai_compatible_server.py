"""A loopback OpenAI-compatible chat-completions server for tests (no real endpoint is reachable in CI), and
`chat_judge`, the judge as conf/reward/judge.yaml builds it.

`GET /v1/models` lists `models` (each card with `max_model_len: 64`). `POST /v1/chat/completions` answers in
the OpenAI response shape. The verdict comes from the last message: "Yes." if the text between <reference>
and </reference> occurs in the text between <response> and the last </response> (the judge prompt's tags),
"No" otherwise. Directives anywhere in that message change it:

    [[sleep:S]]       wait S seconds before answering
    [[status:C]]      answer HTTP C every time
    [[status:C:N]]    answer HTTP C to the first N requests carrying this exact message, then normally
    [[reply:TEXT]]    reply TEXT instead of a verdict
    [[malformed]]     a 200 whose body is not JSON
    [[no-choices]]    a 200 with an empty `choices` list

With `api_key` set, a request without `Authorization: Bearer <api_key>` gets a 401. Every request is
recorded in `requests` (method, path, headers, parsed body); `max_in_flight` is the most requests being
handled at once; `hold_s` delays every answer (so that concurrency shows).

    with OpenAICompatibleServer() as server:
        chat_judge(base_url=server.base_url).score(...)
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DIRECTIVE = re.compile(r"\[\[(sleep|status|reply|malformed|no-choices)(?::(.*?))?\]\]", re.S)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def conf_values(option: str, **overrides) -> dict:
    """The keys of conf/<option>.yaml (e.g. "reward/judge") but `_target_` (and an env's tool keys), with `overrides`
    applied. A `# @package _global_` option (env/guess: the environment and its demo's knobs) gives its group's node."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{option}.yaml"), resolve=True)
    group = option.split("/")[0]
    if "_target_" not in values and isinstance(values.get(group), dict):
        values = values[group]
    values.pop("_target_", None)
    if group == "env":  # the tool harness's keys (rlvr/tools/harness.py) are not the environment's own
        from rlvr.tools import TOOL_KEYS

        values = {k: v for k, v in values.items() if k not in TOOL_KEYS}
    unknown = set(overrides) - set(values)
    if unknown:
        raise TypeError(f"conf/{option}.yaml has no {sorted(unknown)}")
    return values | overrides


def chat_judge(**overrides):
    """A ChatJudge built from conf/reward/judge.yaml's values, with `overrides`."""
    from rlvr.reward.judge import ChatJudge

    return ChatJudge(**conf_values("reward/judge", **overrides))


class OpenAICompatibleServer:
    def __init__(
        self, api_key: str | None = None, hold_s: float = 0.0, models: Sequence[str] = ("test-model",)
    ) -> None:
        self.api_key, self.hold_s, self.models = api_key, hold_s, list(models)
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.attempts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = Listener(("127.0.0.1", 0), Handler)
        self.httpd.fake = self
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> OpenAICompatibleServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()  # ends any sleep in progress
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests]

    def answer(self, method: str, path: str, headers: dict, raw: bytes) -> tuple[int, bytes]:
        """(status, body) for one request."""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self.lock:
            self.requests.append({"method": method, "path": path, "headers": headers, "body": body})
        route = (method, path)
        if route not in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            return 404, _json({"error": {"message": f"no route {method} {path}"}})
        if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, _json({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
        if method == "GET":
            self.stopping.wait(self.hold_s)
            return 200, _json({"object": "list", "data": [{"id": m, "object": "model", "max_model_len": 64}
                                                          for m in self.models]})
        if not isinstance(body, dict) or not body.get("messages"):
            return 400, _json({"error": {"message": "messages is required"}})
        text = body["messages"][-1]["content"]
        with self.lock:
            self.attempts[text] += 1
            attempt = self.attempts[text]
        self.stopping.wait(self.hold_s)
        reply = verdict(text)
        for name, arg in DIRECTIVE.findall(text):
            if name == "sleep":
                self.stopping.wait(float(arg))
            elif name == "status":
                code, _, times = arg.partition(":")
                if not times or attempt <= int(times):
                    return int(code), _json({"error": {"message": f"fake HTTP {code}"}})
            elif name == "reply":
                reply = arg
            elif name == "malformed":
                return 200, b'{"choices": [{"message": '
            elif name == "no-choices":
                return 200, _json({"id": "chatcmpl-fake", "object": "chat.completion", "choices": []})
        return 200, _json({
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(text) // 4, "completion_tokens": 2, "total_tokens": len(text) // 4 + 2},
        })


def verdict(text: str) -> str:
    start, end = text.find("<reference>"), text.find("</reference>")
    reference = text[start + len("<reference>"):end].strip() if 0 <= start < end else ""
    start, end = text.find("<response>"), text.rfind("</response>")
    response = text[start + len("<response>"):end] if 0 <= start < end else ""
    return "Yes." if reference and reference in response else "No"


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the stdlib's 5 drops a burst of concurrent connects (they retry after 1 s)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        fake: OpenAICompatibleServer = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with fake.lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            status, body = fake.answer(self.command, self.path, dict(self.headers), raw)
        finally:
            with fake.lock:
                fake.in_flight -= 1
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (timed out) while we slept
            self.close_connection = True

    do_GET = do_POST  # noqa: N815 - the stdlib's name

    def log_message(self, format, *args) -> None:  # noqa: A002 - quiet
        pass
