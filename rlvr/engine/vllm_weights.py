"""The policy's weights handed to vLLM in memory: the trainer's side (`weight_chunks`, `pack`) and the methods
rlvr adds to vLLM's worker (`WeightReceiver`), which `engine=vllm` calls through `collective_rpc`.

What is sent. The names and tensors `save_full` would write (the Hugging Face state dict, a tensor tied to another,
such as a tied lm_head, once, under the first name), or with `base=True` those `save_base` would write (a LoRA
policy's W0 under its plain names, no adapter), each cast to the engine's dtype, in chunks: consecutive tensors
whose bytes (in that dtype) add up to at most `budget` (a larger tensor is a chunk alone). A tensor already in the
engine's dtype and on its device is handed over as it is (no copy); a cast copies one chunk at a time. So besides
the policy and vLLM's own weights, at most one chunk of copies exists at once, plus what vLLM buffers itself (a
layer's tensors until the layer is complete; the state dict lists a layer's tensors together).

How vLLM takes them: its layerwise reload (vllm/model_executor/model_loader/reload/), the path of its own
`reload_weights` and of its NCCL weight-transfer engine. `rlvr_begin_weights` moves every layer's tensors aside
(`initialize_layerwise_reload`), each `rlvr_load_weights(chunk)` is one `model.load_weights` (vLLM renames and fuses:
q/k/v into qkv_proj, gate/up into gate_up_proj), a layer whose tensors are all in is processed at once (its
`process_weights_after_loading`: on CPU, the packed GEMM weights of its linear layers) and copied back into the
tensors the model runs with, and `rlvr_finish_weights` processes the rest (`finalize_layerwise_reload`), then:
  - re-runs the post-load step of every embedding layer: vLLM's layerwise reload processes a tied parameter with
    one of its layers only (the embedding), and on CPU the LM head keeps a packed copy of the tied matrix for its
    GEMM, which would stay stale (measured on the tiny model: log-probability gaps of 2.2 until re-packed; a no-op
    on a GPU);
  - invalidates what vLLM derived from the old weights (LoRA adapters, encoder and multimodal caches), as
    `reload_weights` does;
  - raises if any of the model's parameters received nothing: a partial update would serve a mixture of old and
    new weights.

Across processes (`engine.multiprocessing: true`: the engine core, and the worker in it, run in a child process):
`collective_rpc`'s arguments are encoded with msgpack there, and a tensor nested in them arrives as a bare
[dtype, shape, buffer index] list whose buffer is gone (vLLM decodes tensors only where a type annotation asks for
one). So each chunk travels `pack`ed: its names, dtypes and shapes, and one `bytes` with every tensor's bytes back
to back, which the worker views as tensors again (`unpack`, no copy on that side). That costs the trainer one copy
of the chunk into the buffer and msgpack/ZeroMQ another; nothing is written to a file. In-process (the default)
the chunk's tensors are passed by reference.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from rlvr.engine.policy_files import is_lora
from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from peft import PeftModel
    from torch import Tensor, dtype, nn

torch = lazy_import("torch")

Chunk = list[tuple[str, "Tensor"]]
PackedChunk = dict[str, Any]
"""{"names": [str], "dtypes": [str], "shapes": [[int]], "data": bytes}: a chunk as msgpack carries it."""


def named_weights(policy: nn.Module, base: bool = False) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) as `save_full` (or, with `base`, `save_base`) writes them: the state dict of the Hugging Face
    model, each tensor once (a tied one under its first name), detached; under LoRA with `base`, W0 under plain
    names."""
    if base and is_lora(policy):
        inner = cast("PeftModel", policy).get_base_model()
        state = {name.replace(".base_layer.", "."): t for name, t in inner.state_dict(keep_vars=True).items()
                 if "lora_" not in name}
    elif is_lora(policy):
        raise TypeError("the full weights of a LoRA policy are W0 plus its adapter: send W0 (base=True) and load the "
                        "adapter")
    else:
        state = policy.state_dict(keep_vars=True)
    seen: set[int] = set()
    for name, tensor in state.items():
        if id(tensor) in seen:  # tied: the same Parameter under a second name
            continue
        seen.add(id(tensor))
        yield name, tensor.detach()


