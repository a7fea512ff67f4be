"""`distill.teacher` = a server: a frozen teacher behind an OpenAI-compatible server that returns prompt
log-probabilities (vLLM's `prompt_logprobs` extension of `/v1/completions`).

Each row is one `POST {base_url}/completions` with `prompt` = the row's prompt ids then its completion ids (token
ids, so nothing is re-tokenized), `max_tokens: 1` and `prompt_logprobs: k` (0 for the sampled tokens only). vLLM
answers `choices[0].prompt_logprobs`: one entry per prompt position, None for the first, each {token id (a JSON
string): {logprob, rank, decoded_token}} holding the actual token and the k most likely ones (k + 1 entries when
the actual token is not among them). Completion token t is prompt position len(prompt) + t: its log-probability is
that entry's value under its own id, and the top-k are that entry's k best by rank, ordered by log-probability
descending. No temperature is sent: vLLM computes prompt log-probabilities from the untempered logits (a server
started with `--logprobs-mode raw_logits` or `processed_logits` returns logits instead: start it with the default
mode). A row of length 0 sends no request.

Limits of the server. vLLM refuses `prompt_logprobs` above its `--max-logprobs` (default 20) with HTTP 400, so a
top-k over it fails at the request, saying so. A row must also fit the server's max_model_len with one position to
spare: vLLM clamps `max_tokens` to the room left and refuses 0. A server that answers without `prompt_logprobs` (not
vLLM) is refused with a ServerError naming `distill.teacher.base_url`.

Requests go through `rlvr.openai_api.OpenAIClient`: concurrently, at most `max_concurrency` in flight, each bounded
by `timeout_s`, retried `retries` times after `backoff_s`, 2·`backoff_s`, … on a connection error, a timeout,
HTTP 429 or 5xx; a request still failing after its retries raises (the step cannot go on without the teacher).
The API key: `api_key_env: null` sends none (a local server); otherwise it is read from that variable (at
construction, so a missing key fails before any model work, and at each request), only ever put in the
`Authorization: Bearer` header.

`vocabulary_check` asks the server's `/tokenize` (vLLM's, at the server's root) for a few probe strings and
compares the ids with the student tokenizer's: teacher and student must share the token ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlvr.engine.openai import ServerServes
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.openai_api import OpenAIClient, ServerError
from rlvr.protocols import Needs
from rlvr.requirements import EnvVar, Package, pip_dependency
from rlvr.types import TeacherScores

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

CONFIG = "distill.teacher"
PROBE_TEXTS = ("0123456789", "12+34=46", "The quick brown fox", " leading  and trailing spaces ",
               "Hello, world! (a+b)*c = d; e? 'f' \"g\"", "line one\nline two\ttab")
"""What `vocabulary_check` tokenizes on both sides: digits, words, spaces, punctuation (and the student's EOS)."""


class ServerTeacher:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        key = settings["api_key_env"]
        return Needs(machine=(Package("httpx", pip_dependency("httpx>=0.27")),
                              *((EnvVar(key, f"{CONFIG}.api_key_env"),) if key else ()),
                              ServerServes(settings["base_url"], settings["model"], key, CONFIG, "teacher server")))

    @classmethod
    def memory(cls, settings: Mapping[str, Any]) -> str:
        """`rlvr plan`'s line: nothing here, a request per row a step."""
        return (f"distillation teacher on its server ({settings.get('base_url')}): no memory here, one request per "
                "row each step")

    def __init__(self, *, model: str, base_url: str, api_key_env: str | None, timeout_s: float,
                 max_concurrency: int, retries: int, backoff_s: float) -> None:
        rules = [
            ("model", model, isinstance(model, str) and bool(model), "the served model name"),
            ("base_url", base_url, isinstance(base_url, str) and base_url.startswith(("http://", "https://")),
             "an http(s):// URL"),
            ("api_key_env", api_key_env, api_key_env is None or (isinstance(api_key_env, str) and bool(api_key_env)),
             "null (no key: a local server) or the name of an environment variable"),
            ("timeout_s", timeout_s, _number(timeout_s) and timeout_s > 0, "> 0"),
            ("max_concurrency", max_concurrency, _integer(max_concurrency) and max_concurrency > 0, "an integer > 0"),
            ("retries", retries, _integer(retries) and retries >= 0, "an integer >= 0"),
            ("backoff_s", backoff_s, _number(backoff_s) and backoff_s >= 0, ">= 0"),
        ]
        errors = [f"{CONFIG}.{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok]
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        self.model, self.api_key_env = model, api_key_env
        self.client = OpenAIClient(base_url, api_key_env, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                   max_concurrency=max_concurrency, owner=CONFIG, config=CONFIG)
        self.client.read_key()  # a missing key fails at construction, before any model work
        self.base_url = self.client.base_url
        self.root = self.base_url.removesuffix("/v1")

    def __repr__(self) -> str:
        return f"ServerTeacher(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def describe(self) -> str:
        return f"server {self.model} at {self.base_url}"

    def load(self, device: Any = "cpu") -> None:
        """Nothing to load here: the weights are the server's."""

    def score(self, prompts: Sequence[Sequence[int]], completions_N_T: Tensor, lengths: Sequence[int], topk: int = 0
              ) -> TeacherScores:
        rows = check_rows(prompts, completions_N_T, lengths, topk)
        N, T = completions_N_T.shape
        logprobs = torch.zeros(N, T)
        ids = torch.zeros(N, T, topk, dtype=torch.long) if topk else None
        top = torch.zeros(N, T, topk) if topk else None
        asked = [i for i in range(N) if rows[i][1]]
        bodies = [{"model": self.model, "prompt": [*rows[i][0], *rows[i][1]], "max_tokens": 1, "prompt_logprobs": topk}
                  for i in asked]
        for i, reply in zip(asked, self._post(bodies, topk)):
            prompt_len, completion = len(rows[i][0]), rows[i][1]
            entries = self._entries(reply, prompt_len + len(completion))
            for t, token in enumerate(completion):
                entry = entries[prompt_len + t]
                logprobs[i, t] = self._logprob(entry, token, prompt_len + t)
                if ids is not None and top is not None:
                    best = self._best(entry, topk, prompt_len + t)
                    ids[i, t] = torch.tensor([token_id for token_id, _ in best])
                    top[i, t] = torch.tensor([value for _, value in best])
        return TeacherScores(logprobs, ids, top)

    def vocabulary_check(self, student_tokenizer: Any) -> str | None:
        """None when the server's tokenizer gives the student tokenizer's ids for every probe string (digits,
        words, spaces, punctuation, the student's EOS text); else the first disagreement, on one line."""
        texts = [*PROBE_TEXTS, *([student_tokenizer.eos_token] if student_tokenizer.eos_token else [])]
        bodies = [{"model": self.model, "prompt": text, "add_special_tokens": False} for text in texts]
        try:
            replies = self.client.post_all_json(f"{self.root}/tokenize", bodies)
        except ServerError as err:
            raise ServerError(f"{err}\n{CONFIG}.base_url={self.base_url}: the tokenizer check needs the server's "
                              f"{self.root}/tokenize (vLLM's)") from err
        for text, reply in zip(texts, replies):
            theirs = reply.get("tokens") if isinstance(reply, dict) else None
            if not isinstance(theirs, list):
                raise ServerError(f"{CONFIG}: POST {self.root}/tokenize answered no token list: {str(reply)[:200]!r}")
            ours = list(student_tokenizer.encode(text, add_special_tokens=False))
            if ours != theirs:
                at = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                return (f"{text!r} is {ours[:16]} for the student's tokenizer but {theirs[:16]} for the teacher at "
                        f"{self.base_url} (first difference at token {at})")
        return None

    def _post(self, bodies: list[dict[str, Any]], topk: int) -> list[Any]:
        """The replies, in order; a ServerError naming distill.teacher.base_url (and --max-logprobs when the server
        refused the top-k) when a request fails for good."""
        if not bodies:
            return []
        try:
            return self.client.post_all_json("completions", bodies)
        except ServerError as err:
            text = str(err)
            if topk and "HTTP 400" in text and "logprobs" in text:
                raise ServerError(f"{text}\n{CONFIG}: topk={topk} asks the teacher at {CONFIG}.base_url="
                                  f"{self.base_url} for {topk} prompt log-probabilities per position, more than it "
                                  f"allows: start vLLM with --max-logprobs {topk} or more (its default is 20), or "
                                  "ask for fewer") from err
            raise ServerError(f"{text}\n{CONFIG}.base_url={self.base_url}: the teacher's server failed to score "
                              f"(is it up, and does it serve {CONFIG}.model={self.model!r}?)") from err

    def _entries(self, reply: Any, width: int) -> list[Any]:
        """`choices[0].prompt_logprobs` of one reply: a list of `width` entries."""
        try:
            entries = reply["choices"][0].get("prompt_logprobs")
        except (KeyError, IndexError, TypeError, AttributeError):
            entries = None
        if not isinstance(entries, list):
            raise ServerError(f"{CONFIG}.base_url={self.base_url}: the server answered without prompt "
                              "log-probabilities (choices[0].prompt_logprobs): a teacher's server must return them "
                              f"(vLLM's prompt_logprobs); it answered {str(reply)[:200]!r}")
        if len(entries) != width:
            raise ServerError(f"{CONFIG}.base_url={self.base_url}: prompt_logprobs has {len(entries)} entries for a "
                              f"prompt of {width} tokens")
        return entries

    def _logprob(self, entry: Any, token: int, at: int) -> float:
        value = entry.get(str(token)) if isinstance(entry, dict) else None
        if not isinstance(value, dict) or not _number(value.get("logprob")):
            raise ServerError(f"{CONFIG}.base_url={self.base_url}: prompt_logprobs[{at}] lacks the actual token "
                              f"{token}: {str(entry)[:200]!r}")
        return float(value["logprob"])

    def _best(self, entry: dict[str, Any], topk: int, at: int) -> list[tuple[int, float]]:
        """The entry's `topk` best (id, logprob) by rank, ordered by logprob descending."""
        try:
            ranked = sorted(((v["rank"], -v["logprob"], int(k)) for k, v in entry.items()))[:topk]
        except (KeyError, TypeError, ValueError) as err:
            raise ServerError(f"{CONFIG}.base_url={self.base_url}: prompt_logprobs[{at}] is malformed ({err}): "
                              f"{str(entry)[:200]!r}") from err
        if len(ranked) < topk:
            raise ServerError(f"{CONFIG}.base_url={self.base_url}: prompt_logprobs[{at}] holds {len(ranked)} "
                              f"tokens, fewer than topk={topk}")
        return sorted(((token_id, -negative) for _, negative, token_id in ranked), key=lambda p: -p[1])


def check_rows(prompts: Sequence[Sequence[int]], completions_N_T: Tensor, lengths: Sequence[int], topk: int
               ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of each row; ValueError naming the first inconsistency."""
    if completions_N_T.dim() != 2:
        raise ValueError(f"completions_N_T must be 2-D (N, T); got shape {tuple(completions_N_T.shape)}")
    N, T = completions_N_T.shape
    if len(prompts) != N or len(lengths) != N:
        raise ValueError(f"{len(prompts)} prompts and {len(lengths)} lengths for {N} completion rows")
    if not _integer(topk) or topk < 0:
        raise ValueError(f"topk={topk!r} must be an integer >= 0")
    rows = []
    for i in range(N):
        length = int(lengths[i])
        if not 0 <= length <= T:
            raise ValueError(f"lengths[{i}]={length} is outside [0, {T}]")
        if length and not prompts[i]:
            raise ValueError(f"prompts[{i}] is empty: its first completion token has no context to be scored in")
        rows.append(([int(x) for x in prompts[i]], completions_N_T[i, :length].tolist()))
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
