"""`reward=judge`: an LLM behind an OpenAI-compatible chat-completions endpoint says whether a completion's
answer is correct given the reference answer.

Each completion is one `POST {base_url}/chat/completions`: the `system` message (when set), then `prompt`
with `{completion}` and `{reference}` filled in as the user message; `model`, temperature 0, `max_tokens`.
The requests of a batch go through `rlvr.openai_api.OpenAIClient`: concurrently, at most `max_concurrency`
in flight, each bounded by `timeout_s`. A connection error, a timeout, HTTP 429 or 5xx is retried up to
`retries` times after `backoff_s`, 2·`backoff_s`, 4·`backoff_s`, …; any other HTTP error is not retried.

Rule: lowercase the reply's `choices[0].message.content` and find the first whole word `yes` or `no`
(`\\b(yes|no)\\b`): `yes` scores 1.0, `no` 0.0, neither scores 0.0 and counts as a parse failure.
It deliberately does not score 1.0 whenever "yes" occurs anywhere in the lowercased verdict (that would make
"No, not yes" and "The eyes…" correct), nor an exception silently 0.0.

Failures never raise: a request still timing out after its retries scores 0.0 and counts as a timeout; any
other failure (HTTP error, a body that is not JSON, missing fields) scores 0.0 and counts as an error. One
warning per batch gives the counts and the first failure.

Completions are untrusted: only their last `max_completion_chars` characters are sent (the final answer is
at the end), lone surrogates become U+FFFD, and the body is ASCII JSON, so NUL bytes and control characters
travel as `\\u0000` escapes. The prompt and system message of conf/reward/judge.yaml fence the completion in
tags and tell the judge to ignore instructions inside it. The problem itself is not sent (a verifier sees
only completions and references).

The API key is read from the environment variable named by `api_key_env` at each `score` call (composing
or checking a config needs none) and only ever put in the `Authorization: Bearer` header: it is not kept
on the object nor written in any message. A missing or empty variable is a `ConfigError`, not a per-item
failure: the run checks for it before any model loads (an `EnvVar` in `needs`) and stops if it goes missing.
Every setting comes from conf/reward/judge.yaml: the constructor has no defaults of its own.
"""

from __future__ import annotations

import json
import logging
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from rlvr.openai_api import OpenAIClient, Outcome, excerpt
from rlvr.protocols import Needs
from rlvr.requirements import EnvVar, Package, pip_dependency
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores

log = logging.getLogger("rlvr")

FIELDS = ("completion", "reference")
VERDICT = re.compile(r"\b(yes|no)\b")
SURROGATE = re.compile("[\ud800-\udfff]")


class ChatJudge:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(Package("httpx", pip_dependency("httpx>=0.27")),
                              EnvVar(settings["api_key_env"], "reward.api_key_env")))

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key_env: str,
        prompt: str,
        system: str | None,
        max_tokens: int,
        timeout_s: float,
        max_concurrency: int,
        retries: int,
        backoff_s: float,
        max_completion_chars: int,
    ) -> None:
        check_template(prompt)
        rules = [
            ("model", model, bool(model), "a model name"),
            ("base_url", base_url, base_url.startswith(("http://", "https://")), "an http(s):// URL"),
            ("api_key_env", api_key_env, bool(api_key_env), "the name of an environment variable"),
            ("max_tokens", max_tokens, max_tokens > 0, "> 0"),
            ("timeout_s", timeout_s, timeout_s > 0, "> 0"),
            ("max_concurrency", max_concurrency, max_concurrency > 0, "> 0"),
            ("retries", retries, retries >= 0, ">= 0"),
            ("backoff_s", backoff_s, backoff_s >= 0, ">= 0"),
            ("max_completion_chars", max_completion_chars, max_completion_chars > 0, "> 0"),
        ]
        errors = [f"reward.{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok]
        if errors:
            raise ValueError("; ".join(errors))
        self.model, self.base_url, self.api_key_env = model, base_url, api_key_env
        self.prompt, self.system, self.max_tokens = prompt, system, max_tokens
        self.max_completion_chars = max_completion_chars
        self.client = OpenAIClient(base_url, api_key_env, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                   max_concurrency=max_concurrency, owner="reward=judge", config="reward")
        self.url = self.client.url("chat/completions")

    def __repr__(self) -> str:
        return f"ChatJudge(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        bodies = [self.body(c, r) for c, r in zip(completions, references)]
        outcomes = self.client.post_all(self.url, bodies)  # a missing key raises here, not per item
        return self._tally([_result(outcome) for outcome in outcomes])

    def body(self, completion: str, reference: str) -> bytes:
        """The request body for one completion: ASCII JSON, the completion cut to its last characters."""
        user = self.prompt.format(completion=_clean(completion[-self.max_completion_chars:]),
                                  reference=_clean(reference))
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": user}]
        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        return json.dumps(body, ensure_ascii=True).encode("ascii")

    def _tally(self, results: list[tuple[str, float, str]]) -> Scores:
        kinds = Counter(kind for kind, _, _ in results)
        failures = [message for kind, _, message in results if kind != "ok"]
        if failures:
            log.warning(
                "reward=judge (%s at %s): %d of %d completions scored 0.0 unjudged (%d timed out, %d errors, "
                "%d verdicts neither yes nor no); the first: %s", self.model, self.url, len(failures), len(results),
                kinds["timeout"], kinds["error"], kinds["parse"], self.client.redact(failures[0]),
            )
        return Scores([value for _, value, _ in results], timeouts=kinds["timeout"], errors=kinds["error"],
                      parse_failures=kinds["parse"])


def _result(outcome: Outcome) -> tuple[str, float, str]:
    """(kind, reward, message): kind is ok, parse, timeout or error."""
    if outcome.failure is None:  # outcome.ok
        assert outcome.response is not None  # no failure: the response is a 2xx
        return _verdict(outcome.response)
    return "timeout" if outcome.timed_out else "error", 0.0, outcome.failure


def _verdict(response: httpx.Response) -> tuple[str, float, str]:
    try:
        content = response.json()["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError(f"message.content is {type(content).__name__}")
    except (ValueError, KeyError, IndexError, TypeError) as err:
        return "error", 0.0, f"malformed reply ({type(err).__name__}: {err}): {excerpt(response)}"
    match = VERDICT.search(content.lower())
    if match is None:
        return "parse", 0.0, f"verdict neither yes nor no: {content[:200]!r}"
    return "ok", 1.0 if match[1] == "yes" else 0.0, ""


def _clean(text: str) -> str:
    """`text` with surrogate pairs joined and lone surrogates replaced by U+FFFD (valid Unicode to send)."""
    if SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def check_template(prompt: str) -> None:
    """`prompt` must hold `{completion}` and `{reference}` and no other placeholder."""
    usage = "reward.prompt must contain the placeholders {completion} and {reference} and no others " \
            "(a literal brace is written {{ or }})"
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(prompt) if name is not None]
    except ValueError as err:
        raise ValueError(f"{usage}: {err}") from err
    bad = sorted({"{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
                  for name, spec, conv in fields if name not in FIELDS or spec or conv})
    missing = [f"{{{name}}}" for name in FIELDS if name not in {n for n, _, _ in fields}]
    if bad or missing:
        found = [f"unexpected {', '.join(bad)}"] * bool(bad) + [f"missing {', '.join(missing)}"] * bool(missing)
        raise ValueError(f"{usage}: {'; '.join(found)}")