def weight_chunks(policy: nn.Module, dtype: dtype, budget: int, base: bool = False) -> Iterator[Chunk]:
    """`named_weights` cast to `dtype`, in chunks of at most `budget` bytes (a larger tensor alone). A chunk's copies
    are made when it is yielded, so only the current one exists at a time."""
    if budget <= 0:
        raise ValueError(f"budget={budget} bytes must be > 0")
    pending: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in named_weights(policy, base):
        nbytes = tensor.numel() * dtype.itemsize
        if pending and size + nbytes > budget:
            yield [(n, t.to(dtype)) for n, t in pending]
            pending, size = [], 0
        pending.append((name, tensor))
        size += nbytes
    if pending:
        yield [(n, t.to(dtype)) for n, t in pending]


def chunk_bytes(chunk: Chunk) -> int:
    return sum(t.numel() * t.element_size() for _, t in chunk)


def pack(chunk: Chunk) -> PackedChunk:
    """The chunk as msgpack-native values (for a worker in another process): one buffer holds every tensor's
    bytes, in order."""
    buffer = bytearray(chunk_bytes(chunk))
    flat = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.zeros(0, dtype=torch.uint8)
    offset = 0
    for _, tensor in chunk:
        raw = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        flat[offset : offset + raw.numel()].copy_(raw)
        offset += raw.numel()
    return {"names": [n for n, _ in chunk], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in chunk],
            "shapes": [list(t.shape) for _, t in chunk], "data": bytes(buffer)}


def unpack(packed: PackedChunk) -> Chunk:
    """`pack`'s inverse: views into `data` (read only: vLLM copies them into its own parameters)."""
    data = packed["data"]
    dtypes = [getattr(torch, name) for name in packed["dtypes"]]
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in zip(packed["shapes"], dtypes, strict=True)]
    if sum(sizes) != len(data):
        raise ValueError(f"packed chunk: {len(data)} bytes of data, but its shapes and dtypes describe {sum(sizes)}")
    with warnings.catch_warnings():  # bytes are read-only; the views are only ever read
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.zeros(0, dtype=torch.uint8)
    chunk, offset = [], 0
    for name, dtype, shape, nbytes in zip(packed["names"], dtypes, packed["shapes"], sizes, strict=True):
        chunk.append((name, flat[offset : offset + nbytes].view(dtype).reshape(shape)))
        offset += nbytes
    return chunk


class WeightReceiver:
    """Methods rlvr adds to vLLM's worker class (`LLM(worker_extension_cls=RECEIVER)`), called by name through
    `collective_rpc`: `rlvr_begin_weights`, then `rlvr_load_weights(chunk)` per chunk, then `rlvr_finish_weights`
    (the module docstring says what each does). They run on the worker, which vLLM gives `model_runner` and
    `vllm_config`."""

    model_runner: Any
    vllm_config: Any

    def rlvr_begin_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.rlvr_loaded: set[str] = set()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def rlvr_load_weights(self, chunk: Chunk | PackedChunk) -> None:
        from vllm.config import set_current_vllm_config

        pairs = unpack(chunk) if isinstance(chunk, dict) else chunk
        with set_current_vllm_config(self.vllm_config):
            self.rlvr_loaded |= set(self.model_runner.get_model().load_weights(pairs))

    def rlvr_finish_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            repack_embeddings(model)
        self.model_runner.reset_lora_state()
        self.model_runner.reset_encoder_cache()
        self.model_runner.reset_mm_cache()
        lora = self.vllm_config.lora_config is not None
        expected = {name.replace(".base_layer.", ".") if lora else name for name, _ in model.named_parameters()}
        missing = sorted(expected - self.rlvr_loaded)
        if missing:
            raise RuntimeError(f"the weight sync left {len(missing)} of vLLM's {len(expected)} parameters as they "
                               f"were (the policy's state dict has nothing vLLM maps to them): {missing[:5]}")


def repack_embeddings(model: nn.Module) -> None:
    """Re-run every embedding layer's post-load step on vLLM's `model`: on CPU it packs the matrix for the LM head's
    GEMM, a copy that a reload of a tied embedding leaves stale (a no-op on a GPU)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)


RECEIVER = f"{WeightReceiver.__module__}.{WeightReceiver.__qualname__}"
"""The qualified name vLLM imports the worker extension by (in the engine core's process too)."""
