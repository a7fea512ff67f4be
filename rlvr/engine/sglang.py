"""`engine=sglang`: rollouts from an SGLang 0.5 server, pushed the policy after every optimizer step: `engine=openai`'s
machinery (rlvr/engine/openai.py: the client, concurrency, retries, the start-up and after-sync probes, the
files written for the server) with SGLang's routes and request fields, as SGLang 0.5.23 defines them
(sglang/srt/entrypoints/http_server.py, entrypoints/openai/protocol.py, managers/io_struct.py).

Sampling: `POST {base_url}/completions` (SGLang's OpenAI-compatible route) with the prompt as token ids,
`return_token_ids` (the completion's `token_ids`, the stop token included) and `logprobs: 0` (the sampled token's
log-probability in `logprobs.token_logprobs`; SGLang's `logprobs.tokens` are texts, not ids, and are not read).
One request per sample (`n = 1`), sample g of prompt p seeded `s_p + g`: SGLang passes `seed` to every copy of an
n > 1 request as the same `sampling_seed`, which would draw the same completion n times. `top_k` is -1 (SGLang's
"whole vocabulary"; it refuses 0), and vLLM's `return_tokens_as_token_ids` is not sent (SGLang's request models
refuse unknown fields).

Partial rollouts (trainer.partial_rollouts): engine=openai's `continue_rows`, each row a streamed request
(`stream: true`; SGLang's chunks carry the `token_ids` and `logprobs` of the tokens since the last), the streams still
open when the job may end closed, which aborts their requests (SGLang's streaming response aborts a request whose
client has gone).

Log-probabilities: SGLang's sampler returns log_softmax(logits / T), taken before top-p/top-k truncation
(sglang/srt/layers/sampler.py: `log(probs)` of the temperature-scaled softmax, the truncated copy is only drawn
from): rlvr's contract at any temperature and top_p, `engine.logprobs_mode: processed_logprobs`. A server started
with `SGLANG_RETURN_ORIGINAL_LOGPROB=1` returns them at T = 1 instead: set `engine.logprobs_mode: raw_logprobs`,
and sampling at T ≠ 1 is refused. The start-up probe (at T = 0.5) tells the two apart.

Weight sync (the server must read `workdir`: the same machine or a shared file system):
  LoRA: `save_adapter`, `POST {root}/load_lora_adapter {lora_name: <fresh name>, lora_path}`; requests then carry
      `lora_path: <that name>`; the previous adapter goes with `POST {root}/unload_lora_adapter {lora_name}`. The
      server needs `--enable-lora` and `--max-lora-rank R` (and `--lora-target-modules` for the adapter's layers).
      Sampling k ≥ 2 steps ahead stages each version (engine=openai's `stage`): its adapter is loaded at once under
      its own name and probed there, while requests still name the previous one; the load switches them over.
  full fine-tuning (and W0 under LoRA at start): `save_full` / `save_base`, then `POST {root}/update_weights_from_disk
      {model_path: <folder>, flush_cache: true}` (answers `{"success": …, "message": …}`).
`{root}` is `base_url` without `/v1`. Files only: SGLang's own distributed update (`/init_weights_update_group`,
`/update_weights_from_distributed`, NCCL) is not built.

Where it runs: SGLang's server needs a CUDA GPU (its `sgl-kernel` kernels are CUDA-only; its CPU back end needs a
source build on an Intel CPU with AMX). A run whose `engine.base_url` is on this machine is refused at start when
this machine has neither a CUDA device nor AMX (`SGLangHost`); `rlvr doctor` says the same and asks the server
(`ServerServes`). Tested against a loopback server that implements these routes over the tiny model
(tests/engine/test_sglang_engine.py); never against SGLang itself (README, "Not there yet").
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from rlvr.engine.openai import OpenAIEngine, PolicySyncError, ServerServes, outside_running_loop
from rlvr.engine.policy_files import folder_bytes, save_full
from rlvr.engine.rows import rollouts_from_rows
from rlvr.openai_api import excerpt
from rlvr.protocols import Finding, Needs
from rlvr.requirements import EnvVar
from rlvr.seeds import group_seeds
from rlvr.types import Rollouts, SamplingParams

if TYPE_CHECKING:
    from torch import nn

LORA_FLAGS = "--enable-lora --max-lora-rank R (R ≥ the adapter's rank) and --lora-target-modules naming its layers"
LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
CANNOT_RUN = ("SGLang's server cannot run on this machine: its kernels (sgl-kernel) are CUDA-only, and its CPU back "
              "end needs a source build for Intel CPUs with AMX")


def cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@dataclass(frozen=True)
class SGLangHost:
    """An SGLang server at a loopback `engine.base_url` needs this machine to be able to run one (a CUDA device, or
    an AMX CPU for SGLang's CPU build from source); checked by every run at start, from torch's devices and
    /proc/cpuinfo. A server elsewhere is `ServerServes`'s question."""

    base_url: str
    item: str = "sglang server host"
    at_start: bool = True

    def check(self) -> Finding:
        host = urlparse(self.base_url).hostname or ""
        if host not in LOOPBACK:
            return Finding("ok", f"the server runs on {host} (engine.base_url), not here")
        import torch

        if torch.cuda.is_available():
            return Finding("ok", f"a CUDA device is here for an SGLang server at {self.base_url}")
        if cpu_has_amx():
            return Finding("warning", f"no CUDA device: an SGLang server at {self.base_url} must be SGLang's CPU "
                                      "build, from source (this CPU has AMX)")
        return Finding("missing", f"engine.base_url={self.base_url} is this machine, and {CANNOT_RUN} (this one has "
                                  "neither a CUDA device nor AMX): point engine.base_url at an SGLang server on a GPU "
                                  "machine that reads engine.workdir, or use engine=vllm / engine=openai here")


class SGLangEngine(OpenAIEngine):
    """engine=openai's machinery over SGLang's routes (module docstring)."""

    label = "engine=sglang"
    lora_flags = LORA_FLAGS

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        key = settings["api_key_env"]
        return Needs(
            provides=frozenset({"partial_rollouts", "staged_sync"}),  # as engine=openai's: aborts, staged adapters
            requires={"local_policy": "it pushes the trained module's weights to the server after each step"},
            machine=(*((EnvVar(key, "engine.api_key_env"),) if key else ()), SGLangHost(settings["base_url"]),
                     ServerServes(settings["base_url"], settings["model"], key)),
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
    ) -> None:
        super().__init__(policy, eos_ids, pad_id, base_url, model, api_key_env, workdir, logprobs_mode,
                         max_concurrency, retries, backoff_s, timeout_s, verify_sync, probe_tokens, probe_tolerance,
                         weight_transfer="files", nccl_host="127.0.0.1")

    def __repr__(self) -> str:
        return f"SGLangEngine(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    # ---- sampling: one request per sample --------------------------------------------------------------------

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        return sample_per_request(self, "engine=sglang", prompt_ids_P, group_size, params, seeds, with_entropy)

    def _check_logprobs_available(self, params: SamplingParams) -> None:
        if self.logprobs_mode == "raw_logprobs" and params.temperature > 0 and abs(params.temperature - 1) > 1e-6:
            raise ValueError(
                f"engine.logprobs_mode=raw_logprobs (a server with SGLANG_RETURN_ORIGINAL_LOGPROB=1) returns "
                f"log-probabilities at temperature 1, but sampling runs at temperature {params.temperature:g}: "
                "restart the server without it and set engine.logprobs_mode=processed_logprobs"
            )

    def _body(self, prompt_ids: list[int], n: int, params: SamplingParams, seed: int, **extra) -> dict[str, Any]:
        """engine=openai's body, the adapter named by `lora_path` (the served one, or `model` given: a staged one)."""
        adapter = extra.pop("model", self.served)
        body = super()._body(prompt_ids, n, params, seed, **extra)
        body.pop("return_tokens_as_token_ids", None)
        body |= {"model": self.model, "top_k": -1}
        if adapter != self.model:
            body["lora_path"] = adapter
        return body

    def _read_choices(self, reply: dict, n: int, with_logprobs: bool) -> list[tuple[list[int], list[float]]]:
        for choice in reply.get("choices") or []:  # SGLang's logprobs.tokens are texts; the ids are token_ids
            if isinstance(choice, dict) and isinstance(choice.get("logprobs"), dict):
                choice["logprobs"].pop("tokens", None)
        return super()._read_choices(reply, n, with_logprobs)

    # ---- weight sync ------------------------------------------------------------------------------------------

    def _push(self, policy: nn.Module) -> int:
        if self.lora:
            return super()._push(policy)
        self.pushes += 1
        folder = save_full(policy, self._workdir() / f"weights-{self.pushes}")
        written = folder_bytes(folder)
        problem = self._reload_weights(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if problem:
            raise PolicySyncError(f"engine=sglang: cannot push full weights to {self.root}: {problem}")
        return written

    def _reload_weights(self, folder: Path) -> str | None:
        """None when the server now serves the weights in `folder`; otherwise what went wrong."""
        body = {"model_path": str(folder), "flush_cache": True}
        response = self.client.request("POST", f"{self.root}/update_weights_from_disk", body)
        if not response.is_success:
            return f"POST /update_weights_from_disk answered HTTP {response.status_code}: {excerpt(response)}"
        try:
            success = response.json().get("success")
        except ValueError:
            success = None
        if success is not True:
            return f"POST /update_weights_from_disk did not answer success: {excerpt(response)}"
        return None

    def _lora_url(self, route: str) -> str:
        """SGLang's adapter routes are at the server's root, not under /v1."""
        return f"{self.root}/{route}"


def sample_per_request(engine: OpenAIEngine, name: str, prompt_ids_P: list[list[int]], group_size: int,
                       params: SamplingParams, seeds: Sequence[int], with_entropy: bool) -> Rollouts:
    """`engine.sample` for a server where each sample is its own completions request (n = 1): sample g of prompt p
    seeded s_p + g, rows in order p·G + g (engine=sglang, engine=max)."""
    if with_entropy:
        raise ValueError(f"{name} cannot give full-distribution entropy")
    seeds = group_seeds(seeds, len(prompt_ids_P))
    engine._check_logprobs_available(params)
    bodies = [engine._body(ids, 1, params, (seeds[p] + g) % 2**63)
              for p, ids in enumerate(prompt_ids_P) for g in range(group_size)]
    replies = outside_running_loop(engine.client.post_all_json, "completions", bodies)
    rows = [row for reply in replies for row in engine._read_choices(reply, 1, params.temperature > 0)]
    return rollouts_from_rows(prompt_ids_P, group_size, rows, engine.pad_id, engine.eos_ids, params.temperature)
