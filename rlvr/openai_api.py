"""An HTTP client for OpenAI-compatible servers (vLLM's, OpenAI's, any `/v1` API): what `engine=openai`,
`reward=judge` and `rlvr doctor` send requests with.

The key. `api_key_env` names the environment variable holding the API key (None: send none). It is read when
a request or a batch starts, never kept on an object, and only ever put in the `Authorization: Bearer`
header. A variable that is unset, empty or holds characters an HTTP header cannot carry is a `ConfigError`
naming the variable and the config key that named it, never the value; failure messages carry `<key>`
where a server echoed the key.

Retries. Each attempt is bounded by `timeout_s` (httpx's per-phase timeouts, and a deadline on the whole
attempt). A connection error, a timeout, HTTP 429 or 5xx is retried `retries` times, retry k after
`backoff_s · 2^(k-1)` seconds; any other status ends the request at once. The last attempt decides the
outcome: its response whatever the status, or its failure when it got none.

Concurrency. A batch (`post_all`, `post_all_json`) runs its requests concurrently, at most `max_concurrency`
in flight (a semaphore, and as many pooled connections), and returns one reply per body, in order.

Bodies. A dict is sent as ASCII JSON (NUL bytes, control characters and non-ASCII travel as `\\u` escapes),
bytes as they are; either with `Content-Type: application/json`.

Every method is synchronous: it runs its own event loop (`asyncio.run`), so none can be called from inside a
running one.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, overload

import httpx

from rlvr.errors import ConfigError
from rlvr.requirements import header_safe

Body = Mapping[str, Any] | bytes
"""A request body: a JSON object, or one already encoded."""


class ServerError(RuntimeError):
    """A request failed for good (no reply after its retries, or a reply that is not what was asked for)."""


@dataclass(frozen=True)
class Outcome:
    """How one request ended, after its retries."""

    response: httpx.Response | None
    """The last attempt's response, whatever its status; None when the last attempt got none."""
    failure: str | None
    """None when `response` is a 2xx; otherwise what the last attempt got: `HTTP <status>: <body excerpt>`, a
    timeout or a connection error (never the key)."""
    timed_out: bool
    """The last attempt got no reply within `timeout_s`."""
    attempts: int

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class ModelListing:
    """What `GET {base_url}/models` answered."""

    url: str
    status: int | None
    """The HTTP status of the last attempt; None when no reply came (`failure` says why)."""
    models: dict[str, dict[str, Any]]
    """Served model id → its card (vLLM's carries `max_model_len`), in the server's order; empty unless a
    model list came back."""
    failure: str | None
    """None when a model list came back; otherwise `HTTP <status>: <body excerpt>`, `HTTP 200 with no model
    list: …`, or the failure that left no reply (a timeout, a connection error)."""
    attempts: int


def read_api_key(api_key_env: str | None, needed_by: str, named_by: str | None) -> str | None:
    """The key in `$api_key_env` (None when `api_key_env` is None). `needed_by` names who needs it
    ("engine=openai") and `named_by` the config key naming the variable ("engine.api_key_env"): a ConfigError
    names both and the variable, never the value, when the variable is unset, empty, or holds characters an
    HTTP header cannot carry."""
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env, "").strip()
    where = f" ({named_by})" if named_by else ""
    if not key:
        raise ConfigError(f"{needed_by} needs an API key in ${api_key_env}{where}")
    if not header_safe(key):  # httpx would put the bad header, key and all, in its error
        raise ConfigError(f"${api_key_env}{where} holds characters an HTTP header cannot carry")
    return key


def probe_models(base_url: str, api_key_env: str | None, timeout_s: float) -> ModelListing:
    """One `GET {base_url}/models` attempt within `timeout_s`, no retry, for a check that must be quick
    (`rlvr doctor`). The key in `$api_key_env` is sent when it is set and header-safe, and otherwise no key
    (a missing key is for the caller's own check to report): a 401 then shows as `status == 401`."""
    key = os.environ.get(api_key_env, "").strip() if api_key_env else ""
    usable = api_key_env if key and header_safe(key) else None
    client = OpenAIClient(base_url, usable, timeout_s=timeout_s, retries=0, backoff_s=0.0, max_concurrency=1,
                          owner="rlvr doctor", config=None)
    return client.list_models()


def excerpt(response: httpx.Response) -> str:
    """The start of a response's body, quoted, for a message."""
    return repr(response.text[:300])


