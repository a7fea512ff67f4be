"""`backend=local`: gradients in this process with torch, LoRA through PEFT (or full fine-tuning).

Training rows are `prompt (left-padded) + completion (right-padded)`, the same layout the engine
decoded, so position ids match sampling; or, with `packing`, the rows end to end with position ids restarting
per row, in passes of at most `max_tokens_per_micro_batch` tokens (docs/memory.md#packed-rows). The
log-probability of completion token t is read from the logits at the position before it, divided by the
rollouts' sampling temperature:

    new_lp = log_softmax(logits / max(T, 1e-7))[token]

the distribution the sampler drew from (see rlvr/types.py Rollouts); the LM head is applied at those positions
alone, a chunk at a time (rlvr/backend/logprobs.py, lm_head.py). Optimizer: AdamW with the betas,
eps and weight decay of `conf/backend/local.yaml`; the learning rate is set by the trainer each step
(constant unless a schedule is configured there). `grad_clip_norm` > 0 clips the global gradient norm
(the predecessor had no clipping locally); the pre-clip norm is always reported. One optimizer update
per step; each micro-batch adds Σ ℓ over its tokens / the whole step's count of tokens with a non-zero
advantage (rlvr/algorithm/loss.py), so `micro_batch_size` changes memory, not the objective.

A step whose loss or gradient norm is not finite leaves the weights and the optimizer untouched and
reports `train/nonfinite_skip: 1` (the trainer stops the run after too many in a row). So does a step whose update
made a trainable weight non-finite (with finite loss and gradients: fp16 AdamW, whose eps of 1e-8 is 0 in fp16,
divides by 0; a learning rate a schedule made NaN): it is rolled back to its starting weights and optimizer state
(`Undo`) and also reports `train/nonfinite_weights: 1`, instead of the engine sampling from NaN logits next.

`algorithm.loss.mode` kl_cov / clip_cov choose their tokens over the whole step (rlvr/algorithm/loss.py):
a no-grad forward pass over every row (micro-batch by micro-batch, so no more memory than the gradient pass)
gives the step's new log-probabilities first, `PolicyLoss.select_tokens` picks on all of them, and each
micro-batch's gradient pass takes its rows of that pick. One extra forward pass per step in these modes only.
clip_cov's random pick draws from a CPU generator seeded with sub_seed(lora_seed, "clip_cov/step/<k>"), k =
`train_steps` (calls of `train_step` so far, saved with the checkpoint in `local_state.json`): the run's
seed reaches the backend as seeds.lora = sub_seed(root, "lora"), and the named stream is independent of the
LoRA initialisation (rlvr/seeds.py), so a resumed run draws what the uninterrupted one drew.

`algorithm.kl` (where=loss, coef > 0): each micro-batch first gets its rows' reference log-probabilities from a
no-grad pass in eval mode (`Trainee.reference_logprobs`): under LoRA the policy with its adapter disabled (PEFT
`disable_adapter()`, no copy), under full fine-tuning the frozen copy `frozen_copy` made at construction when built
with `reference=True` (before any update: a resumed run loads its checkpoint into the policy alone, so the reference
stays the base). `algorithm.entropy_coef` ≠ 0 reads the entropies of the gradient pass (the chunked head's, with
their gradient). `reference_logprobs(rollouts)` is where=reward's pass over the step's rows (rlvr/algorithm/kl.py).

Rows whose every advantage is 0 (groups whose rewards tied, MaxRL groups with no success) contribute
nothing to the loss or its token count, so they are dropped before the forward pass, and the padded
length is cut to the longest remaining completion: the gradient is bit-identical, the work shrinks as
more groups tie (on the tiny task, a third of the groups at the start and most of them later).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from rlvr.algorithm.correction import EMPTY_SUMS, merge_sums, mismatch_metrics, mismatch_sums
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.logprobs import padded_logprobs, padded_rows, position_logprobs, scatter, score_rows
from rlvr.backend.optimizer_rules import optimizer_errors, packing_errors
from rlvr.lazy import lazy_import, no_grad
from rlvr.loss.contract import LossInputs
from rlvr.protocols import Needs
from rlvr.requirements import CudaDevice
from rlvr.seeds import sub_seed
from rlvr.types import LoraSpec, Rollouts, TeacherScores, TeacherSupport, TrainBatch

if TYPE_CHECKING:
    from peft import PeftModel
    from torch import Generator, Tensor, nn
    from torch import device as Device
    from torch.optim import Optimizer
    from transformers import PreTrainedModel


torch = lazy_import("torch")
peft = lazy_import("peft")
safetensors_torch = lazy_import("safetensors.torch")

STATE_FILE = "local_state.json"
"""The backend's own counters in a checkpoint folder (`train_steps`)."""
EMA_FILE = "self_teacher_ema.safetensors"
"""transform.teacher=ema's EMA of the trainable weights, in a checkpoint (`LocalBackend.ema_update`)."""


