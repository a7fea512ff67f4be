"""`backend=fsdp`: `backend=local`'s training, the policy sharded over the run's processes with FSDP2.

Started by torchrun or as a SLURM job of several tasks (rlvr/distributed.py), each process holds a shard of
every parameter (`fully_shard` per decoder layer, then the root), LoRA or full fine-tuning alike. Mixed
precision: the shards, which the optimizer updates, are float32; each unit is gathered in `model.dtype` for its
forward and backward, and gradients are reduced in float32 (so bf16 full fine-tuning keeps float32 master
weights and moments, 16 bytes a parameter over the ranks). One process is a world of one: the same code, no
communication. The model is sharded where it was built (the CPU): `fully_shard` moves each unit's shard to
this rank's device, so no device ever holds the whole model while training.

A step, on every rank (each has the whole step's rollouts and advantages, rlvr/trainer.py):

    rows with signal, in order              the same N rows as backend=local's
    this rank's share                       contiguous, ⌈N/W⌉ or ⌊N/W⌋ rows (rlvr.distributed.World.share)
    micro-batches                           ⌈⌈N/W⌉ / micro_batch_size⌉ on every rank (micro_batch_size 0: one),
                                            a rank with fewer rows runs a zero-weight pass instead, because
                                            every forward and backward is a collective
    kl_cov / clip_cov                       the step's token pick, from every rank's no-grad log-probabilities
    each micro-batch's loss                 Σ ℓ over its tokens / the whole step's token count, × W
    gradients                               FSDP2 averages over the W ranks: Σ over all rows / the step's count,
                                            the single-process gradient on the same rows
    norm, clip, AdamW step                  on the sharded (DTensor) parameters; the norm is the global one

so the update is the single-process one up to float summation order (tests/distributed compare them to 1e-5).

Sampling (engine=pytorch) reads the policy unsharded: `policy` all-gathers every parameter and keeps it
gathered (forward passes then need no communication, so each rank decodes its own groups for as many steps
as they need) until `train_step` shards it again. The price is the whole model on every device while
sampling, as verl's colocated rollout pays it; LoRA's merged-copy fast path (engine.merge_lora) does not apply.

Checkpoints (`save`, `load`): `torch.distributed.checkpoint` writes each rank's shard of the trainable weights
and of the optimizer into `<checkpoint>/dcp/`, and rank 0 writes the full adapter (or full weights) as
backend=local does, so `rlvr eval/sample/export` read them as before. `load` reads `dcp/` on any number of
processes (DCP reshards: 2 → 1 and 1 → 2 are tested). kl_cov/clip_cov pick their tokens over the whole step as
on one process: each rank's no-grad pass gives its rows' log-probabilities, gathered to every rank, and every rank
makes the same pick (clip_cov's draw is seeded from the run's seed and the step counter). The reference of
`algorithm.kl`: under LoRA the adapter disabled; under full fine-tuning a frozen copy of the base, sharded as the
policy in the compute dtype (1/W of it per rank, no float32 master, no optimizer state); its passes are collectives,
paired over the ranks as the gradient passes are (`reference_logprobs` for where=reward: each rank its share, added
over the ranks). Not yet: multi-turn episodes (refused at start).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr import distributed
from rlvr.algorithm.correction import MAXED, SUMMED
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import (
    STATE_FILE,
    LocalBackend,
    StepRows,
    Trainee,
    frozen_copy,
    prepare,
    resolve_device,
    selection_generator,
)
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.types import LoraSpec, Rollouts, TrainBatch

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PreTrainedModel

torch = lazy_import("torch")
dist = lazy_import("torch.distributed")
dcp = lazy_import("torch.distributed.checkpoint")
fsdp = lazy_import("torch.distributed.fsdp")
device_mesh = lazy_import("torch.distributed.device_mesh")
state_dict_api = lazy_import("torch.distributed.checkpoint.state_dict")
peft = lazy_import("peft")
safetensors_torch = lazy_import("safetensors.torch")

SHARDS = "dcp"
"""The folder of a checkpoint that holds the sharded weights and optimizer state."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, each its own FSDP unit: the classes a Hugging Face model names in
    `_no_split_modules` (LlamaDecoderLayer, Qwen3DecoderLayer, …), else any module whose class ends in
    DecoderLayer."""
    base = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in base.modules()
            if type(m).__name__ in names or (not names and type(m).__name__.endswith("DecoderLayer"))]


class FSDPBackend:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        local = LocalBackend.needs(settings)  # what backend=local gives and asks of the machine, and more
        return Needs(provides=(local.provides - {"entropy", "capture"}) | {"distributed"}, machine=local.machine,
                     requires={"group_seeds": "backend=fsdp: each rank samples its own share of the groups"},
                     errors=local.errors)

    def __init__(
        self,
        model: nn.Module,
        lora: LoraSpec | None,
        lora_seed: int,
        pad_id: int,
        device: str,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
        micro_batch_size: int,
        gradient_checkpointing: bool,
        reshard_after_forward: bool,
        timeout_s: float,
        world: distributed.World,
        packing: bool = False,
        max_tokens_per_micro_batch: int = 0,
        reference: bool = False,
    ) -> None:
        self.world = world
        device = resolve_device(device).type
        if device == "cuda":
            device = f"cuda:{self.world.local_rank}"
        distributed.init(self.world, device, timeout_s)  # rlvr.run has done it already; a test may not have
        self.reshard_after_forward = reshard_after_forward
        self.lora = lora
        self.device = resolve_device(device)
        # left where it was built (the CPU): `fully_shard` moves each unit's shard to the device, so no device holds
        # the whole model at once
        # full fine-tuning with a reference KL: the frozen base, sharded as the policy (each rank holds 1/W of it, in
        # the compute dtype: no float32 master copy, no optimizer state); under LoRA the adapter is disabled instead
        frozen = self._shard(frozen_copy(model), master=False) if reference and lora is None else None
        model = self._shard(prepare(model, lora, lora_seed, gradient_checkpointing))
        self.trainee = Trainee(model, self.device, pad_id, lora_seed, betas, eps, weight_decay, grad_clip_norm,
                               micro_batch_size, packing, max_tokens_per_micro_batch, frozen)
        self.units = [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]
        self.gathered = False
        """Every unit's parameters are all-gathered (for sampling) rather than sharded (for training)."""

    @property
    def policy(self) -> nn.Module:
        """The module (its parameters all-gathered after `prepare_sampling`, sharded after a train step)."""
        return self.trainee.policy

    @property
    def trainable_parameters(self) -> int:
        return self.trainee.trainable_parameters

    def _shard(self, model: nn.Module, master: bool = True) -> nn.Module:
        compute = next(model.parameters()).dtype  # model.dtype: what the forward passes compute in
        if master:
            model.float()  # the shards (the weights the optimizer updates, its moments) in float32, one dtype per unit
        mesh = device_mesh.init_device_mesh(self.device.type, (self.world.size,))  # the training device, not a guess
        precision = fsdp.MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        knobs = {"mesh": mesh, "mp_policy": precision, "reshard_after_forward": self.reshard_after_forward}
        for layer in decoder_layers(model):
            fsdp.fully_shard(layer, **knobs)
        fsdp.fully_shard(model, **knobs)
        return model

    def prepare_sampling(self) -> None:
        """A collective: every rank calls it before the engine samples or evaluates (rlvr/trainer.py does, each
        step): every unit's parameters are all-gathered, so `policy` is the whole module until the next train
        step."""
        if not self.gathered:
            for unit in self.units:
                unit.unshard()
                unit.set_reshard_after_forward(False)
            self.gathered = True

    def _sharded(self) -> None:
        if self.gathered:
            for unit in self.units:
                unit.reshard()
                unit.set_reshard_after_forward(self.reshard_after_forward)
            self.gathered = False

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]:
        t0, t = time.perf_counter(), self.trainee
        self._sharded()
        rows = t.step_rows(batch, loss)
        N, W = len(rows.prompts), self.world.size
        plans = [t.micro_batches(rows, share) for share in rank_rows(rows.sizes, W, t.packing)]
        real = plans[self.world.rank]
        padding = [[0]] * (max(1, *map(len, plans)) - len(real))  # as many passes as the busiest rank: collectives pair
        if not t.policy.training:
            t.policy.train()
        selected = self._shared_selection(loss, rows, real, padding)
        t.optimizer.zero_grad(set_to_none=True)
        sums = t.accumulate(loss, rows, real, selected, scale=float(W))
        if padding:
            t.accumulate(loss, rows, padding, selected, scale=0.0)
        sums = self._all_reduce(sums)
        grad_scale = t.kept_scale(sums, rows)
        sums["loss"] *= grad_scale
        update = t.update(lr, sums["loss"] + sums["echo_loss"] + sums["distill_loss"], as_float=self._grad_norm,
                          grad_scale=grad_scale,
                          everywhere=lambda finite: all(distributed.all_gather(finite)))  # all ranks roll back, or none
        return t.report(sums, rows, selected, update, lr, N, t0, loss)

    def reference_logprobs(self, rollouts: Rollouts) -> Tensor:
        """A collective: [PG, T] log π_ref of every sampled completion token (backend=local's `reference_logprobs`),
        each rank scoring its share of the rows (as many passes as the busiest rank), added over the ranks."""
        t, mask = self.trainee, rollouts.mask_PG_T
        self._sharded()
        rows = t.step_rows(TrainBatch(rollouts, mask.float()))
        plans = [t.micro_batches(rows, share) for share in rank_rows(rows.sizes, self.world.size, t.packing)]
        real = plans[self.world.rank]
        part = t.step_reference_logprobs(rows, real)
        if rows.prompts:
            for _ in range(max(1, *map(len, plans)) - len(real)):
                t.reference_logprobs(rows, [0])  # passes that pair with the busier ranks' (results unused)
        part = sum(p.to(rows.engine_lp.device) for p in distributed.all_gather(part.cpu()))
        return rows.scatter(part, mask.shape)

    def _shared_selection(self, loss: PolicyLoss, rows: StepRows, real: list[list[int]], padding: list[list[int]]
                          ) -> Tensor | None:
        """kl_cov / clip_cov: this rank's rows' new log-probabilities (no grad; padded to every rank's pass count),
        added over the ranks (each row is one rank's, the others hold 0), and `loss.select_tokens` on the whole
        step's, as backend=local picks: the same tokens on every rank, whatever the number of ranks, micro_batch_size
        or packing. None in standard (no pass)."""
        if not loss.selects_tokens:
            return None
        new_lp_N_T = self.trainee.step_logprobs(rows, real)
        if padding:
            self.trainee.step_logprobs(rows, padding)  # passes that pair with the busier ranks' (results unused)
        new_lp_N_T = sum(p.to(rows.engine_lp.device) for p in distributed.all_gather(new_lp_N_T.cpu()))
        draws = selection_generator(self.trainee.lora_seed, self.trainee.train_steps)
        old_lp = rows.engine_lp if loss.correction.pi_old == "bypass" else new_lp_N_T
        return loss.select_tokens(new_lp_N_T, old_lp, rows.adv, rows.action, draws)

    @staticmethod
    def _all_reduce(sums: dict[str, float]) -> dict[str, float]:
        """Every rank's sums added, its maxima maxed (the step's statistics and the correction's, SUMMED/MAXED)."""
        summed = ("loss", "clipped", "abs_kl", "kl_ref", "entropy", "echo_loss", "distill_loss", "distill_kl", *SUMMED)
        maxed = ("ratio_max", *MAXED)
        added = torch.tensor([sums[k] for k in summed], dtype=torch.float64)
        top = torch.tensor([sums[k] for k in maxed], dtype=torch.float64)
        dist.all_reduce(added, op=dist.ReduceOp.SUM)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return dict(zip(summed, added.tolist(), strict=True)) | dict(zip(maxed, top.tolist(), strict=True))

    @staticmethod
    def _grad_norm(norm: Tensor) -> float:
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _options(self, full: bool = False):
        """Under LoRA the frozen base weights are in no checkpoint (the run's base/ holds them): loading is then
        not strict about them (DCP's load still fails on a trainable weight the checkpoint lacks)."""
        lora = self.lora is not None
        return state_dict_api.StateDictOptions(full_state_dict=full, cpu_offload=full, ignore_frozen_params=lora,
                                               strict=not lora)

    def save(self, path: Path) -> None:
        """Every rank: its shards under `dcp/` (collective). Rank 0: the full adapter or weights, as
        backend=local writes them, and `local_state.json`."""
        self._sharded()
        stepped = bool(self.trainee.optimizer.state)
        dcp.save(self._state_dict(stepped), checkpoint_id=str(path / SHARDS))
        full = state_dict_api.get_model_state_dict(self.trainee.policy, options=self._options(full=True))
        if not self.world.is_main:
            return
        if isinstance(self.trainee.policy, peft.PeftModel):
            adapter = peft.get_peft_model_state_dict(self.trainee.policy, state_dict=full)
            safetensors_torch.save_file({k: v.contiguous() for k, v in adapter.items()},
                                        str(path / "adapter_model.safetensors"))
            self.trainee.policy.peft_config["default"].save_pretrained(str(path))
        else:
            safetensors_torch.save_file(untied(full), str(path / "model.safetensors"))
            cast("PreTrainedModel", self.trainee.policy).config.save_pretrained(path)
        (path / STATE_FILE).write_text(json.dumps({"train_steps": self.trainee.train_steps, "optimizer": stepped})
                                       + "\n")

    def _state_dict(self, optimizer: bool) -> dict:
        """The DCP state: the model's shards, and the optimizer's once it has stepped. Before its first step it
        holds nothing, and asking DCP for its state makes one (torch's `_init_optim_state`: a step of zero
        gradients at lr 0, which leaves AdamW's step count at 1), so a run continued from a checkpoint taken
        before any update (a stop while the first evaluation or step scored) would bias-correct its first update
        as a second one."""
        state = {"model": state_dict_api.get_model_state_dict(self.trainee.policy, options=self._options())}
        if optimizer:
            state["optimizer"] = state_dict_api.get_optimizer_state_dict(self.trainee.policy, self.trainee.optimizer,
                                                                         options=self._options())
        return state

    def load(self, path: Path) -> None:
        """Restore `save`'s shards on this run's processes, however many wrote them."""
        if not (path / SHARDS).is_dir():
            raise ValueError(f"{path} has no {SHARDS}/ folder: it was written by backend=local, which backend=fsdp "
                             "cannot resume (continue it with backend=local)")
        self._sharded()
        saved = json.loads((path / STATE_FILE).read_text())
        state = self._state_dict(optimizer=saved.get("optimizer", True))  # checkpoints before the key: always
        dcp.load(state, checkpoint_id=str(path / SHARDS))
        state_dict_api.set_model_state_dict(self.trainee.policy, state["model"], options=self._options())
        if "optimizer" in state:
            state_dict_api.set_optimizer_state_dict(self.trainee.policy, self.trainee.optimizer, state["optimizer"],
                                                    options=self._options())
        self.trainee.train_steps = int(saved["train_steps"])


def rank_rows(sizes: list[int], W: int, packing: bool) -> list[list[int]]:
    """Each rank's rows (indices): padded, contiguous shares of the row count (`World.share`); packed, balanced by
    tokens: longest row first, each to the rank holding the fewest tokens so far (ties: the lower rank)."""
    if not packing:
        return [list(distributed.World(r, W, r).share(len(sizes))) for r in range(W)]
    ranks: list[list[int]] = [[] for _ in range(W)]
    load = [0] * W
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = load.index(min(load))
        ranks[r].append(i)
        load[r] += sizes[i]
    return [sorted(r) for r in ranks]


def untied(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The full weights with tied copies stored once (safetensors refuses shared storage; from_pretrained
    re-ties them), contiguous."""
    seen: dict[int, str] = {}
    out = {}
    for key, value in state.items():
        ptr = value.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen[ptr] = key
        out[key] = value.contiguous()
    return out