class OpenAIClient:
    """Requests to one OpenAI-compatible server, retried and bounded as the module says.

    `owner` names the user in messages ("engine=openai"); `config` is the config group holding these
    settings ("engine"), so that messages name its keys (`engine.api_key_env`, `engine.timeout_s`); None names
    none. A method's `url` is a path under `base_url` ("completions", "/models") or an absolute URL (a
    server's root endpoints)."""

    def __init__(
        self,
        base_url: str,
        api_key_env: str | None,
        *,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        max_concurrency: int,
        owner: str,
        config: str | None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r} must be an http(s):// URL")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or max_concurrency < 1:
            raise ValueError(f"need timeout_s > 0, retries >= 0, backoff_s >= 0, max_concurrency >= 1; got "
                             f"{timeout_s}, {retries}, {backoff_s}, {max_concurrency}")
        self.base_url = base_url.rstrip("/")
        self.api_key_env, self.owner, self.config = api_key_env, owner, config
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_concurrency = max_concurrency

    def __repr__(self) -> str:
        return f"OpenAIClient(base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def url(self, path_or_url: str) -> str:
        if "://" in path_or_url:
            return path_or_url
        return f"{self.base_url}/{path_or_url.lstrip('/')}"

    def read_key(self) -> str | None:
        """The API key (None when `api_key_env` is None); a ConfigError naming the variable when it is unusable."""
        return read_api_key(self.api_key_env, self.owner, self._key("api_key_env"))

    def redact(self, text: str) -> str:
        """`text` with the current key, if any, replaced by `<key>`."""
        key = os.environ.get(self.api_key_env, "").strip() if self.api_key_env else ""
        return text.replace(key, "<key>") if key else text

    # ---- the calls --------------------------------------------------------------------------------------------

    def request(self, method: str, url: str, body: Body | None = None) -> httpx.Response:
        """One request, retried; the last response whatever its status. ServerError when no response came."""
        outcome = self.send(method, url, body)
        if outcome.response is None:
            raise self._error(method, self.url(url), outcome)
        return outcome.response

    def send(self, method: str, url: str, body: Body | None = None) -> Outcome:
        """One request, retried; how it ended (never raises for the server's or the network's failures)."""

        async def go() -> Outcome:
            async with self._session(1) as (client, key):
                return await self._send(client, key, method, self.url(url), _encode(body))

        return asyncio.run(go())

    def post_all(self, url: str, bodies: Sequence[Body]) -> list[Outcome]:
        """`POST url` once per body, concurrently; one Outcome per body, in order. A request that raises
        something unexpected is a failed Outcome too: nothing raises but a ConfigError for the key."""
        return asyncio.run(self._post_all(self.url(url), [_encode(b) for b in bodies], strict=False))

    def post_all_json(self, url: str, bodies: Sequence[Body]) -> list[Any]:
        """`POST url` once per body, concurrently; the replies' JSON, in order. ServerError as soon as one
        request ends without a 2xx JSON reply."""
        return asyncio.run(self._post_all(self.url(url), [_encode(b) for b in bodies], strict=True))

    def stream_all(self, url: str, bodies: Sequence[Mapping[str, Any]], event: Callable[[int, dict], bool]) -> None:
        """Each body (a dict: `"stream": true` is added) POSTed as a server-sent-event stream, concurrently, at most
        `max_concurrency` open; each event's JSON handed to `event(i, data)`, in arrival order. Once it returns
        True every stream still open is closed (a vLLM server aborts a request whose client has gone). A stream is
        not retried: a failure raises ServerError, naming the server's answer."""
        asyncio.run(self._stream_all(self.url(url), [_encode(dict(b) | {"stream": True}) for b in bodies], event))

    def list_models(self) -> ModelListing:
        """`GET {base_url}/models`, retried; never raises for the server's or the network's failures."""
        url = self.url("models")
        outcome = self.send("GET", url)
        if not outcome.ok:
            status = None if outcome.response is None else outcome.response.status_code
            return ModelListing(url, status, {}, outcome.failure, outcome.attempts)
        response = outcome.response
        assert response is not None  # an ok outcome is a 2xx response
        try:
            cards = response.json().get("data", [])
            models = {card.get("id"): card for card in cards}
        except (ValueError, AttributeError, TypeError):
            failure = f"HTTP {response.status_code} with no model list: {excerpt(response)}"
            return ModelListing(url, response.status_code, {}, failure, outcome.attempts)
        return ModelListing(url, response.status_code, models, None, outcome.attempts)

    # ---- underneath -------------------------------------------------------------------------------------------

    def _key(self, name: str) -> str | None:
        return f"{self.config}.{name}" if self.config else None

    def _error(self, method: str, url: str, outcome: Outcome) -> ServerError:
        if outcome.response is None:
            return ServerError(f"{self.owner}: {method} {url} failed after {outcome.attempts} attempts: "
                               f"{outcome.failure}")
        return ServerError(f"{self.owner}: {method} {url} answered {outcome.failure}")

    @asynccontextmanager
    async def _session(self, connections: int) -> AsyncIterator[tuple[httpx.AsyncClient, str | None]]:
        key = self.read_key()
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(headers=headers, timeout=self.timeout_s, limits=limits) as client:
            yield client, key

    async def _post_all(self, url: str, contents: list[bytes], strict: bool) -> list[Any]:
        gate = asyncio.Semaphore(self.max_concurrency)
        async with self._session(self.max_concurrency) as (client, key):

            async def one(content: bytes) -> Any:
                async with gate:
                    try:
                        outcome = await self._send(client, key, "POST", url, content)
                    except Exception as err:
                        if strict:
                            raise
                        outcome = Outcome(None, _redact(f"{type(err).__name__}: {err}", key), False, 1)
                if not strict:
                    return outcome
                if not outcome.ok:
                    raise self._error("POST", url, outcome)
                response = outcome.response
                assert response is not None  # an ok outcome is a 2xx response
                try:
                    return response.json()
                except ValueError as err:
                    raise ServerError(f"{self.owner}: POST {url} answered HTTP {response.status_code} "
                                      f"with a body that is not JSON: {excerpt(response)}") from err

            return await asyncio.gather(*(one(c) for c in contents))

    async def _stream_all(self, url: str, contents: list[bytes], event: Callable[[int, dict], bool]) -> None:
        gate, enough = asyncio.Semaphore(self.max_concurrency), asyncio.Event()
        headers = {"Content-Type": "application/json"}
        async with self._session(self.max_concurrency) as (client, key):

            async def one(i: int, content: bytes) -> None:
                async with gate:
                    try:
                        await read(i, content)
                    except (httpx.TransportError, httpx.TimeoutException) as err:
                        raise ServerError(f"{self.owner}: POST {url} (a stream) failed: "
                                          f"{_redact(f'{type(err).__name__}: {err}', key)}") from err

            async def read(i: int, content: bytes) -> None:
                async with client.stream("POST", url, content=content, headers=headers) as response:
                    if not response.is_success:
                        await response.aread()
                        raise self._error("POST", url, Outcome(response, _redact(
                            f"HTTP {response.status_code}: {excerpt(response)}", key), False, 1))
                    async for line in response.aiter_lines():
                        data = line.removeprefix("data:").strip()
                        if not line.startswith("data:") or data == "[DONE]":
                            continue
                        if event(i, json.loads(data)):
                            enough.set()
                            return

            streams = [asyncio.ensure_future(one(i, c)) for i, c in enumerate(contents)]
            try:
                running = set(streams)
                while running and not enough.is_set():  # a stream that returns has ended, or said enough
                    ended, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in ended:
                        task.result()  # a failed stream's error, raised here
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)

    async def _send(
        self, client: httpx.AsyncClient, key: str | None, method: str, url: str, content: bytes | None
    ) -> Outcome:
        headers = {} if content is None else {"Content-Type": "application/json"}
        failure, timed_out = "", False
        for attempt in range(1, self.retries + 2):
            if attempt > 1:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 2))
            try:
                response = await asyncio.wait_for(
                    client.request(method, url, content=content, headers=headers), self.timeout_s
                )
            except (TimeoutError, httpx.TimeoutException):
                timeout = self._key("timeout_s")
                failure = f"no reply within {timeout}={self.timeout_s:g}" if timeout else \
                    f"no reply within {self.timeout_s:g} s"
                timed_out = True
                continue
            except httpx.TransportError as err:
                failure, timed_out = _redact(f"{type(err).__name__}: {err}", key), False
                continue
            if response.status_code != 429 and response.status_code < 500 or attempt == self.retries + 1:
                bad = None if response.is_success else _redact(f"HTTP {response.status_code}: {excerpt(response)}", key)
                return Outcome(response, bad, False, attempt)
        return Outcome(None, failure, timed_out, self.retries + 1)


@overload
def _encode(body: Body) -> bytes: ...


@overload
def _encode(body: None) -> None: ...


def _encode(body: Body | None) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    return json.dumps(body, ensure_ascii=True, allow_nan=False).encode("ascii")


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "<key>") if key else text