@dataclass(frozen=True)
class StepRows:
    """A step's training rows (those with any non-zero advantage), [N, …]; the per-token tensors on the training
    device. The forward pass's layout (padded or packed) is built per micro-batch from `prompts` and `tokens`."""

    prompts: list[list[int]]
    """Row i's prompt ids (unpadded)."""
    tokens: Tensor
    """[N, T] completion ids (on the CPU), right-padded; T = the longest completion among the rows."""
    lengths: list[int]
    """Row i's real completion tokens (actions and observations): tokens[i, :lengths[i]]."""
    engine_lp: Tensor
    """[N, T] the engine's log-probabilities of the sampled tokens."""
    adv: Tensor
    action: Tensor
    """[N, T] bool: action tokens with a non-zero advantage (what the loss sums over)."""
    sampled: Tensor
    """[N, T] bool: every action token (the sampled ones, with or without advantage): what `mismatch/*` reads."""
    temperature: float
    total: int
    """The divisor of the token-level mean: the whole step's count of such tokens (at least 1)."""
    tokens_with_signal: int
    weight: Tensor | None = None
    """[N, T] each token's weight in the step's loss under an aggregation other than token_mean
    (`PolicyLoss.token_weights`, from the whole step); None: Σ ℓ / `total`."""
    echo: Tensor | None = None
    """[N, T] echo=on: each observation token's ECHO weight (rlvr/echo/echo.py, normalised over the whole step): the
    loss adds −Σ w·log π; None: echo=none."""
    scored: Tensor | None = None
    """[N, T] bool: the positions the LM head is applied at, `sampled` ∪ ECHO's targets (None: every real token)."""
    origin: list[tuple[int, int]] = field(default_factory=list)
    """Row i's place in the step's rollouts: (its row r, the completion position its tokens start at); 0 but for the
    later sequences of a row a chat template split (`Rollouts.segments`)."""
    distill: TeacherSupport | None = None
    """distill.estimator=full: the teacher's top-k at each action token ([N, T, K] on the training device) and each
    token's weight in its KL term; None otherwise."""

    @property
    def Lp(self) -> int:
        """The longest prompt's length: what every padded micro-batch left-pads its prompts to."""
        return max((len(p) for p in self.prompts), default=0)

    @property
    def sizes(self) -> list[int]:
        """Row i's tokens in a packed micro-batch: its prompt and its completion."""
        return [len(p) + n for p, n in zip(self.prompts, self.lengths, strict=True)]

    def scatter(self, part_N_T: Tensor, shape: tuple[int, ...]) -> Tensor:
        """[PG, T] float32: row i's real values of `part_N_T` at its `origin`, 0 elsewhere."""
        out = torch.zeros(shape, dtype=torch.float32)
        for i, ((r, a), n) in enumerate(zip(self.origin, self.lengths, strict=True)):
            out[r, a : a + n] = part_N_T[i, :n].cpu()
        return out

    def split(self, rollouts: Rollouts, pad_id: int) -> StepRows:
        """The rows with each sequence of a row that a chat template split (`Rollouts.segments`) a row of its own,
        after its own prompt, and the sequences without a scored token left out. Every per-token value, the loss's
        token weights and `total` included, was taken over the whole row before: splitting moves tokens, never changes
        what they weigh."""
        pieces = [(i, a, b, prompt) for i, (r, _) in enumerate(self.origin) for a, b, prompt in rollouts.segments(r)
                  if self.scored is None or bool(self.scored[i, a:b].any())]
        T = max([0, *(b - a for _, a, b, _ in pieces)])

        def cut(x: Tensor, fill: float | int | bool = 0) -> Tensor:
            out = x.new_full((len(pieces), T, *x.shape[2:]), fill)
            for j, (i, a, b, _) in enumerate(pieces):
                out[j, : b - a] = x[i, a:b]
            return out

        def cut_optional(x: Tensor | None, fill: float | int | bool = 0) -> Tensor | None:
            return None if x is None else cut(x, fill)

        return replace(self, prompts=[prompt for *_, prompt in pieces], tokens=cut(self.tokens, pad_id),
                       lengths=[b - a for _, a, b, _ in pieces], engine_lp=cut(self.engine_lp), adv=cut(self.adv),
                       action=cut(self.action, False), sampled=cut(self.sampled, False),
                       weight=cut_optional(self.weight), echo=cut_optional(self.echo),
                       scored=cut_optional(self.scored, False),
                       origin=[(self.origin[i][0], a) for i, a, _, _ in pieces],
                       distill=None if self.distill is None else replace(
                           self.distill, ids_PG_T_K=cut(self.distill.ids_PG_T_K),
                           logprobs_PG_T_K=cut(self.distill.logprobs_PG_T_K),
                           weight_PG_T=cut(self.distill.weight_PG_T)))


def selection_generator(seed: int, step: int) -> Generator:
    """The CPU generator clip_cov draws step `step`'s tokens from: sub_seed(seed, "clip_cov/step/<step>")."""
    return torch.Generator().manual_seed(sub_seed(seed, f"clip_cov/step/{step}"))


class Update(NamedTuple):
    """What `Trainee.update` did with a step's gradients."""

    grad_norm: float
    """The pre-clip gradient norm (the whole of a sharded one)."""
    taken: bool
    """The optimizer step stands: the loss and the gradient norm were finite, and so is every weight after it."""
    rolled_back: bool
    """The step made a trainable weight non-finite, and was undone (`Undo`)."""


