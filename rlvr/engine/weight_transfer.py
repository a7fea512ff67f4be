"""`engine=openai engine.weight_transfer=nccl`: full weights to a vLLM server through vLLM 0.32's own weight-transfer
API for RL (vllm/distributed/weight_transfer/, the routes of vllm/entrypoints/rl/online/api_router.py), over NCCL,
without files.

The round trip, as vLLM's `NCCLTrainerWeightTransferEngine` drives it (this module supplies its two inputs):
  once, in `connect`:  GET {root}/get_world_size → W (the server's workers); this process opens an NCCL group of
                       1 + W ranks as rank 0 at `nccl_host`:<a free port>, while POST {root}/init_weight_transfer_engine
                       makes the server's workers join it (ranks 1 … W);
  each sync:           POST /start_weight_update (vLLM's layerwise reload begins), POST /update_weights with the
                       names, dtypes and shapes while this process broadcasts the tensors themselves in packed
                       buffers (vLLM's default size), POST /finish_weight_update (layers processed, LoRA state reset);
                       then POST /reset_prefix_cache.
The tensors are the policy's state dict as `save_full` writes it (each tensor once, rlvr/engine/vllm_weights.py
`named_weights`; under LoRA the W0 that `save_base` writes), in the policy's own dtype (the server's weight loaders
cast), read from its GPU memory. Nothing is written to a file: a sync's bytes written are 0. LoRA adapters still go
through `/v1/load_lora_adapter` from a folder (vLLM loads adapters from folders only).

Needs: CUDA in this process with the policy on it, vLLM installed here too (the trainer side of the API is vLLM's
code), and a server started with `--weight-transfer-config '{"backend": "nccl"}'` and VLLM_SERVER_DEV_MODE=1 (the
RL routes are mounted in dev mode only) whose workers can reach `nccl_host`. The requests go without retries:
a repeated /update_weights would wait for a broadcast that is not coming. Built against vLLM 0.32's API as
installed; NCCL needs GPUs, so this path has not been run on the CPU machines rlvr is tested on (the refusal
without CUDA and the weight source are).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.engine.vllm_weights import named_weights
from rlvr.protocols import Finding
from rlvr.requirements import distribution_version, pip_extra

if TYPE_CHECKING:
    from torch import nn

    from rlvr.openai_api import OpenAIClient

WEIGHT_TRANSFERS = ("files", "nccl")


@dataclass(frozen=True)
class NcclTransfer:
    """`engine.weight_transfer=nccl` needs vLLM importable here and a CUDA device: checked by every run at start."""

    weight_transfer: str
    item: str = "weight transfer"
    at_start: bool = True

    def check(self) -> Finding:
        if self.weight_transfer != "nccl":
            return Finding("ok", f"engine.weight_transfer={self.weight_transfer}: weights go through folders")
        files = "or set engine.weight_transfer=files (a folder per sync, which the server must be able to read)"
        if distribution_version("vllm") is None:
            return Finding("missing", "engine.weight_transfer=nccl runs vLLM's weight-transfer API in this process, "
                                      f"and the CUDA build of vllm is not installed here ({pip_extra('vllm')}); "
                                      f"{files}")
        import torch

        if not torch.cuda.is_available():
            return Finding("missing", "engine.weight_transfer=nccl broadcasts the weights from GPU memory over "
                                      f"NCCL, and torch {torch.__version__} sees no CUDA device; {files}")
        return Finding("ok", "engine.weight_transfer=nccl: weights are broadcast to the server over NCCL")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def policy_source(policy: nn.Module, base: bool) -> Any:
    """The policy's weights as vLLM's weight-transfer API reads them (a `WeightSource`): `named_weights(policy,
    base)`, in their own dtypes, on their own device; `policy` and `base` are read at each pass."""
    from vllm.distributed.weight_transfer import ParamMeta, WeightSource

    class PolicySource(WeightSource):
        def __init__(self) -> None:
            self.policy, self.base = policy, base

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in named_weights(self.policy, self.base)]

        def __iter__(self):
            return named_weights(self.policy, self.base)

    return PolicySource()


class ServerWeightSync:
    """vLLM's `VLLMWeightSyncClient` protocol over rlvr's client (the API key, `timeout_s`, no retries)."""

    def __init__(self, client: OpenAIClient, root: str) -> None:
        self.client, self.root = client, root

    def _post(self, route: str, body: dict[str, Any] | None = None) -> None:
        response = self.client.request("POST", f"{self.root}/{route}", body)
        if not response.is_success:
            raise RuntimeError(f"POST {self.root}/{route} answered HTTP {response.status_code}: "
                               f"{response.text[:300]}")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._post("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("finish_weight_update", {"weight_version": weight_version} if weight_version else None)

    def shutdown_weight_transfer_engine(self) -> None:
        self._post("shutdown_weight_transfer_engine")


class NcclSender:
    """The trainer's end of the NCCL weight transfer to one server (module docstring)."""

    def __init__(self, client: OpenAIClient, root: str, host: str, policy: nn.Module) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        device = next(policy.parameters()).device
        if device.type != "cuda":
            raise RuntimeError(f"engine.weight_transfer=nccl broadcasts from GPU memory, but the policy is on {device}")
        response = client.request("GET", f"{root}/get_world_size")
        if not response.is_success:
            raise RuntimeError(f"GET {root}/get_world_size answered HTTP {response.status_code} (the RL routes need "
                               "the server's VLLM_SERVER_DEV_MODE=1)")
        workers = int(response.json()["world_size"])
        self.sync = ServerWeightSync(client, root)
        self.source = policy_source(policy, base=False)
        init = NCCLTrainerInitInfo(master_address=host, master_port=free_port(), world_size=1 + workers, rank=0)
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(init, client=self.sync, source=self.source)

    def send(self, policy: nn.Module, base: bool = False) -> None:
        """Every weight of `policy` (W0 with `base`) to the server; its prefix cache is reset after."""
        self.source.policy, self.source.base = policy, base
        self.engine.send_weights()
        self.sync._post("reset_prefix_cache")

    def close(self) -> None:
        self.engine.shutdown()
        self.sync.shutdown_weight_transfer_engine()
