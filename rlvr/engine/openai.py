"""`engine=openai`: rollouts from an OpenAI-compatible `/v1/completions` server (vLLM's), which is pushed the
policy after every optimizer step and checked at start-up to really serve it.

Sampling. Each prompt is one `POST {base_url}/completions` with the prompt as token ids, `n = G`, the
run's temperature / top_p / max_tokens, neutral top_k / min_p / penalties (a server otherwise applies the
model's generation_config.json defaults, e.g. Qwen3's top_k=20), `stop_token_ids` = the EOS ids,
`return_token_ids` (the completion's ids, EOS included when it ended the completion) and `logprobs: 0` (the
sampled token's log-probability only). Prompt p's request carries its group's seed
(`Engine.sample` takes one per prompt), so a run's draws depend on (seed, step) and the weights, and two equal
prompts in one batch still get different draws. Requests go through `rlvr.openai_api.OpenAIClient`:
concurrently, at most `max_concurrency` in flight, each bounded by `timeout_s`; a connection error, a timeout,
HTTP 429 or 5xx is retried `retries` times after `backoff_s`, 2·`backoff_s`, …; anything else, or a request still
failing after its retries, raises (the step cannot go on without rollouts).
Rollouts are laid out as `engine=pytorch` lays them out: row p·G + g, right-padded with pad_id, the mask a
prefix, a row `finished` iff its last token is an EOS id, logprobs 0 on padding. The client runs its own event
loop for each batch (rlvr/openai_api.py), which a running loop would refuse; multi-turn episodes
(rlvr/rollout/episodes.py) call `sample` from inside theirs, so there the batch runs on a worker thread while the caller
waits (`outside_running_loop`).

Which distribution the logprobs are of. rlvr's contract is log p(token) under the temperature-scaled
distribution before top-p truncation. vLLM returns one of two, set by its server flag `--logprobs-mode`
(measured on vLLM 0.32, `vllm/v1/sample/sampler.py`):
  raw_logprobs (vLLM's default): log_softmax of the raw logits, before temperature and top-p
      → the contract holds iff temperature = 1 (any top_p);
  processed_logprobs: after temperature, penalties, min_p and top-k/top-p (the distribution drawn from)
      → the contract holds iff top_p = 1 (any temperature).
`engine.logprobs_mode` must name the server's mode (the start-up probe checks it); `sample` refuses a
(temperature, top_p) pair whose logprobs the server cannot give. At temperature 0 (greedy evaluation) no
logprobs are requested and 0 is returned (the log-probability of the argmax under the T→0 distribution).

Weight sync. `sync(policy)` writes the policy into a new folder under `workdir` (which the server must be
able to read: the same machine or a shared file system) and makes the server serve it, or raises:
  LoRA: `save_adapter`, `POST /v1/load_lora_adapter {lora_name: <fresh name>, lora_path}`, then sampling
      asks for `model = <that name>`; the previous adapter is unloaded and its folder deleted. A fresh name
      each time, because vLLM caches adapters by name (the same name with new weights may serve the old).
  full fine-tuning: `save_full`, `POST {root}/collective_rpc {"method": "reload_weights", "kwargs":
      {"weights_path": ...}}`, `POST {root}/reset_prefix_cache` (both need the server's dev mode); the
      folder is deleted once loaded. With `weight_transfer: nccl` the full weights (and W0 under LoRA) go
      instead through vLLM's weight-transfer API over NCCL, from GPU memory, no file (rlvr/engine/
      weight_transfer.py; CUDA on both sides, the server started with --weight-transfer-config
      '{"backend": "nccl"}'; refused at start without CUDA here). vLLM 0.32 has no weight-transfer backend
      for CPUs (NCCL, CUDA IPC and RDMA ones only), so on a CPU the folder is the way.
`sync` returns the bytes it wrote to files (the adapter's, or the full weights' folder; 0 over NCCL).
`{root}` is `base_url` without its trailing `/v1`. Every `sync` pushes (the trainer syncs before each sampling
call; an evaluation right after a step pushes the same weights twice, which is cheap under LoRA).

Start-up. Construction checks and stores the settings (and that the key is set) and contacts nothing;
`connect()`, which the trainer calls once right after building the engine, reaches the server. It checks
that `GET /models` lists `model`, then pushes the policy: the engine is built after the SFT warm-up, whose W0
the server does not have, so under LoRA it first pushes W0 (`save_base` + reload_weights) when the server
allows it (a server without dev mode is tolerated here only if the probe then finds it already serves W0),
then loads the adapter; under full fine-tuning it pushes the full weights. Then a probe: two fixed token-id
prompts, `probe_tokens` tokens each sampled at temperature 0.5 with the EOS ignored, whose returned logprobs
are compared with the policy's own full forward (mean |Δ| ≤ `probe_tolerance`); at 0.5 the two logprobs
modes differ, so this also checks `logprobs_mode`. A server that cannot load adapters or reload weights
(404/400), or whose logprobs disagree, stops the run in `connect` with the reason and the server flags it
needs: `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` and `--enable-lora --max-lora-rank R` for LoRA,
`VLLM_SERVER_DEV_MODE=1` for reload_weights. With `verify_sync` the probe also runs after every `sync`, at
temperature 1 (weights only): two small requests and a forward over 2 × `probe_tokens` tokens, so a server
silently sampling from a stale policy (restarted, adapter lost, …) stops the run instead of training it
off-policy. On the shared 2-core CPU it took 0.2–3 s per step, mostly the new adapter's first use, which the
first sampling request pays otherwise.

Sampling ahead (`trainer.off_policy_steps` ≥ 1, rlvr/overlap.py) under LoRA, each version is staged: its adapter is
written and loaded on the server under a name of its own (and probed there) at once, while the sampler thread
still requests the previous one; the sampler thread switches to it between steps (`stage`). The server then holds
two adapters for a while: `--max-loras 2` or more lets one batch hold both (with 1 vLLM schedules them apart).
Under full fine-tuning the server holds one set of weights, replaced in place, so nothing is staged: the trainer
waits until the sampler is idle and syncs.

Measured limitation (vLLM 0.32, CPU build): `reload_weights` leaves a tied lm_head (tie_word_embeddings, as
in the tiny model, Qwen3-0.6B and Qwen2.5-0.5B) on its old packed weights while the embedding changes, so a
policy whose embeddings moved (full fine-tuning, or a warm-up before LoRA) is not served faithfully; the probe
catches it and stops the run, naming this. LoRA with W0 unchanged, or weights other than the embeddings,
reach the server exactly (|Δ| ≈ 2e-7 in fp32).

The API key: `api_key_env: null` sends none (a local server); otherwise the key is read from that
environment variable at each request and only ever put in the `Authorization: Bearer` header, never on the
object, in a message or in a file. The engine gives no entropy (its `needs` do not provide `entropy`). Every setting
comes from conf/engine/openai.yaml: the constructor has no defaults of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rlvr.engine.policy_files import folder_bytes, is_lora, save_adapter, save_base, save_full
from rlvr.engine.rows import rollouts_from_rows
from rlvr.engine.sync_check import PROBE_SEED, local_logprobs, probe_prompts
from rlvr.engine.weight_transfer import WEIGHT_TRANSFERS, NcclSender, NcclTransfer
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import, no_grad
from rlvr.openai_api import OpenAIClient, ServerError, excerpt, probe_models
from rlvr.protocols import Finding, Needs, Staged
from rlvr.requirements import EnvVar
from rlvr.seeds import group_seeds, sub_seed
from rlvr.types import Continued, Rollouts, SamplingParams, Segment

if TYPE_CHECKING:
    from torch import nn

torch = lazy_import("torch")

log = logging.getLogger("rlvr")
T = TypeVar("T")

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
PROBE_TEMPERATURE = 0.5
LORA_FLAGS = "the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora --max-lora-rank R " \
             "(R ≥ the adapter's rank)"
DEV_FLAGS = "the environment variable VLLM_SERVER_DEV_MODE=1 (for /collective_rpc reload_weights and " \
            "/reset_prefix_cache)"


def server_rules(base_url: str, model: str, api_key_env: str | None, logprobs_mode: str, max_concurrency: int,
                 retries: int, backoff_s: float, timeout_s: float) -> list[tuple[str, Any, bool, str]]:
    """(key, value, valid, what it must be) of the knobs every engine that samples from an OpenAI-compatible server
    has (engine=openai and those built on it)."""
    return [
        ("base_url", base_url, base_url.startswith(("http://", "https://")), "an http(s):// URL"),
        ("model", model, bool(model), "the served model name"),
        ("api_key_env", api_key_env, api_key_env is None or bool(api_key_env), "null or a variable name"),
        ("logprobs_mode", logprobs_mode, logprobs_mode in LOGPROBS_MODES, f"one of {LOGPROBS_MODES}"),
        ("max_concurrency", max_concurrency, max_concurrency > 0, "> 0"),
        ("retries", retries, retries >= 0, ">= 0"),
        ("backoff_s", backoff_s, backoff_s >= 0, ">= 0"),
        ("timeout_s", timeout_s, timeout_s > 0, "> 0"),
    ]


class PolicySyncError(RuntimeError):
    """The server cannot be made to sample from the current policy, or does not."""


SERVER_CHECK_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ServerServes:
    """The server answers `GET {base_url}/models` and lists `model` (checked by `rlvr doctor`; an engine's run checks
    the same in `connect`, a distillation teacher's at its first request). `config` is the node whose keys the
    messages name (`engine`, `distill.teacher`)."""

    base_url: str
    model: str
    api_key_env: str | None
    config: str = "engine"
    item: str = "server"
    at_start: bool = False

    def check(self) -> Finding:
        if not self.base_url.startswith(("http://", "https://")):
            return Finding("missing", f"{self.config}.base_url={self.base_url!r} is not an http(s):// URL")
        listing = probe_models(self.base_url, self.api_key_env, SERVER_CHECK_TIMEOUT_S)
        if listing.status == 401:
            which = f"${self.api_key_env}" if self.api_key_env else f"no key ({self.config}.api_key_env is null)"
            return Finding("missing", f"GET {listing.url} answered HTTP 401: the server refuses {which}")
        if listing.status is None:
            return Finding("missing", f"GET {listing.url} is not answering ({listing.failure}; "
                                      f"{self.config}.base_url)")
        if listing.failure is not None:
            return Finding("missing", f"GET {listing.url} answered {listing.failure} ({self.config}.base_url)")
        if self.model not in listing.models:
            return Finding("missing", f"{self.base_url} does not serve {self.config}.model={self.model!r} (it serves "
                                      f"{list(listing.models)})")
        return Finding("ok", f"{self.base_url} answers and serves {self.model!r}")


class OpenAIEngine:
    label = "engine=openai"
    """How errors name the engine."""
    lora_flags = LORA_FLAGS
    """What a server needs to load adapters at run time (named when it refuses one)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        key = settings["api_key_env"]
        return Needs(
            provides=frozenset({"partial_rollouts", "staged_sync"}),
            requires={"local_policy": "it pushes the trained module's weights to the server after each step"},
            machine=(*((EnvVar(key, "engine.api_key_env"),) if key else ()),
                     ServerServes(settings["base_url"], settings["model"], key),
                     NcclTransfer(settings["weight_transfer"])),
        )

    def __init__(
        self,
        policy: nn.Module,
        eos_ids: list[int],
        pad_id: int,
        base_url: str,
        model: str,
        api_key_env: str | None,
        workdir: str | None,
        logprobs_mode: str,
        max_concurrency: int,
        retries: int,
        backoff_s: float,
        timeout_s: float,
        verify_sync: bool,
        probe_tokens: int,
        probe_tolerance: float,
        weight_transfer: str,
        nccl_host: str,
    ) -> None:
        rules = [
            *server_rules(base_url, model, api_key_env, logprobs_mode, max_concurrency, retries, backoff_s, timeout_s),
            ("probe_tokens", probe_tokens, probe_tokens > 0, "> 0"),
            ("probe_tolerance", probe_tolerance, probe_tolerance > 0, "> 0"),
            ("weight_transfer", weight_transfer, weight_transfer in WEIGHT_TRANSFERS, f"one of {WEIGHT_TRANSFERS}"),
            ("nccl_host", nccl_host, bool(nccl_host), "the address the server's workers reach this process at"),
        ]
        errors = [f"engine.{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok]
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        self.module, self.eos_ids, self.pad_id = policy, list(eos_ids), pad_id
        self.client = OpenAIClient(base_url, api_key_env, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                   max_concurrency=max_concurrency, owner="engine=openai", config="engine")
        self.client.read_key()  # a missing key fails at construction, before any model work
        self.base_url = self.client.base_url
        self.root = self.base_url.removesuffix("/v1")
        self.model, self.api_key_env, self.logprobs_mode = model, api_key_env, logprobs_mode
        self.workdir = workdir
        self.verify_sync, self.probe_tokens, self.probe_tolerance = verify_sync, probe_tokens, probe_tolerance
        self.lora = is_lora(policy)
        self.weight_transfer, self.nccl_host = weight_transfer, nccl_host
        self.nccl: NcclSender | None = None
        """The NCCL weight transfer (`weight_transfer: nccl`), opened by `connect`."""
        self.transfer_client = OpenAIClient(base_url, api_key_env, timeout_s=timeout_s, retries=0, backoff_s=0.0,
                                            max_concurrency=1, owner="engine=openai", config="engine")
        """For the weight-transfer routes: a retried /update_weights would wait for a broadcast that never comes."""
        self.run_tag = uuid.uuid4().hex[:8]  # adapter names stay fresh across runs sharing one server
        self.pushes = 0
        self.served = model
        """The model name sampling asks for: the base model, or the latest adapter under LoRA."""
        self.served_folder: Path | None = None
        self.folder: Path | None = None
        """Where pushed weights are written for the server to read; made by `connect`."""
        self.max_model_len: int | None = None
        self.last_probe: dict[str, float] = {}
        self._cleanup: weakref.finalize | None = None

    def __repr__(self) -> str:
        return f"OpenAIEngine(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def connect(self) -> None:
        """Check that the server lists `model`, push the policy (W0 first under LoRA) and probe that the server
        samples from it; PolicySyncError (or ServerError) when it cannot be made to."""
        if self.folder is not None:
            raise RuntimeError("OpenAIEngine.connect() is called once")
        t0 = time.perf_counter()
        if self.workdir is not None:
            Path(self.workdir).mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="rlvr-openai-", dir=self.workdir))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        module = self.module
        self.max_model_len = self._check_model_listed()
        if self.weight_transfer == "nccl":
            try:
                self.nccl = NcclSender(self.transfer_client, self.root, self.nccl_host, module)
            except (RuntimeError, ServerError) as err:
                raise PolicySyncError(
                    f"engine=openai: cannot open vLLM's NCCL weight transfer with {self.root}: {err}. "
                    "engine.weight_transfer=nccl needs a server started with --weight-transfer-config "
                    f"'{{\"backend\": \"nccl\"}}' and {DEV_FLAGS}, whose workers reach engine.nccl_host="
                    f"{self.nccl_host}"
                ) from err
        base_pushed = self._push_base(module) if self.lora else True  # full fine-tuning: the first push is W0
        self._push(module)
        self.last_probe = self.probe(module, base_pushed=base_pushed)
        log.info(
            "engine=openai: %s at %s serves the policy (%s; probe mean |Δ| %.2g, max %.2g over %d tokens) in %.1f s",
            self.model, self.base_url, "W0 pushed + LoRA adapter" if self.lora else "full weights pushed",
            self.last_probe["mean"], self.last_probe["max"], self.last_probe["tokens"], time.perf_counter() - t0,
        )

    # ---- sampling -------------------------------------------------------------------------------------------

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        if with_entropy:
            raise ValueError("engine=openai cannot give full-distribution entropy")
        seeds = group_seeds(seeds, len(prompt_ids_P))
        self._check_logprobs_available(params)
        bodies = [
            self._body(ids, group_size, params, seeds[p])
            for p, ids in enumerate(prompt_ids_P)
        ]
        replies = outside_running_loop(self.client.post_all_json, "completions", bodies)
        rows = [row for reply in replies for row in self._read_choices(reply, group_size, params.temperature > 0)]
        return rollouts_from_rows(prompt_ids_P, group_size, rows, self.pad_id, self.eos_ids, params.temperature)

    def continue_rows(self, segment: Segment) -> Continued:
        """Partial rollouts (rlvr/rollout/partial.py) by abort and resubmit, over HTTP: each row is a streamed
        completion of its own, its prompt and tokens so far as the prompt (the server prefills it under the weights
        pushed last), seeded by its seed and its offset as engine=vllm's; the streams are read as tokens arrive
        until the segment may end (`Segment.may_end`), then those still open are closed, which aborts their requests
        on a vLLM server; their tokens so far are kept."""
        if segment.settled:
            return Continued.nothing(segment)
        if segment.with_entropy:
            raise ValueError("engine=openai cannot give full-distribution entropy")
        params = segment.params
        self._check_logprobs_available(params)
        bodies = [self._body(context, 1, dataclasses.replace(params, max_tokens=budget),
                             sub_seed(seed, f"offset/{offset}") % 2**63)
                  for context, budget, offset, seed in zip(segment.contexts, segment.budgets, segment.offsets,
                                                           segment.seeds, strict=True)]
        N = len(bodies)
        tokens: list[list[int]] = [[] for _ in range(N)]
        logprobs: list[list[float]] = [[] for _ in range(N)]
        ended = [False] * N

        def event(n: int, data: dict) -> bool:
            for choice in data.get("choices") or ():  # a usage chunk has none
                ids = [int(t) for t in choice.get("token_ids") or ()]
                tokens[n] += ids
                logprobs[n] += [float(x) for x in choice["logprobs"]["token_logprobs"]] if params.temperature > 0 \
                    else [0.0] * len(ids)
                ended[n] = ended[n] or choice.get("finish_reason") is not None
            return segment.may_end(ended, [len(row) for row in tokens])

        outside_running_loop(self.client.stream_all, "completions", bodies, event)
        if any(len(t) != len(lp) for t, lp in zip(tokens, logprobs, strict=True)):
            raise ServerError("engine=openai: a streamed completion's token ids and log-probabilities differ in "
                              "length; the server must be vLLM-compatible (return_token_ids, logprobs)")
        eos = [done and bool(row) and row[-1] in self.eos_ids for done, row in zip(ended, tokens, strict=True)]
        return Continued(tokens, logprobs, None, ended, eos)

    def _check_logprobs_available(self, params: SamplingParams) -> None:
        if params.temperature == 0:
            return
        if self.logprobs_mode == "raw_logprobs" and abs(params.temperature - 1.0) > 1e-6:
            raise ValueError(
                f"engine.logprobs_mode=raw_logprobs: the server returns log-probabilities at temperature 1, but "
                f"sampling runs at temperature {params.temperature:g}; start the server with --logprobs-mode "
                "processed_logprobs and set engine.logprobs_mode=processed_logprobs (then top_p must be 1)"
            )
        if self.logprobs_mode == "processed_logprobs" and params.top_p < 1.0:
            raise ValueError(
                f"engine.logprobs_mode=processed_logprobs: the server returns log-probabilities after top-p "
                f"truncation, but rlvr trains on the distribution before it (top_p={params.top_p:g}); use "
                "top_p=1, or temperature 1 with a server in --logprobs-mode raw_logprobs"
            )

    def _body(self, prompt_ids: list[int], n: int, params: SamplingParams, seed: int, **extra) -> dict[str, Any]:
        body = {
            "model": self.served, "prompt": list(prompt_ids), "n": n, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "stop_token_ids": self.eos_ids, "seed": seed, "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.temperature > 0:
            body |= {"logprobs": 0, "return_tokens_as_token_ids": True}
        return body | extra

    def _read_choices(self, reply: dict, n: int, with_logprobs: bool) -> list[tuple[list[int], list[float]]]:
        """[(token ids, logprobs)] in sample order, checked for shape."""
        try:
            choices = sorted(reply["choices"], key=lambda c: c["index"])
            rows = []
            for c in choices:
                ids = [int(t) for t in c["token_ids"]]
                if with_logprobs:
                    logprobs = [float(x) for x in c["logprobs"]["token_logprobs"]]
                    named = c["logprobs"].get("tokens")
                    if named is not None and named != [f"token_id:{t}" for t in ids]:
                        raise ValueError("logprobs.tokens do not match token_ids")
                else:
                    logprobs = [0.0] * len(ids)
                if len(logprobs) != len(ids):
                    raise ValueError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
                rows.append((ids, logprobs))
        except (KeyError, TypeError, ValueError) as err:
            raise ServerError(f"engine=openai: malformed completions reply ({type(err).__name__}: {err}); "
                                f"the server must be vLLM-compatible (return_token_ids, logprobs)") from err
        if len(rows) != n:
            raise ServerError(f"engine=openai: asked for n={n} completions, the server returned {len(rows)}")
        return rows

    # ---- weight sync ----------------------------------------------------------------------------------------

    def sync(self, policy: nn.Module) -> int:
        """Push `policy` (and probe it with `verify_sync`); returns the bytes written to files for the server."""
        if self.folder is None:
            raise RuntimeError("OpenAIEngine.sync() before connect()")
        written = self._push(policy)
        if self.verify_sync:
            self.last_probe = self.probe(policy, base_pushed=True, temperature=1.0)
        return written

    def stage(self, policy: nn.Module) -> Staged | None:
        """`sync(policy)` in two halves (rlvr/overlap.py), under LoRA: the adapter is written and loaded on the server
        now, under a fresh name (and probed there with `verify_sync`), while the sampler still samples the previous
        one; loading makes it the one requested, the previous one unloaded. None under full fine-tuning: the server
        holds one set of weights, replaced in place, so the trainer syncs once the sampler is idle."""
        if self.folder is None:
            raise RuntimeError("OpenAIEngine.stage() before connect()")
        if not self.lora or not is_lora(policy):
            return None
        self.pushes += 1
        name, folder = self._load_adapter(policy)
        if self.verify_sync:
            self.last_probe = self.probe(policy, base_pushed=True, temperature=1.0, model=name)
        return Staged(lambda: self._serve_adapter(name, folder), folder_bytes(folder))

    def sleep(self) -> None:
        """Nothing to give back: the server holds its own memory, in another process."""

    def sample_beside_training(self, beside: bool) -> None:
        """Nothing to move: sampling is the server's, and waiting on it releases the GIL."""

    def _push(self, policy: nn.Module) -> int:
        """The policy to the server; the bytes written to files."""
        if is_lora(policy) != self.lora:
            raise PolicySyncError("engine=openai: the policy switched between LoRA and full fine-tuning")
        self.pushes += 1
        if self.lora:
            return self._push_adapter(policy)
        if self.nccl is not None:
            self._send_nccl(policy)
            return 0
        folder = save_full(policy, self._workdir() / f"weights-{self.pushes}")
        written = folder_bytes(folder)
        problem = self._reload_weights(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if problem:
            raise PolicySyncError(
                f"engine=openai: cannot push full weights to {self.root}: {problem}. Full fine-tuning needs a "
                f"server started with {DEV_FLAGS}"
            )
        return written

    def _send_nccl(self, policy: nn.Module, base: bool = False) -> None:
        assert self.nccl is not None  # weight_transfer=nccl, opened by connect
        try:
            self.nccl.send(policy, base)
        except (RuntimeError, ServerError) as err:
            raise PolicySyncError(f"engine=openai: the NCCL weight transfer to {self.root} failed: {err}") from err

    def _push_base(self, module: nn.Module) -> bool:
        """W0 (the warm-up's) to the server; False when the server has no reload_weights (the probe decides)."""
        if self.nccl is not None:
            self._send_nccl(module, base=True)
            return True
        folder = save_base(module, self._workdir() / "base")
        problem = self._reload_weights(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if problem:
            log.warning("engine=openai: could not push W0 to %s (%s); checking that it already serves W0",
                        self.root, problem)
        return not problem

    def _workdir(self) -> Path:
        """The engine's folder under `workdir`, which `connect` makes."""
        if self.folder is None:
            raise RuntimeError("OpenAIEngine used before connect()")
        return self.folder

    def _reload_weights(self, folder: Path) -> str | None:
        """None when the server now holds the weights in `folder`; otherwise what went wrong."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        response = self.client.request("POST", f"{self.root}/collective_rpc", body)
        if not response.is_success:
            return f"POST /collective_rpc reload_weights answered HTTP {response.status_code}: {excerpt(response)}"
        response = self.client.request("POST", f"{self.root}/reset_prefix_cache")
        if not response.is_success or response.json().get("success") is False:
            return f"POST /reset_prefix_cache answered HTTP {response.status_code}: {excerpt(response)}"
        return None

    def _push_adapter(self, policy: nn.Module) -> int:
        """The adapter under a fresh name (the previous one unloaded); its files' bytes."""
        name, folder = self._load_adapter(policy)
        self._serve_adapter(name, folder)
        return folder_bytes(folder)

    def _load_adapter(self, policy: nn.Module) -> tuple[str, Path]:
        """The adapter's files written and loaded on the server under a fresh name (not yet the one requested)."""
        folder = save_adapter(policy, self._workdir() / f"adapter-{self.pushes}")
        name = f"rlvr-{self.run_tag}-{self.pushes}"
        url = self._lora_url("load_lora_adapter")
        response = self.client.request("POST", url, {"lora_name": name, "lora_path": str(folder)})
        if not response.is_success:
            shutil.rmtree(folder, ignore_errors=True)
            raise PolicySyncError(
                f"{self.label}: {url} answered HTTP {response.status_code}: {excerpt(response)}. The LoRA policy can "
                f"only be updated on a server started with {self.lora_flags}, reading adapters from "
                f"{self._workdir().parent} (engine.workdir)"
            )
        return name, folder

    def _serve_adapter(self, name: str, folder: Path) -> None:
        """Request the adapter `name` from now on; the previous one unloaded, its folder deleted."""
        previous, previous_folder = self.served, self.served_folder
        self.served, self.served_folder = name, folder
        if previous != self.model:
            assert previous_folder is not None  # an adapter is served only from a folder it was pushed from
            self.client.request("POST", self._lora_url("unload_lora_adapter"), {"lora_name": previous})
            shutil.rmtree(previous_folder, ignore_errors=True)

    def _lora_url(self, route: str) -> str:
        """Where the server loads and unloads adapters: vLLM's routes are under /v1."""
        return f"{self.base_url}/{route}"

    def close(self) -> None:
        """Unload the served adapter and close the NCCL weight transfer (best effort), delete the engine's folder;
        the server keeps running."""
        if self.nccl is not None:
            try:
                self.nccl.close()
            except (RuntimeError, ServerError, ConfigError):
                pass
            self.nccl = None
        if self.served != self.model:
            try:
                self.client.request("POST", self._lora_url("unload_lora_adapter"), {"lora_name": self.served})
            except (ServerError, ConfigError):
                pass
            self.served = self.model
        if self._cleanup is not None:
            self._cleanup()

    # ---- the probe ------------------------------------------------------------------------------------------

    def probe_prompts(self, module: nn.Module) -> list[list[int]]:
        return probe_prompts(module, self.eos_ids)

    @no_grad
    def probe(self, module: nn.Module, base_pushed: bool, temperature: float = PROBE_TEMPERATURE,
              model: str | None = None) -> dict[str, float]:
        """Sample from the server and compare its logprobs with `module`'s own; raise PolicySyncError when they
        disagree. Returns {"mean", "max", "tokens"} of |Δ|. At temperature 1 both logprobs modes agree, so
        only the weights are checked (cheaper too: vLLM's CPU build samples 8-10× slower per token at 0.5).
        `model`: the served name to probe (an adapter staged but not yet requested); the one requested if None."""
        prompts = self.probe_prompts(module)
        length = max(1, min(self.probe_tokens, (self.max_model_len or 10**9) - 4))
        params = SamplingParams(temperature, 1.0, length)
        bodies = [self._body(p, 1, params, PROBE_SEED + i, ignore_eos=True, stop_token_ids=[],
                             model=model or self.served) for i, p in enumerate(prompts)]
        replies = self.client.post_all_json("completions", bodies)
        rows = [row for reply in replies for row in self._read_choices(reply, 1, True)]
        served = torch.tensor([lp for _, lps in rows for lp in lps])
        raw, scaled = local_logprobs(module, prompts, [ids for ids, _ in rows], temperature)
        expected, other = (raw, scaled) if self.logprobs_mode == "raw_logprobs" else (scaled, raw)
        delta = (served - expected).abs()
        if float(delta.mean()) <= self.probe_tolerance:
            return {"mean": float(delta.mean()), "max": float(delta.max()), "tokens": len(delta)}
        other_mode = next(m for m in LOGPROBS_MODES if m != self.logprobs_mode)
        if temperature != 1.0 and float((served - other).abs().mean()) <= self.probe_tolerance:
            raise PolicySyncError(
                f"engine=openai: the server at {self.base_url} returns {other_mode} log-probabilities but "
                f"engine.logprobs_mode={self.logprobs_mode}: set engine.logprobs_mode={other_mode} (or restart the "
                f"server with --logprobs-mode {self.logprobs_mode})"
            )
        why = (
            "it does not serve the trainer's weights" if base_pushed else
            f"it does not serve the trainer's W0, and it could not be pushed W0 (start it with {DEV_FLAGS})"
        )
        if base_pushed and getattr(module.config, "tie_word_embeddings", False):
            why += (" (vLLM 0.32's CPU build keeps a tied lm_head's old weights after reload_weights, measured on "
                    "the tiny model: the embeddings may not change there)")
        mean, worst = float(delta.mean()), float(delta.max())
        raise PolicySyncError(
            f"engine=openai: the server at {self.base_url} (model {model or self.served!r}) disagrees with the policy: "
            f"sampled-token log-probabilities differ by mean |Δ| {mean:.3g} (max {worst:.3g}) > "
            f"engine.probe_tolerance={self.probe_tolerance:g} over {len(delta)} tokens; {why}. Check that "
            f"engine.model names the same architecture and dtype as the run's model"
        )

    # ---- the server -----------------------------------------------------------------------------------------

    def _check_model_listed(self) -> int | None:
        """The served model's max_model_len (None if not reported); raises if `model` is not served."""
        listing = self.client.list_models()
        if listing.status is None:
            raise ServerError(f"engine=openai: GET {listing.url} failed after {listing.attempts} attempts: "
                              f"{listing.failure}")
        if listing.failure is not None:
            hint = " (engine.api_key_env names the variable holding the key)" if listing.status == 401 else ""
            raise PolicySyncError(f"engine=openai: GET {listing.url} answered {listing.failure}{hint}")
        if self.model not in listing.models:
            raise PolicySyncError(f"engine=openai: {self.base_url} does not serve engine.model={self.model!r} "
                                  f"(it serves {sorted(map(str, listing.models))})")
        return listing.models[self.model].get("max_model_len")


def outside_running_loop(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args); on a worker thread, waited for, when this thread is running an event loop (where `fn`'s own
    `asyncio.run` would raise)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlvr-openai") as pool:
        return pool.submit(fn, *args).result()