class Undo:
    """The trainable weights and the optimizer's state as they were before an update, to put back when the update made
    a weight non-finite. The copies live on the CPU (pinned beside a GPU, copied without blocking the host), so an
    accelerator's memory is not doubled (full fine-tuning: 12 bytes of host memory a trainable parameter with float32
    weights and moments; under FSDP each rank copies its shards); their buffers are kept from step to step. The check
    is one fused max |w| over the trainable weights, in which NaN and ±inf propagate: one host sync a step."""

    def __init__(self, params: list[nn.Parameter], optimizer: Optimizer) -> None:
        self.params, self.optimizer = params, optimizer
        self.saved: list[list[Tensor]] = []
        """Per parameter: its copy, then its optimizer state's tensors' (none before its first step)."""

    def parts(self, param: nn.Parameter) -> list[Tensor]:
        """This process's part of `param` (a DTensor's local shard under FSDP, written through), then of its optimizer
        state's tensors (AdamW's step count and moments)."""
        state = self.optimizer.state.get(param, {})  # `get`: the state's defaultdict must not grow an entry here
        return [local(t) for t in (param, *(v for v in state.values() if isinstance(v, torch.Tensor)))]

    @no_grad
    def save(self) -> None:
        """Copy the weights and the optimizer state, before the step. From a GPU the copies are queued on its stream
        ahead of the step's kernels (so they see the weights before it), and `finite` waits for them all."""
        parts = [self.parts(p) for p in self.params]
        if shapes(parts) != shapes(self.saved):  # the first step, or the first after a parameter's state appeared
            self.saved = [[torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in ts] for ts in parts]
        for saved, ts in zip(self.saved, parts, strict=True):
            for copy_, t in zip(saved, ts, strict=True):
                copy_.copy_(t, non_blocking=True)

    @no_grad
    def finite(self) -> bool:
        """Whether every trainable weight (this process's part) is finite."""
        weights = [t for t in (local(p) for p in self.params) if t.numel()]
        return not weights or bool(torch.stack(torch._foreach_norm(weights, float("inf"))).isfinite().all())

    @no_grad
    def restore(self) -> None:
        """Everything `save` copied, put back; the state of a parameter that had none before the step, dropped."""
        for param, saved in zip(self.params, self.saved, strict=True):
            parts = self.parts(param)
            if len(parts) > len(saved):  # its first step: AdamW made its state in this one
                del self.optimizer.state[param]
            for target, copy_ in zip(parts, saved):
                target.copy_(copy_)


def shapes(parts: list[list[Tensor]]) -> list[list[tuple]]:
    """Each tensor's shape and dtype, in `Undo.saved`'s layout."""
    return [[(t.shape, t.dtype) for t in ts] for ts in parts]


