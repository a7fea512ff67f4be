"""Exact step capture: one RL step's optimizer update, written so that `rlvr replay` can run it again and prove the
same update comes out (rlvr/cli/replay.py). This is how a speed or memory change to the backend (packing, micro-
batches, a new kernel) is shown to leave the update unchanged: capture a step before the change, replay it after.

`trainer.capture_steps=[N, …]` (0-based step indices, as metrics.jsonl's `step`; backend=local only, LoRA or full
fine-tuning) writes, at each step N that trains, before and after its `backend.train_step`:

    <run>/captures/step_<N>/
      manifest.json         what the files are and their sha256 pins (below)
      payload.safetensors   the TrainBatch the update consumed: every tensor of its rollouts (completion tokens,
                            masks, the engine's log-probabilities, …), its advantages (and ECHO weights), floats as
                            float64 (cast back to their dtypes on replay: exact), and the RNG state the update
                            starts from (`rng.torch`, `rng.cuda`: dropout, if the model has any, draws from it); the
                            file's metadata holds the dtypes and the rollouts' other fields (prompt ids, group size,
                            temperature, …) as JSON, so the payload's sha256 covers them
      config.json           the run's composed config, resolved (what rebuilds the loss, the backend, the model)
      start/                the backend's state before the update, written by its checkpoint writer (`save`):
                            adapter or full weights, optimizer.pt (AdamW moments, step counts), local_state.json
      result.safetensors    the trainable parameters after the update

`manifest.json` pins by sha256 every file above (`files`) and the run's `base/base.json` (`base`: which in turn pins
the base weights; `load_base` checks them), records the step, the learning rate, the batch's row count, the torch
version, thread count and device of the update, the step's loss and gradient norm, and the result's per-tensor sha256.
Its own sha256 is logged at capture (`captured step N: … manifest sha256 …`): `rlvr replay --expect-manifest` checks
it, which catches a manifest rewritten together with the files it pins.

Exactness: on a CPU the captured update runs on one thread (`torch.set_num_threads(1)` around the update alone,
restored after; the run's other work keeps its threads), so a replay on one thread of the same torch build gives the
same bits. With more threads a CPU reduction may sum in another order: replay then reports the largest |Δ| per tensor
(measured: README, "Exact step capture and replay"). On a GPU the update runs as the run ran it; a replay is compared
and its differences reported the same way (cuBLAS/cuDNN are not bitwise deterministic by default; not run here: no
GPU in these sessions).

A step with nothing to train (every group's rewards tied) makes no update and writes no capture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.model.base_folder import file_sha256
from rlvr.types import Rollouts, TeacherSupport, TrainBatch

if TYPE_CHECKING:
    from torch import Tensor, nn

    from rlvr.protocols import Loss

torch = lazy_import("torch")
safetensors_torch = lazy_import("safetensors.torch")

log = logging.getLogger("rlvr")

FORMAT = "rlvr-capture/1"
MANIFEST = "manifest.json"
PAYLOAD = "payload.safetensors"
CONFIG = "config.json"
START = "start"
RESULT = "result.safetensors"
CAPTURES = "captures"
BASE_PIN = "base/base.json"
"""The run's base record (rlvr/model/base_folder.py), pinned relative to the run folder: it pins the base weights."""
LOCAL_BACKEND = "rlvr.backend.local.LocalBackend"
"""The one backend whose update a capture holds (its `save`/`load` are exact; fsdp's shards and Tinker's service
are refused at config time, rlvr/config_check.py)."""

def capture_dir(run: Path, step: int) -> Path:
    return Path(run) / CAPTURES / f"step_{step}"


