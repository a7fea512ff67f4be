"""How many runs a pack holds when `hydra.launcher.pack_size` is null: as many as fit in the memory left.

A pack's cells share one copy of each distinct base (the cells of one seed share its weights, drawn from the seed
or trained by its warm-up; a pretrained model without a warm-up is one base for every cell) and take turns, so one
cell's activations are live at a time; sampling together is bounded by the engine's `max_batch_rows`, whatever the
number of cells. What grows with the cells is each cell's own:

    pack bytes = bases × (base + engine) + cells × (trainable × (2 × weight bytes + 8) + CELL_OVERHEAD_MIB)

where `base` is the base weights' bytes, `engine` what an engine=vllm holds for each base (its own copy of the
weights and its KV cache: `engine.kv_cache_memory_bytes`, 1 GiB on a CPU when null, else
`engine.gpu_memory_utilization` of the GPU; 0 for engine=pytorch, which samples with the trained module), and
`trainable` the adapter's parameters (each with its gradient in the
weights' dtype and Adam's two float32 moments), both counted on the model built on the meta device with its LoRA
attached (no weights read, no memory taken). A pack fits when its bytes are at most `SHARE` of what is free where
the runs train: the GPU's free memory (backend.device cuda, or auto with one visible), else the host's available
memory (MemAvailable, or the cgroup's limit less its use when lower). The jobs of a group fill packs in the sweep's
order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

if TYPE_CHECKING:
    from rlvr.protocols import ModelPreset

log = logging.getLogger("rlvr")

CELL_OVERHEAD_MIB = 60
"""What a cell holds beyond its adapter and optimizer (its data, held-out set, rollouts, its run's objects), as
measured: `python -m bench.grid` gives 804 MiB peak for 6 cells of the default task against 508 MiB for one run
(59 MiB a cell, docs/measured/grid.md)."""

SHARE = 0.8
"""The fraction of the free memory a pack may plan to fill: the rest is for allocator slack and other jobs."""


@dataclass(frozen=True)
class Budget:
    """The memory a pack may fill and what its parts take, in bytes."""

    free: int
    """Free memory where the runs train (`free_memory`)."""
    base: int
    """One copy of the base weights."""
    cell: int
    """One cell's own: its adapter, gradients, Adam moments and `CELL_OVERHEAD_MIB`."""
    where: str
    """"the GPU" or "this host": where `free` was read."""
    engine: int = 0
    """What the engine holds for each base (engine=vllm: its copy of the weights and its KV cache)."""

    def fits(self, cells: int, bases: int) -> bool:
        return bases * (self.base + self.engine) + cells * self.cell <= SHARE * self.free

    def describe(self) -> str:
        mib = 2**20
        engine = f", its vLLM {self.engine / mib:.0f} MiB" if self.engine else ""
        return (f"a cell {self.cell / mib:.0f} MiB, a base copy {self.base / mib:.0f} MiB{engine}, "
                f"{self.free / 2**30:.1f} GiB free on {self.where} (a pack fills at most {SHARE:.0%} of it)")


def budget(cfg: DictConfig) -> Budget | None:
    """The budget of a pack of `cfg`'s runs (a LoRA run: its model node with `lora`); None when its model cannot be
    built without its weights here (a pretrained model whose config is not on this machine), then the log says so."""
    from hydra.utils import instantiate

    try:
        preset = instantiate(cfg.model, _convert_="all")
        module = preset.skeleton()
    except Exception as error:  # noqa: BLE001 - the plan is an estimate; the runs say what is wrong themselves
        log.info("pack size: the model's shape is not known here (%s: %s)", type(error).__name__, error)
        return None
    base, trainable, weight_bytes = adapted_sizes(module, preset.lora)
    cell = trainable * (2 * weight_bytes + 8) + CELL_OVERHEAD_MIB * 2**20
    gpu = on_gpu(cfg)
    free, where = free_memory(gpu)
    return Budget(free, base, cell, where, engine_bytes(cfg, base, gpu))


def engine_bytes(cfg: DictConfig, base: int, gpu: bool) -> int:
    """What the run's engine holds for each base beside the trainer's copy (module docstring): an engine that
    samples several adapters on one base (`multi_lora`: engine=vllm) holds a model of its own."""
    from rlvr.config_check import declared_needs

    if "multi_lora" not in declared_needs(cfg, "engine").provides:
        return 0
    kv = cfg.engine.get("kv_cache_memory_bytes")
    if kv is None and gpu:
        import torch

        return int(cfg.engine.gpu_memory_utilization * torch.cuda.mem_get_info()[1])  # weights and KV cache
    from rlvr.engine.vllm import CPU_KV_CACHE_BYTES

    return base + int(kv if kv is not None else CPU_KV_CACHE_BYTES)


def adapted_sizes(module: Any, lora: Any) -> tuple[int, int, int]:
    """(base bytes, adapter parameters, bytes of a weight) of a meta-device module once `lora` is attached."""
    import peft

    base = sum(p.numel() * p.element_size() for p in module.parameters())
    weight_bytes = next(module.parameters()).element_size()
    adapted = peft.get_peft_model(module, lora.to_peft())
    return base, sum(p.numel() for p in adapted.parameters() if p.requires_grad), weight_bytes


def on_gpu(cfg: DictConfig) -> bool:
    """The runs train on a CUDA device (backend.device cuda…, or auto where torch sees one)."""
    device = str(cfg.backend.get("device", "auto"))
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def free_memory(gpu: bool) -> tuple[int, str]:
    """(bytes free, where): the current CUDA device's free memory, or the host's (`host_available`)."""
    if gpu:
        import torch

        return torch.cuda.mem_get_info()[0], "the GPU"
    return host_available(), "this host"


def host_available(root: Path = Path("/")) -> int:
    """MemAvailable from /proc/meminfo, or the cgroup (v2) limit less its current use when that is lower."""
    meminfo = (root / "proc/meminfo").read_text().splitlines()
    available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    cgroup = root / "sys/fs/cgroup"
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text())
    except OSError:
        return available
    return available if limit == "max" else min(available, int(limit) - used)


def filling(bases: list[str], budget: Budget) -> Callable[[list[int]], bool]:
    """Whether the jobs at these indices fit one pack: its cells and their distinct bases (`bases[i]`: which base
    job i's cell starts from, `base_of`)."""
    return lambda pack: budget.fits(len(pack), len({bases[i] for i in pack}))


def base_of(seed: object, warmup_steps: int, seeded: bool) -> str:
    """Which base a run's cell shares: its seed's when the model draws its weights from the seed (`seeded`: the
    built-in models) or a warm-up trains them, else the model's one base (pretrained weights)."""
    return str(seed) if seeded or warmup_steps > 0 else ""


def seeded(cfg: DictConfig) -> bool:
    """The run's model draws its weights from its seed (`ModelPreset.seeded`), read from the class alone."""
    from hydra.utils import get_class

    preset: type[ModelPreset] = get_class(cfg.model._target_)
    return preset.seeded