def local(t: Tensor) -> Tensor:
    """A DTensor's (backend=fsdp) local shard, which shares its storage; any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def resolve_device(device: str) -> Device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class Trainee:
    """The trained module, its parameters and optimizer, and the step functions every local backend runs on them:
    backend=local calls them on the whole step, backend=fsdp on its share (rlvr/backend/fsdp.py). Composed, not
    inherited: a backend holds one and says how it places and shares the module."""

    def __init__(self, model: nn.Module, device: Device, pad_id: int, lora_seed: int, betas: tuple[float, float],
                 eps: float, weight_decay: float, grad_clip_norm: float, micro_batch_size: int,
                 packing: bool = False, max_tokens_per_micro_batch: int = 0, reference: nn.Module | None = None
                 ) -> None:
        self.policy = model
        self.reference = reference
        """Full fine-tuning with a reference KL: the frozen copy of the base (`frozen_copy`); None otherwise (under
        LoRA the reference is the policy with its adapter disabled)."""
        self.device = device
        self.pad_id = pad_id
        self.grad_clip_norm = grad_clip_norm
        self.micro_batch_size = micro_batch_size
        self.packing = packing
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.lora_seed = lora_seed
        self.train_steps = 0
        """Calls of `train_step` so far (steps skipped for a non-finite loss included): clip_cov's draw index."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        self.undo = Undo(self.params, self.optimizer)

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.params)

    def trained_weights(self) -> dict[str, nn.Parameter]:
        """The parameters an update changes, by name (the adapter's under LoRA, every one under full fine-tuning)."""
        return {name: p for name, p in self.policy.named_parameters() if p.requires_grad}

    def step_rows(self, batch: TrainBatch, loss: PolicyLoss | None = None) -> StepRows:
        """The step's rows that carry signal (every rank holds all of them), with `loss`'s token weights."""
        ro = batch.rollouts
        action_PG_T = (batch.adv_PG_T != 0) & ro.action_mask_PG_T
        signal_PG = action_PG_T.any(-1)
        # a row without signal reads none of its sampled tokens (mismatch/*, gspo, corrections): ECHO's alone, if any
        sampled_PG_T = ro.action_mask_PG_T & signal_PG[:, None]
        echo_PG_T, support = batch.echo_PG_T, batch.distill
        scored_PG_T = sampled_PG_T if echo_PG_T is None else sampled_PG_T | (echo_PG_T > 0)
        if support is not None:  # the teacher's KL is lowered at every action token
            scored_PG_T = scored_PG_T | (support.weight_PG_T > 0)
        keep = scored_PG_T.any(-1).nonzero().squeeze(-1)  # rows with any signal, ECHO target or teacher's KL, in order
        lengths = ro.lengths_PG[keep]
        T = int(lengths.max()) if len(keep) else 0
        engine_lp, adv, action, sampled, scored = (x[keep, :T].to(self.device) for x in (
            ro.logprobs_PG_T, batch.adv_PG_T, action_PG_T, sampled_PG_T, scored_PG_T))
        echo = None if echo_PG_T is None else echo_PG_T[keep, :T].float().to(self.device)
        weight = None if loss is None else loss.token_weights(action, keep // ro.group_size)
        rows = StepRows([ro.prompt_ids_P[i // ro.group_size] for i in keep.tolist()], ro.tokens_PG_T[keep, :T],
                        lengths.tolist(), engine_lp, adv, action, sampled, ro.temperature,
                        max(int(action_PG_T.sum()), 1), int(action_PG_T.sum()), weight, echo, scored,
                        [(r, 0) for r in keep.tolist()],
                        None if support is None else replace(
                            support, ids_PG_T_K=support.ids_PG_T_K[keep, :T].to(self.device),
                            logprobs_PG_T_K=support.logprobs_PG_T_K[keep, :T].to(self.device),
                            weight_PG_T=support.weight_PG_T[keep, :T].to(self.device)))
        return rows if ro.segments_PG is None else rows.split(ro, self.pad_id)

    def micro_batches(self, rows: StepRows, share: Sequence[int]) -> list[list[int]]:
        """The forward/backward passes over the rows `share` (indices into `rows`). Padded: consecutive runs of
        `micro_batch_size` rows (0: all in one). Packed: rows placed first-fit, longest first, into passes of at most
        `max_tokens_per_micro_batch` prompt + completion tokens (a longer row alone in its pass)."""
        share = list(share)
        if not self.packing:
            mb = self.micro_batch_size or max(len(share), 1)
            return [share[s : s + mb] for s in range(0, len(share), mb)]
        sizes, budget = rows.sizes, self.max_tokens_per_micro_batch
        passes: list[list[int]] = []
        room: list[int] = []
        for i in sorted(share, key=lambda i: -sizes[i]):
            fits = next((k for k, r in enumerate(room) if sizes[i] <= r), None)
            if fits is None:
                passes.append([i])
                room.append(budget - sizes[i])
            else:
                passes[fits].append(i)
                room[fits] -= sizes[i]
        return [sorted(p) for p in passes]

    def accumulate(self, loss: PolicyLoss, rows: StepRows, batches: list[list[int]], selected: Tensor | None,
                   scale: float) -> dict[str, float]:
        """Forward and backward over `batches` (`micro_batches`: row indices): per micro-batch one call of `loss`
        (rlvr/loss/contract.py) on its `inputs`, then backward (× `scale`); returns the summed (unscaled) loss and
        statistics, with the mismatch correction's sums (rlvr/algorithm/correction.py: the tokens it kept;
        `mismatch/*`)."""
        sums = {"loss": 0.0, "clipped": 0.0, "abs_kl": 0.0, "ratio_max": 0.0, "kl_ref": 0.0, "entropy": 0.0,
                "echo_loss": 0.0, "distill_loss": 0.0, "distill_kl": 0.0, **EMPTY_SUMS}
        for b in batches:
            inputs, log_rho, keep = self.loss_inputs(loss, rows, b, selected)
            out = loss(inputs)
            (out.loss * scale if scale != 1.0 else out.loss).backward()
            with torch.no_grad():
                for k, v in out.metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                delta = (inputs.trainer_logprobs - inputs.old_logprobs)[inputs.loss_mask]
                sums["abs_kl"] += float(delta.abs().sum())
                if delta.numel():
                    sums["ratio_max"] = max(sums["ratio_max"], float(delta.max().exp()))
                sums.update(merge_sums(sums, mismatch_sums(log_rho, rows.sampled[b], keep, rows.action[b])))
        return sums

    def loss_inputs(self, loss: PolicyLoss, rows: StepRows, b: list[int], selected: Tensor | None
                    ) -> tuple[LossInputs, Tensor, Tensor]:
        """Rows `b`'s `LossInputs`: their log-probabilities in one forward pass (with the entropies, and after the
        reference's pass, when the loss's terms read them), and the correction's weights and mask; with log ρ (log
        π_train − log π_engine) and the tokens the correction kept, for `mismatch/*`."""
        ref_lp = self.reference_logprobs(rows, b) if loss.reference_kl.in_loss else None
        entropy = support_lp = None
        if rows.distill is not None:
            new_lp, entropy, support_lp = self.logprobs(rows, b, with_entropy=bool(loss.entropy_coef),
                                                        support=rows.distill.ids_PG_T_K[b])
        elif loss.entropy_coef:
            new_lp, entropy = self.logprobs(rows, b, with_entropy=True)
        else:
            new_lp = self.logprobs(rows, b)
        correction, sampled = loss.correction, rows.sampled[b]
        log_rho = new_lp.detach() - rows.engine_lp[b]
        old_lp = rows.engine_lp[b] if correction.pi_old == "bypass" else new_lp.detach()
        factor, keep = correction.factors(log_rho, sampled) if correction.active else (None, None)
        mask = rows.action[b] if keep is None else rows.action[b] & keep
        distill = rows.distill
        inputs = LossInputs(new_lp, old_lp, rows.adv[b], mask, rows.total, sampled,
                            None if rows.weight is None else rows.weight[b], factor, ref_lp, entropy,
                            None if selected is None else selected[b], None if rows.echo is None else rows.echo[b],
                            None if distill is None else distill.weight_PG_T[b], support_lp,
                            None if distill is None else distill.logprobs_PG_T_K[b],
                            1.0 if distill is None else distill.beta, distill is not None and distill.tail)
        return inputs, log_rho, torch.ones_like(mask) if keep is None else keep

    @staticmethod
    def kept_scale(sums: dict[str, float], rows: StepRows) -> float:
        """What the gradients are multiplied by once every micro-batch is in, so that a token mean is divided by the
        tokens the correction kept, not the step's count (1.0 when it masked nothing, and under another aggregation:
        the tokens it masks leave the sums, the weights stay)."""
        return rows.total / max(sums["kept"], 1.0) if sums["masked"] and rows.weight is None else 1.0

    def update(self, lr: float, loss_sum: float, as_float: Callable[[Tensor], float] = float,
               grad_scale: float = 1.0, everywhere: Callable[[bool], bool] = bool) -> Update:
        """Scale the gradients by `grad_scale` (`kept_scale`), clip (when set), step the optimizer unless the loss
        or the gradient norm is not finite, and undo the step if it made a trainable weight non-finite (`everywhere`:
        whether that holds on every process, backend=fsdp's shards); zero the gradients. `as_float`: a sharded
        gradient norm's whole value."""
        if grad_scale != 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
        max_norm = self.grad_clip_norm if self.grad_clip_norm > 0 else float("inf")
        grad_norm = as_float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        taken = math.isfinite(loss_sum) and math.isfinite(grad_norm)
        rolled_back = False
        if taken:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.undo.save()
            self.optimizer.step()
            if not everywhere(self.undo.finite()):
                self.undo.restore()
                taken, rolled_back = False, True
        self.optimizer.zero_grad(set_to_none=True)
        self.train_steps += 1
        return Update(grad_norm, taken, rolled_back)

    @staticmethod
    def report(sums: dict[str, float], rows: StepRows, selected: Tensor | None, update: Update,
                lr: float, trained_rows: int, t0: float, loss: PolicyLoss | None = None) -> dict[str, float]:
        total = rows.total
        covariance = {} if selected is None else {"policy/cov_fraction": float(selected.sum()) / total}
        regularizers: dict[str, float] = {}
        if loss is not None and loss.reference_kl.in_loss:
            regularizers |= {"policy/kl_ref": sums["kl_ref"] / total, "policy/kl_coef": loss.reference_kl.coef}
        if loss is not None and loss.entropy_coef:
            regularizers |= {"policy/entropy": sums["entropy"] / total, "policy/entropy_coef": loss.entropy_coef}
        if rows.echo is not None:  # the term added to the loss, in the same optimizer step (rlvr/echo/echo.py)
            regularizers |= {"echo/loss": sums["echo_loss"], "echo/joint_optimizer_step": float(update.taken)}
        if rows.distill is not None:  # the teacher's KL term (distill.estimator=full)
            tokens = max(int((rows.distill.weight_PG_T > 0).sum()), 1)
            regularizers |= {"distill/loss": sums["distill_loss"], "distill/support_kl": sums["distill_kl"] / tokens}
        if update.rolled_back:
            regularizers["train/nonfinite_weights"] = 1.0
        return {
            **covariance,
            **regularizers,
            **mismatch_metrics(sums),
            "train/nonfinite_skip": 0.0 if update.taken else 1.0,
            "loss": sums["loss"],
            "clip_fraction": sums["clipped"] / total,
            "policy/abs_kl": sums["abs_kl"] / total,
            "policy/ratio_max": sums["ratio_max"],
            "grad_norm": update.grad_norm,
            "lr": lr,
            "rl/optimizer_nonzero_advantage_action_tokens": float(rows.tokens_with_signal),
            "local_train_rows": float(trained_rows),
            "local_train_wall_s": time.perf_counter() - t0,
        }

    def selection(self, loss: PolicyLoss, rows: StepRows, batches: list[list[int]]) -> Tensor | None:
        """kl_cov / clip_cov: `loss.select_tokens` on the whole step's [N, T] new log-probabilities, from a no-grad
        pass over `batches` (the weights the gradient pass will see); None in standard (no pass)."""
        if not loss.selects_tokens:
            return None
        new_lp_N_T = self.step_logprobs(rows, batches)
        draws = selection_generator(self.lora_seed, self.train_steps)
        old_lp = rows.engine_lp if loss.correction.pi_old == "bypass" else new_lp_N_T
        return loss.select_tokens(new_lp_N_T, old_lp, rows.adv, rows.action, draws)

    @no_grad
    def step_logprobs(self, rows: StepRows, batches: list[list[int]], entropies: bool = False) -> Tensor:
        """[N, T] new log-probabilities of the rows in `batches` (0 on the others and on padding), without grad; with
        `entropies`, the entropies of the policy's temperature-scaled distribution at those positions instead."""
        out = rows.engine_lp.new_zeros(rows.engine_lp.shape)
        for b in batches:
            out[b] = self.logprobs(rows, b, with_entropy=True)[1] if entropies else self.logprobs(rows, b)
        return out

    def logprobs(self, rows: StepRows, b: list[int], with_entropy: bool = False, model: nn.Module | None = None,
                 support: Tensor | None = None):
        """[len(b), T] log-probabilities of rows `b`'s completion tokens (0 on padding), in one forward pass of `model`
        (default: the policy): the rows packed into one sequence (`packing`) or padded side by side; with
        `with_entropy`, (log-probabilities, entropies); with `support` ([len(b), T, K] token ids), (log-probabilities,
        entropies or None, [len(b), T, K] the log-probabilities of those tokens)."""
        tokens, lengths = rows.tokens[b], [rows.lengths[i] for i in b]
        scored = None if rows.scored is None else rows.scored[b].cpu()
        if self.packing:
            return self.packed_logprobs([rows.prompts[i] for i in b], tokens, lengths, rows.temperature, with_entropy,
                                        model, scored, support)
        mask = torch.arange(tokens.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        ids, attn, Lp = self.rows([rows.prompts[i] for i in b], tokens, mask, rows.Lp)
        return self.completion_logprobs(ids, attn, Lp, tokens, rows.temperature, with_entropy, model, scored, support)

    @no_grad
    def reference_logprobs(self, rows: StepRows, b: list[int]) -> Tensor:
        """[len(b), T] log π_ref of rows `b`'s completion tokens, no grad, in eval mode, laid out as the policy's pass:
        under LoRA the policy with its adapter disabled (PEFT `disable_adapter()`: the base weights, no copy), under
        full fine-tuning the frozen copy of the base."""
        if isinstance(self.policy, peft.PeftModel):
            training = self.policy.training
            self.policy.eval()
            try:
                with self.policy.disable_adapter():
                    return self.logprobs(rows, b)
            finally:
                self.policy.train(training)
        if self.reference is None:
            raise ValueError("algorithm.kl.coef > 0 under full fine-tuning needs the reference copy, which this "
                             "backend was not built with (reference=True)")
        return self.logprobs(rows, b, model=self.reference)

    def step_reference_logprobs(self, rows: StepRows, batches: list[list[int]]) -> Tensor:
        """[N, T] log π_ref of the rows in `batches` (0 on the others and on padding)."""
        out = rows.engine_lp.new_zeros(rows.engine_lp.shape)
        for b in batches:
            out[b] = self.reference_logprobs(rows, b)
        return out

    def rows(self, prompts: list[list[int]], tokens_N_T: Tensor, mask_N_T: Tensor, Lp: int | None = None):
        """`padded_rows` on the training device. A step's micro-batches all take the step's Lp and T, so a row's
        forward pass is the same whichever micro-batch (or rank) it falls in."""
        ids, attn, Lp = padded_rows(prompts, tokens_N_T, mask_N_T, self.pad_id, Lp)
        return ids.to(self.device), attn.to(self.device), Lp

    def completion_logprobs(self, ids: Tensor, attn: Tensor, Lp: int, tokens_PG_T: Tensor, temperature: float,
                            with_entropy: bool = False, model: nn.Module | None = None, scored: Tensor | None = None,
                            support: Tensor | None = None):
        return padded_logprobs(model or self.policy, ids, attn, Lp, tokens_PG_T, temperature, with_entropy, scored,
                               support)

    def packed_logprobs(self, prompts: list[list[int]], tokens_N_T: Tensor, lengths: list[int], temperature: float,
                        with_entropy: bool = False, model: nn.Module | None = None, scored: Tensor | None = None,
                        support: Tensor | None = None):
        """As `padded_logprobs`, the rows packed end to end into one sequence with no padding: position ids
        restart at 0 for every row and no attention mask is passed, so the model attends within each row alone
        (transformers reads the restarting position ids as packed sequences: a block-diagonal causal mask under
        eager/sdpa attention, variable-length kernels under flash attention)."""
        n, T = tokens_N_T.shape
        if any(len(p) == 0 for p in prompts):
            raise ValueError("a row with an empty prompt has no position to predict its first token")
        pieces = [torch.cat([torch.tensor(p, dtype=torch.long), tokens_N_T[i, :c]])
                  for i, (p, c) in enumerate(zip(prompts, lengths, strict=True))]
        starts = torch.tensor([0] + [len(x) for x in pieces]).cumsum(0)[:-1].tolist()
        ids = torch.cat(pieces)[None].to(self.device)
        position = torch.cat([torch.arange(len(x)) for x in pieces])[None].to(self.device)
        row = torch.cat([torch.full((c,), i) for i, c in enumerate(lengths)]).long()
        t = torch.cat([torch.arange(c) for c in lengths]).long()
        if scored is not None:  # the head at the scored positions alone
            row, t = row[scored[row, t]], t[scored[row, t]]
        at = torch.tensor([starts[i] + len(prompts[i]) - 1 for i in range(n)])[row] + t  # the position before it
        chosen = None if support is None else support.to(self.device)[row.to(self.device), t.to(self.device)]
        return scatter(position_logprobs(model or self.policy, ids, None, position, torch.zeros_like(at), at,
                                         ids[0, at.to(self.device) + 1], temperature, with_entropy, chosen),
                       n, T, row, t)


def frozen_copy(model: nn.Module) -> nn.Module:
    """The full fine-tuning reference: a copy of the base module, taken before any update (and before the backend
    wraps the module), every parameter frozen, in eval mode."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference.eval()


def prepare(model: nn.Module, lora: LoraSpec | None, lora_seed: int, gradient_checkpointing: bool) -> nn.Module:
    """The module as it is trained: activations recomputed in backward when asked (less memory, ~30% more compute),
    and the LoRA adapter attached (its A matrices drawn from `lora_seed`) unless all weights are trained."""
    if gradient_checkpointing:
        hf = cast("PreTrainedModel", model)  # a Hugging Face model, not yet wrapped by PEFT
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hf.config.use_cache = False
    if lora is not None:
        torch.manual_seed(lora_seed)  # LoRA A matrices are drawn at wrap time
        model = peft.get_peft_model(model, lora.to_peft())
    return model


class LocalBackend:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        device = settings["device"]
        machine = (CudaDevice(device),) if device == "auto" or device.startswith("cuda") else ()
        return Needs(provides=frozenset({"local_policy", "ratio_clipping", "local_loss", "token_correction", "entropy",
                                         "reference_model", "capture", "self_scoring"}),
                     machine=machine, errors=tuple(optimizer_errors(settings) + packing_errors(settings)))

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
        packing: bool = False,
        max_tokens_per_micro_batch: int = 0,
        reference: bool = False,
    ) -> None:
        self.device = resolve_device(device)
        model = model.to(self.device)
        frozen = frozen_copy(model) if reference and lora is None else None  # LoRA: the adapter disabled, no copy
        model = prepare(model, lora, lora_seed, gradient_checkpointing)
        self.trainee = Trainee(model, self.device, pad_id, lora_seed, betas, eps, weight_decay, grad_clip_norm,
                               micro_batch_size, packing, max_tokens_per_micro_batch, frozen)
        self.ema: dict[str, Tensor] | None = None
        """transform.teacher=ema: the EMA of the trainable weights, by name (`ema_update`); None otherwise."""

    @property
    def policy(self) -> nn.Module:
        """The trained module (the engine samples from it)."""
        return self.trainee.policy

    def prepare_sampling(self) -> None:
        """Nothing to do: the whole module is here (backend=fsdp gathers its shards; rlvr/protocols.py: Backend)."""

    @property
    def trainable_parameters(self) -> int:
        return self.trainee.trainable_parameters

    def completion_logprobs(self, ids: Tensor, attn: Tensor, Lp: int, tokens_PG_T: Tensor, temperature: float):
        return self.trainee.completion_logprobs(ids, attn, Lp, tokens_PG_T, temperature)

    def entropies(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] entropy of the policy's temperature-scaled distribution at every completion position of the
        rollouts (0 on padding), from a no-grad pass in eval mode, in micro-batches or packed as a train step's: what
        a transform that reads entropies gets when the engine cannot give them (engine=vllm returns top-k log-probs,
        not the full distribution)."""
        t, training = self.trainee, self.trainee.policy.training
        mask = rollouts.mask_PG_T
        rows = t.step_rows(TrainBatch(rollouts, mask.float()))  # every row with an action token, in order
        t.policy.eval()
        try:
            part = t.step_logprobs(rows, t.micro_batches(rows, range(len(rows.prompts))), entropies=True)
        finally:
            t.policy.train(training)
        return rows.scatter(part, mask.shape)

    @no_grad
    def ema_update(self, rate: float) -> None:
        """transform.teacher=ema (SDPO's teacher): θ_ema ← (1 − rate)·θ_ema + rate·θ over the trainable weights (the
        adapter under LoRA, every weight under full fine-tuning); the first call starts θ_ema at θ. θ_ema is
        checkpoint state (`save`, `load`)."""
        trained = self.trainee.trained_weights()
        if self.ema is None:
            self.ema = {name: p.detach().clone() for name, p in trained.items()}
            return
        for name, p in trained.items():
            self.ema[name].mul_(1.0 - rate).add_(p.detach(), alpha=rate)

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """The trainable weights are θ_ema while the body runs (the self-teacher's pass), then θ again, bit for bit."""
        if self.ema is None:
            raise ValueError("transform.teacher=ema scores with the EMA of the weights, which no ema_update has begun")
        trained = self.trainee.trained_weights()
        with torch.no_grad():
            held = {name: p.detach().clone() for name, p in trained.items()}
            for name, p in trained.items():
                p.copy_(self.ema[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in trained.items():
                    p.copy_(held[name])

    def policy_logprobs(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] log π of every completion token of the rollouts under the policy as it is now (0 on padding), from a
        no-grad pass in eval mode, in micro-batches or packed as a train step's: the self-teacher's scores of rows
        shown other prompts (rlvr/distill/self_teacher.py)."""
        t, mask, training = self.trainee, rollouts.mask_PG_T, self.trainee.policy.training
        rows = t.step_rows(TrainBatch(rollouts, mask.float()))  # every row with an action token, in order
        t.policy.eval()
        try:
            with torch.no_grad():
                part = t.step_logprobs(rows, t.micro_batches(rows, range(len(rows.prompts))))
        finally:
            t.policy.train(training)
        return rows.scatter(part, mask.shape)

    def self_teacher_scores(self, rollouts: Rollouts, topk: int, reference: bool) -> TeacherScores:
        """transform.estimator=full's self-teacher pass (rlvr/distill/self_teacher.py): the policy as it is now, or
        with `reference` as RL started (the adapter disabled under LoRA, the frozen copy under full fine-tuning),
        scoring the rollouts at their temperature with its top-k at every completion position, in no-grad passes of
        `micro_batch_size` rows (0: all), eval mode, each row right-padded (rlvr/backend/logprobs.py `score_rows`)."""
        from contextlib import nullcontext

        t, training = self.trainee, self.trainee.policy.training
        adapter = isinstance(t.policy, peft.PeftModel)
        if reference and not adapter and t.reference is None:
            raise ValueError("transform.teacher=base under full fine-tuning needs the reference copy, which this "
                             "backend was not built with (reference=True)")
        model = cast("nn.Module", t.reference if reference and not adapter else t.policy)
        G, mask = rollouts.group_size, rollouts.mask_PG_T
        prompts = [rollouts.prompt_ids_P[r // G] for r in range(mask.shape[0])]
        t.policy.eval()
        try:
            with cast("PeftModel", t.policy).disable_adapter() if reference and adapter else nullcontext():
                return score_rows(model, prompts, rollouts.tokens_PG_T, mask.sum(-1).tolist(), topk,
                                  t.micro_batch_size or mask.shape[0], rollouts.temperature)
        finally:
            t.policy.train(training)

    def reference_logprobs(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] log π_ref of every sampled completion token of the rollouts (0 on padding and on rows without an
        action token), no grad, in micro-batches or packed as a train step's: what `algorithm.kl.where=reward`
        subtracts from (rlvr/algorithm/kl.py `kl_in_reward`)."""
        t, mask = self.trainee, rollouts.mask_PG_T
        rows = t.step_rows(TrainBatch(rollouts, mask.float()))  # every row with an action token, in order
        part = t.step_reference_logprobs(rows, t.micro_batches(rows, range(len(rows.prompts))))
        return rows.scatter(part, mask.shape)

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]:
        t0, t = time.perf_counter(), self.trainee
        rows = t.step_rows(batch, loss)
        N = len(rows.prompts)
        batches = t.micro_batches(rows, range(N))
        if not t.policy.training:
            t.policy.train()
        selected = t.selection(loss, rows, batches)
        t.optimizer.zero_grad(set_to_none=True)
        sums = t.accumulate(loss, rows, batches, selected, scale=1.0)
        grad_scale = t.kept_scale(sums, rows)
        sums["loss"] *= grad_scale
        update = t.update(lr, sums["loss"] + sums["echo_loss"] + sums["distill_loss"], grad_scale=grad_scale)
        return t.report(sums, rows, selected, update, lr, N, t0, loss)

    def save(self, path: Path) -> None:
        """The adapter (`save_adapter`: adapter_model.safetensors + adapter_config.json, no model card) or the full
        weights (model.safetensors + config.json, loadable by `from_pretrained`), plus `optimizer.pt` and
        `local_state.json` (the step counter clip_cov's draws read), and `self_teacher_ema.safetensors` when
        transform.teacher=ema keeps an EMA of the weights (`ema_update`)."""
        path.mkdir(parents=True, exist_ok=True)
        if isinstance(self.trainee.policy, peft.PeftModel):
            save_adapter(self.trainee.policy, path)
        else:
            # tied weights are stored once
            safetensors_torch.save_model(self.trainee.policy, str(path / "model.safetensors"))
            cast("PreTrainedModel", self.trainee.policy).config.save_pretrained(path)
        torch.save(self.trainee.optimizer.state_dict(), path / "optimizer.pt")
        (path / STATE_FILE).write_text(json.dumps({"train_steps": self.trainee.train_steps}) + "\n")
        if self.ema is not None:
            safetensors_torch.save_file({k: v.contiguous() for k, v in self.ema.items()}, str(path / EMA_FILE))

    def load(self, path: Path) -> None:
        """Restore what `save` wrote: weights, optimizer moments and the step counter, exactly."""
        if isinstance(self.trainee.policy, peft.PeftModel):
            state = safetensors_torch.load_file(path / "adapter_model.safetensors", device=str(self.device))
            result = peft.set_peft_model_state_dict(self.trainee.policy, state)
            if result.unexpected_keys:
                raise ValueError(f"{path}: adapter does not fit this model ({result.unexpected_keys[:3]} …)")
        else:
            safetensors_torch.load_model(self.trainee.policy, str(path / "model.safetensors"), device=str(self.device))
        self.trainee.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device))
        # a checkpoint from before the counter existed cannot be a clip_cov run, the one reader of it: 0
        state = json.loads((path / STATE_FILE).read_text()) if (path / STATE_FILE).exists() else {}
        self.trainee.train_steps = int(state.get("train_steps", 0))
        if (path / EMA_FILE).is_file():
            self.ema = safetensors_torch.load_file(path / EMA_FILE, device=str(self.device))


def save_adapter(policy: PeftModel, path: Path) -> None:
    """`save_pretrained` (adapter_model.safetensors + adapter_config.json) without the model card PEFT writes
    beside them (README.md, every section "[More Information Needed]"), which it has no argument to skip: its
    card is removed, and a README.md the folder already had is put back as it was (PEFT rewrites it)."""
    card = path / "README.md"
    before = card.read_bytes() if card.is_file() else None
    policy.save_pretrained(str(path))
    if before is None:
        card.unlink(missing_ok=True)
    else:
        card.write_bytes(before)