def tensor_sha256(t: Tensor) -> str:
    """sha256 of a tensor's bytes (on the CPU, contiguous): equal hashes, equal bits."""
    return hashlib.sha256(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def trainable_state(policy: nn.Module) -> dict[str, Tensor]:
    """The parameters an update changes (the adapter under LoRA, every weight under full fine-tuning), by name,
    detached copies on the CPU."""
    return {name: p.detach().cpu().clone() for name, p in policy.named_parameters() if p.requires_grad}


def to_payload(batch: TrainBatch, rng: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors, metadata) of `payload.safetensors`: every tensor of the batch as `rollouts.<field>`, `adv_PG_T`,
    `echo_PG_T`, `distill.<field>` (the teacher's support), floats widened to float64, and the RNG states as
    `rng.<name>`; the metadata holds each tensor's dtype as trained, the rollouts' other fields (prompt ids, group
    size, temperature, …) and the support's divergence (`distill`: beta, tail) as JSON, so the payload's sha256 pins
    them too."""
    ro = batch.rollouts
    tensors: dict[str, Tensor] = {}
    plain: dict[str, Any] = {}
    for f in dataclasses.fields(ro):
        value = getattr(ro, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f"rollouts.{f.name}"] = value
        else:
            plain[f.name] = value
    tensors["adv_PG_T"] = batch.adv_PG_T
    if batch.echo_PG_T is not None:
        tensors["echo_PG_T"] = batch.echo_PG_T
    divergence: dict[str, Any] = {}
    if batch.distill is not None:
        for f in dataclasses.fields(batch.distill):
            value = getattr(batch.distill, f.name)
            if isinstance(value, torch.Tensor):
                tensors[f"distill.{f.name}"] = value
            else:
                divergence[f.name] = value
    dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()}
    stored = {k: (v.double() if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in tensors.items()}
    stored |= {f"rng.{k}": v.clone() for k, v in rng.items()}
    metadata = {"dtypes": json.dumps(dtypes), "rollouts": json.dumps(plain)}
    return stored, metadata | ({"distill": json.dumps(divergence)} if divergence else {})


def from_payload(stored: Mapping[str, Tensor], metadata: Mapping[str, str]) -> tuple[TrainBatch, dict[str, Tensor]]:
    """The TrainBatch `to_payload` stored, every tensor in its dtype as trained, and the RNG states."""
    dtypes = json.loads(metadata["dtypes"])

    def get(name: str) -> Tensor | None:
        return stored[name].to(getattr(torch, dtypes[name])) if name in stored else None

    fields: dict[str, Any] = json.loads(metadata["rollouts"])
    fields |= {k.removeprefix("rollouts."): get(k) for k in dtypes if k.startswith("rollouts.")}
    adv = get("adv_PG_T")
    assert adv is not None, "a payload holds the advantages"
    rng = {k.removeprefix("rng."): v for k, v in stored.items() if k.startswith("rng.")}
    support: dict[str, Any] = {k.removeprefix("distill."): get(k) for k in dtypes if k.startswith("distill.")}
    if support:
        support |= json.loads(metadata.get("distill", "{}"))
    return TrainBatch(Rollouts(**fields), adv, get("echo_PG_T"), TeacherSupport(**support) if support else None), rng


def rng_states(device: str) -> dict[str, Tensor]:
    """The generator states an update may draw from (dropout): torch's CPU one, and the GPU's on a GPU."""
    states = {"torch": torch.get_rng_state()}
    if device == "cuda":
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: Mapping[str, Tensor]) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])


@contextmanager
def one_cpu_thread(device: str):
    """torch on one thread for the block on a CPU (the captured update, and its replay); elsewhere unchanged."""
    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Capture:
    """`trainer.capture_steps`: the steps whose update is captured (rlvr/trainer.py calls `train_step` for every
    step that trains; it is the backend's own unless the step is one of these)."""

    steps: frozenset[int] = field(default_factory=frozenset)

    def train_step(self, live: Any, step: int, batch: TrainBatch, loss: Loss, lr: float) -> dict[str, float]:
        """`live.backend.train_step(batch, loss, lr)`; at a captured step, written down before and after. `live`: the
        trainer's working set (rlvr/trainer.py `Live`, not imported here: the trainer imports this module)."""
        if step not in self.steps:
            return live.backend.train_step(batch, loss, lr)
        backend = live.backend
        device = str(next(backend.policy.parameters()).device.type)
        final = capture_dir(live.out.path, step)
        tmp = final.with_name(f".{final.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        backend.save(tmp / START)
        payload, metadata = to_payload(batch, rng_states(device))
        safetensors_torch.save_file(payload, str(tmp / PAYLOAD), metadata=metadata)
        (tmp / CONFIG).write_text(json.dumps(live.c.config, indent=2, sort_keys=True) + "\n")
        with one_cpu_thread(device):
            stats = backend.train_step(batch, loss, lr)
        result = trainable_state(backend.policy)
        safetensors_torch.save_file(result, str(tmp / RESULT))
        base = live.out.path / BASE_PIN
        manifest = {
            "format": FORMAT,
            "step": step,
            "lr": lr,
            "rows": int(batch.rollouts.tokens_PG_T.shape[0]),
            "device": device,
            "threads": 1 if device == "cpu" else torch.get_num_threads(),
            "torch": torch.__version__,
            "backend": live.c.config["backend"]["_target_"],
            "lora": live.c.preset.lora is not None,
            "config_sha256": live.c.config_sha256,
            "files": {p.relative_to(tmp).as_posix(): file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()},
            "base": {BASE_PIN: file_sha256(base) if base.is_file() else None},
            "result": {"sha256": state_sha256(result), "tensors": {k: tensor_sha256(v) for k, v in result.items()}},
            "stats": {k: stats[k] for k in ("loss", "grad_norm", "train/nonfinite_skip") if k in stats},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)  # a resumed run that trains this step again
        tmp.rename(final)
        log.info("captured step %d: %s (manifest sha256 %s); replay it with: rlvr replay %s", step, final,
                 file_sha256(final / MANIFEST), final)
        return stats


def state_sha256(state: Mapping[str, Tensor]) -> str:
    """One sha256 over a state's tensors, by sorted name: (name, dtype, shape, bytes) each."""
    digest = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{tensor_sha256(t)}\n".encode())
    return digest.hexdigest()
