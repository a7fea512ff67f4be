"""`engine=max`: rollouts from a Modular MAX server (`max serve`, package `modular`) that the engine starts itself on
the policy's files: `engine=openai`'s machinery (rlvr/engine/openai.py: the client, retries, the start-up and
after-sync probes, the adapter pushes) with what MAX 26.6's server does differently (max/serve/router/
openai_routes.py, max/pipelines/lib/log_probabilities.py, read in the installed package).

The server. MAX has no route that reloads weights, so the engine owns its server process: `connect` writes the
policy (W0 under LoRA, the full weights otherwise) with the tokenizer (`engine.tokenizer`) into a folder under
`workdir` and runs `{command} serve --model-path <folder> --served-model-name policy --port P --devices D
--no-enable-overlap-scheduler` (MAX refuses log-probabilities with its overlap scheduler), waiting up to
`startup_timeout_s` for `GET /v1/models`. MAX compiles the model's graph at start: ~100 s for the tiny model on the
2-core CPU the first time. The compiled graphs are cached under `cache_dir` (MAX's `MODULAR_DERIVED_PATH`, default
~/.cache/rlvr/max), so later starts on the same architecture reuse them (README: the measured figures). The
server's output goes to `<workdir>/max-serve-<run tag>.log` (kept after `close`), whose tail a failed start quotes.

Sampling. MAX answers one choice per request whatever `n` is, so sample g of prompt p is its own `POST
/v1/completions` with `n: 1` and seed `s_p + g`. It returns no token ids: each position's `logprobs.top_logprobs`
entry is a dict keyed by the decoded text of its tokens, and MAX always puts the sampled token in it (`logprobs: 1`:
the top token and the sampled one; `logprobs: 0` returns no log-probabilities at all, measured on 26.6). The engine
maps that text back to the id through the tokenizer's vocabulary (each id's `decode`), and refuses a text that
several ids decode to. `top_k` is the vocabulary size, i.e. all tokens (MAX's own "all", -1, made its 26.6 CPU
sampler emit out-of-vocabulary ids on the tiny model and crash, measured; leaving it out lets the model's
generation_config impose one).

Log-probabilities: MAX returns log_softmax of the logits before the temperature (measured on 26.6), the T = 1
distribution, so sampling at T ≠ 1 is refused (`engine=openai`'s `raw_logprobs` rule; top-p is fine: they are
taken before it). At T = 0 the argmax is drawn and 0 returned.

Weight sync. LoRA: the adapter's folder through `POST /v1/load_lora_adapter` under a fresh name, the previous one
unloaded (as engine=openai; the server started with `--enable-lora --max-lora-rank R`). MAX's LoRA kernels (SGMV)
run on GPUs only: on a CPU its server fails ("SGMV only supported on GPUs", measured on 26.6), so a LoRA policy with
`engine.devices: cpu` is refused when the engine is built, before any server starts. Full fine-tuning: reload,
i.e. the server is stopped and started on the new weights' folder (its graphs come from the cache; the start still
loads the weights and warms up): seconds per step at best, so it suits a few long steps, not many short ones.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.engine.openai import OpenAIEngine, PolicySyncError
from rlvr.engine.policy_files import folder_bytes, is_lora, save_base, save_full
from rlvr.engine.sglang import sample_per_request
from rlvr.errors import ConfigError
from rlvr.openai_api import ServerError
from rlvr.protocols import Finding, Needs
from rlvr.types import Rollouts, SamplingParams

if TYPE_CHECKING:
    from torch import nn

SERVED_NAME = "policy"
DEFAULT_CACHE = Path.home() / ".cache" / "rlvr" / "max"
LORA_ON_CPU = ("MAX's LoRA kernels (SGMV) run on GPUs only: on a CPU its server fails with \"SGMV only supported on "
               "GPUs\" (MAX 26.6)")


@dataclass(frozen=True)
class MaxCommand:
    """The `max` command (`engine.command`) is on PATH or a file: checked by every run at start. That it serves is
    found out when the engine starts it (a compile of minutes the first time)."""

    command: str
    item: str = "max"
    at_start: bool = True

    def check(self) -> Finding:
        found = shutil.which(self.command)
        if found is None:
            return Finding("missing", f"engine.command={self.command!r} is not a command here: install MAX "
                                      "(pip install modular, in its own environment if its pins clash with this "
                                      "one's) and set engine.command to its `max`")
        return Finding("ok", f"{found} (its first start compiles the model: ~100 s for the tiny model on 2 cores)")


class MAXEngine(OpenAIEngine):
    """engine=openai's machinery over a MAX server the engine starts and restarts (module docstring)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={"local_policy": "it starts MAX on the policy's files and pushes each step's weights"},
                     machine=(MaxCommand(settings["command"]),))

    def __init__(
        self,
        policy: nn.Module,
        eos_ids: list[int],
        pad_id: int,
        command: str,
        devices: str,
        port: int,
        tokenizer: str | None,
        cache_dir: str | None,
        workdir: str | None,
        startup_timeout_s: float,
        max_concurrency: int,
        retries: int,
        backoff_s: float,
        timeout_s: float,
        verify_sync: bool,
        probe_tokens: int,
        probe_tolerance: float,
    ) -> None:
        if is_lora(policy) and devices.startswith("cpu"):
            raise ConfigError(f"invalid config:\n  engine.devices={devices!r} with a LoRA policy: {LORA_ON_CPU}; use "
                              "engine.devices=gpu, full fine-tuning (model.lora=null), or another engine")
        if not 0 <= port < 65536 or startup_timeout_s <= 0:
            raise ConfigError(f"invalid config:\n  engine.port={port} must be in [0, 65535] (0: a free one) and "
                              f"engine.startup_timeout_s={startup_timeout_s} > 0")
        self.port = port or free_port()
        super().__init__(policy, eos_ids, pad_id, f"http://127.0.0.1:{self.port}/v1", SERVED_NAME, None, workdir,
                         "raw_logprobs", max_concurrency, retries, backoff_s, timeout_s, verify_sync, probe_tokens,
                         probe_tolerance, weight_transfer="files", nccl_host="127.0.0.1")
        self.command, self.devices, self.startup_timeout_s = command, devices, startup_timeout_s
        self.cache_dir = Path(cache_dir) if cache_dir else DEFAULT_CACHE
        self.tokenizer = load_tokenizer(tokenizer or getattr(policy.config, "name_or_path", "") or None)
        self.vocabulary = vocabulary(self.tokenizer)
        self.vocab_size = int(cast("Any", policy).config.vocab_size)
        self.process: subprocess.Popen | None = None
        self.serving: Path | None = None
        """The folder the server was started on."""
        self.fresh = False
        """The server was just started on the current weights (connect's first push has nothing to send)."""
        self.start_s: list[float] = []
        """Seconds each server start took (the first one compiles)."""

    def __repr__(self) -> str:
        return f"MAXEngine(command={self.command!r}, devices={self.devices!r}, port={self.port})"

    # ---- the server process -----------------------------------------------------------------------------------

    def connect(self) -> None:
        """Start MAX on the policy's files (W0 under LoRA), then what engine=openai's connect does: the adapter pushed,
        the probe."""
        self._start_server(self._write_model(self.module, base=self.lora))
        super().connect()

    def _push_base(self, module: nn.Module) -> bool:
        """W0 is what the server was started on."""
        return True

    def _write_model(self, policy: nn.Module, base: bool) -> Path:
        """The policy as a folder MAX serves: config, weights (W0 with `base`), tokenizer."""
        self.pushes += 1
        root = Path(self.workdir) if self.workdir else Path("/tmp")
        root.mkdir(parents=True, exist_ok=True)
        folder = root / f"rlvr-max-{self.run_tag}" / f"model-{self.pushes}"
        (save_base if base else save_full)(policy, folder)
        self.tokenizer.save_pretrained(str(folder))
        return folder

    def _start_server(self, folder: Path) -> None:
        self._stop_server()
        self.serving = folder
        t0 = time.perf_counter()
        args = [self.command, "serve", "--model-path", str(folder), "--served-model-name", SERVED_NAME,
                "--port", str(self.port), "--devices", self.devices, "--no-enable-overlap-scheduler"]
        if self.lora:
            args += ["--enable-lora", "--max-lora-rank", str(lora_rank(self.module))]
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MODULAR_DERIVED_PATH=str(self.cache_dir))
        log_path = folder.parent.parent / f"max-serve-{self.run_tag}.log"  # kept after close
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PolicySyncError(f"engine=max: `{' '.join(args)}` exited with status {self.process.returncode}; "
                                      f"the end of {log_path}:\n{tail(log_path)}")
            listing = self.client.list_models() if self._answers() else None
            if listing is not None and SERVED_NAME in listing.models:
                self.start_s.append(time.perf_counter() - t0)
                self.fresh = True
                return
            time.sleep(1.0)
        self._stop_server()
        raise PolicySyncError(f"engine=max: the MAX server did not answer within engine.startup_timeout_s="
                              f"{self.startup_timeout_s:g} s (its first start compiles the model); the end of "
                              f"{log_path}:\n{tail(log_path)}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def _stop_server(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        """Stop the server and delete the engine's folders."""
        self._stop_server()
        self.served = self.model
        super().close()
        root = Path(self.workdir) if self.workdir else Path("/tmp")
        shutil.rmtree(root / f"rlvr-max-{self.run_tag}", ignore_errors=True)

    # ---- weight sync ------------------------------------------------------------------------------------------

    def _push(self, policy: nn.Module) -> int:
        """LoRA: the adapter (engine=openai's push); full weights: the server restarted on them."""
        if self.lora:
            return super()._push(policy)
        if self.fresh:  # connect has just started it on these very weights
            self.fresh = False
            return 0
        old = self.serving
        folder = self._write_model(policy, base=False)
        self._start_server(folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return folder_bytes(folder)

    # ---- sampling ---------------------------------------------------------------------------------------------

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        return sample_per_request(self, "engine=max", prompt_ids_P, group_size, params, seeds, with_entropy)

    def _check_logprobs_available(self, params: SamplingParams) -> None:
        if params.temperature > 0 and abs(params.temperature - 1.0) > 1e-6:
            raise ValueError(f"engine=max: MAX returns log-probabilities at temperature 1 (before its temperature), "
                             f"but sampling runs at temperature {params.temperature:g}: use temperature 1 (or 0) with "
                             "engine=max, or another engine")

    def _body(self, prompt_ids: list[int], n: int, params: SamplingParams, seed: int, **extra) -> dict[str, Any]:
        body = {"model": self.served, "prompt": list(prompt_ids), "n": 1, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "top_k": self.vocab_size, "min_p": 0.0,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "stop_token_ids": self.eos_ids, "seed": seed, "logprobs": 1}
        if extra.pop("ignore_eos", False):
            body["ignore_eos"] = True
        return body | extra

    def _read_choices(self, reply: dict, n: int, with_logprobs: bool) -> list[tuple[list[int], list[float]]]:
        """[(token ids, logprobs)]: the ids from each position's top-logprobs text (module docstring)."""
        try:
            rows = []
            for choice in sorted(reply["choices"], key=lambda c: c["index"]):
                sampled = [float(x) for x in choice["logprobs"]["token_logprobs"]]
                tops = choice["logprobs"]["top_logprobs"]
                stopped = choice.get("finish_reason") == "stop"
                ids = [self._sampled_id(top, lp, stopped and i == len(sampled) - 1)
                       for i, (top, lp) in enumerate(zip(tops, sampled, strict=True))]
                rows.append((ids, sampled if with_logprobs else [0.0] * len(ids)))
        except (KeyError, TypeError, ValueError) as err:
            raise ServerError(f"engine=max: malformed completions reply ({type(err).__name__}: {err})") from err
        if len(rows) != n:
            raise ServerError(f"engine=max: asked for {n} completion(s), the server returned {len(rows)}")
        return rows

    def _sampled_id(self, top: Mapping[str, float], logprob: float, stop: bool) -> int:
        """The id whose text carries the sampled log-probability; a stop token (MAX decodes special tokens to "")
        is told apart by the completion having stopped there."""
        texts = [text for text, value in top.items() if value == logprob]
        if len(texts) != 1:
            raise ValueError(f"{len(texts)} top-logprobs entries carry the sampled token's log-probability {logprob}")
        ids = self.vocabulary.get(texts[0], [])
        eos = [i for i in ids if i in self.eos_ids]
        if stop and len(eos) == 1:
            return eos[0]
        if len(ids) != 1:
            raise ValueError(f"the sampled token's text {texts[0]!r} is the decoding of {len(ids)} token ids "
                             f"{ids[:5]}: MAX returns no ids, so it cannot be told which")
        return ids[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def load_tokenizer(source: str | None):
    if not source:
        raise ConfigError("invalid config:\n  engine.tokenizer is null and the policy names no hub id or folder to "
                          "load its tokenizer from: set engine.tokenizer (MAX serves it beside the weights, and the "
                          "engine maps MAX's token texts back to ids with it)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def vocabulary(tokenizer) -> dict[str, list[int]]:
    """Each id's decoded text → the ids that decode to it, as MAX decodes one token for its top-logprobs (special
    tokens skipped: they decode to "")."""
    by_text: dict[str, list[int]] = {}
    for token_id in range(len(tokenizer)):
        by_text.setdefault(tokenizer.decode([token_id], skip_special_tokens=True), []).append(token_id)
    return by_text


def lora_rank(policy: nn.Module) -> int:
    from rlvr.engine.vllm import adapter_rank

    return adapter_rank(cast("Any", policy))
