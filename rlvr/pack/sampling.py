"""A pack's sampling: the requests of the cells that wait, decoded together where that changes no number.

Each cell's engine is wrapped in a `CellEngine` (rlvr/start.py joins it when the run is a pack's cell): its `sample`
hands the request to the pack and waits for the round (rlvr/pack/cells.py). The round's requests that can share a
decoding loop (`batches`) are decoded in one: engine=pytorch's own loop (`PyTorchEngine`) over every cell's rows,
through a module in which each layer that holds weights is a `PerCell` dispatcher: it splits its input's rows by cell
and runs each part through that cell's own layer (its LoRA-merged Linear, or its PEFT layer with its adapter, its
embedding and norms), then joins them. The layers without weights (attention itself, rotary embeddings, activations)
and the decoding loop (the KV cache, the draws, EOS) run once for all rows. S-LoRA and Punica do the same on GPUs
with one batched multi-adapter kernel; here each cell's part is the very product its solo run computes.

Exactness. A row's numbers are its solo run's bit for bit: each layer computes a cell's rows with that cell's
weights, a row's draws come from its group's own generator (engine=pytorch seeds each group), and CPU kernels give a
row the same result whatever other rows share its batch (tests/pack/). They do not give the same result for another
left-padding: a chunk's rows are padded to its longest prompt, and a longer pad changes attention's summation order
(log-probabilities moved by ~5e-7). So requests are decoded together only when their longest prompts have the same
length (and the same group size, sampling parameters, and each fits one chunk, as its solo run decodes it); any
other request is decoded alone, by its own engine. Multi-turn episodes (`turn_sampler`, whose KV caches live
across turns), sampling ahead of training (a sampler thread) and other engines sample alone too.

engine=vllm: the cells that start from one base share one vLLM (rlvr/engine/vllm.py "Packed grids"), and their
requests are answered by one `generate` call, each prompt under its cell's adapter (`sample_adapters`), whatever
their prompts' lengths, group sizes and sampling parameters: vLLM batches by tokens, not by padded rows, and a row's
numbers are its run's alone.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rlvr.engine.pytorch import PyTorchEngine, evaluating
from rlvr.lazy import no_grad
from rlvr.pack.cells import Cell
from rlvr.seeds import group_seeds
from rlvr.types import Rollouts, SamplingParams


@dataclass(frozen=True)
class Request:
    """One `Engine.sample` call of a cell, as its engine received it."""

    engine: Any
    prompt_ids_P: list[list[int]]
    group_size: int
    params: SamplingParams
    seeds: list[int]
    with_entropy: bool

    def alone(self) -> Rollouts:
        return self.engine.sample(self.prompt_ids_P, self.group_size, self.params, self.seeds, self.with_entropy)

    @functools.cached_property
    def key(self) -> tuple | None:
        """`together_key`, worked out once."""
        return together_key(self)

    def rows(self) -> int:
        return len(self.prompt_ids_P) * self.group_size


class CellEngine:
    """A pack cell's engine: its own in everything, except that `sample` (from the cell's thread) waits for the
    pack's round when the request could be decoded with others' (`together_key`); any other it samples at once."""

    def __init__(self, engine: Any, cell: Cell) -> None:
        self.engine, self.cell = engine, cell

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def sample(self, prompt_ids_P: list[list[int]], group_size: int, params: SamplingParams, seeds: Sequence[int],
               with_entropy: bool = False) -> Rollouts:
        request = Request(self.engine, prompt_ids_P, group_size, params, group_seeds(seeds, len(prompt_ids_P)),
                          with_entropy)
        if threading.current_thread() is not self.cell.thread or request.key is None:
            return request.alone()  # a sampler thread of the cell's own, or a request no other could share: here
        return self.cell.wait_for(request)


@dataclass
class PackSampling:
    """Answers a pack's rounds (`answer`) and counts how: the pack's closing log line says it (`summary`)."""

    together: int = 0
    """Requests decoded in a batch with others."""
    alone: int = 0
    """Requests decoded by their own engine."""
    modules: dict[tuple[int, ...], nn.Module] = dataclasses.field(default_factory=dict)
    """The `per_cell_module` of the latest set of cells decoded together (the cells still sampling change as cells
    end), made once per set; the pack's own, freed with it."""

    def answer(self, waiting: list[Cell]) -> None:
        """Sample the waiting cells' requests: together where `batches` allows, the rest alone."""
        requests = [cell.request for cell in waiting]
        for batch in batches(requests):
            results: list[Any] = []
            if len(batch) > 1:
                try:
                    results = together([requests[i] for i in batch], self.modules)
                    self.together += len(batch)
                except Exception:  # noqa: BLE001 - one cell's weights (non-finite logits…): each fails alone, below
                    results = []
            if not results:
                results = [alone(requests[i]) for i in batch]
                self.alone += len(batch)
            for i, result in zip(batch, results, strict=True):
                waiting[i].answer = result

    def summary(self) -> str:
        total = self.together + self.alone
        return (f"{self.together} of {total} sampling requests decoded together with other cells' "
                f"({self.alone} alone: waiting alone, or another prompt length, more rows than one chunk, a failure)")


def alone(r: Request) -> Rollouts | Exception:
    """The request sampled by its own engine, or the exception that raised (the cell's answer either way)."""
    try:
        return r.alone()
    except Exception as err:  # noqa: BLE001 - raised in the cell's thread (Cell.wait_for)
        return err


def batches(requests: list[Request]) -> list[list[int]]:
    """Indices of the requests decoded together (module docstring "Exactness"), each batch one chunk of the engine
    (`within_budget`): every request alone in a batch of its own unless it can share."""
    out: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        key = r.key
        if key is None:
            out.append([i])
            continue
        batch = open_.get(key)
        if batch is not None and (key[0] == "vllm" or within_budget(r.engine, [requests[j] for j in batch] + [r])):
            batch.append(i)
        else:
            open_[key] = batch = [i]
            out.append(batch)
    return out


def together_key(r: Request) -> tuple | None:
    """What requests must share to be decoded together, or None when this one samples alone."""
    e = r.engine
    if shares_vllm(e):
        return ("vllm", id(e.llm))
    if not decodes_here(e) or e.worker is not None or e.activations is None or not fits(e, r):
        return None
    longest = max(len(p) for p in r.prompt_ids_P)
    return (type(e.module), e.activations, e.pad_id, tuple(e.eos_ids), e.max_batch_rows, e.max_batch_mb,
            r.group_size, r.params, r.with_entropy, longest, next(e.module.parameters()).device)


def decodes_here(engine: Any) -> bool:
    """The engine declares that it samples with the trained module in this process (`trainer_module`: engine=pytorch,
    whose decoding loop `Together` runs over several cells' rows)."""
    return "trainer_module" in type(engine).needs({}).provides


def shares_vllm(engine: Any) -> bool:
    """An engine=vllm of a pack's cell: its vLLM is the one the cells on its base share."""
    from rlvr.engine.vllm import VLLMEngine

    return isinstance(engine, VLLMEngine) and engine.packed


def together(requests: list[Request], made: dict[tuple[int, ...], nn.Module]) -> list[Rollouts]:
    """The requests of one batch (`batches`), sampled together: each one's `Rollouts` as its engine alone gives."""
    if shares_vllm(requests[0].engine):
        from rlvr.engine.vllm import sample_adapters

        return sample_adapters([(r.engine, r.prompt_ids_P, r.group_size, r.params, r.seeds, r.with_entropy)
                                for r in requests])
    return sample_together(requests, made)


def fits(engine: PyTorchEngine, r: Request) -> bool:
    """The request's rows are one chunk of its engine: its solo run decodes them in one loop."""
    rows = [p for p in r.prompt_ids_P for _ in range(r.group_size)]
    device = next(engine.module.parameters()).device
    return len(engine.chunks(rows, r.params.max_tokens, engine.budget_bytes(device))) == 1


def within_budget(engine: PyTorchEngine, requests: list[Request]) -> bool:
    """All the requests' rows, decoded together, one chunk as the engine bounds one: at most `max_batch_rows` rows,
    within its activation budget. (A pack's memory then grows with its cells' weights and state, not with their
    decoding: 6 cells' held-out sets of 1,000 prompts decoded at once took 420 MB more than one at a time.)"""
    assert engine.activations is not None
    rows = sum(r.rows() for r in requests)
    longest = max(len(p) for r in requests for p in r.prompt_ids_P)
    device = next(engine.module.parameters()).device
    return rows <= engine.max_batch_rows and engine.activations.bytes(
        rows, longest, requests[0].params.max_tokens) <= engine.budget_bytes(device)


@no_grad
def sample_together(requests: list[Request], made: dict[tuple[int, ...], nn.Module] | None = None) -> list[Rollouts]:
    """One decoding loop over the requests' rows, each through its own engine's weights; each request's `Rollouts`
    as its engine alone returns them (module docstring)."""
    first = requests[0]
    counts = [r.rows() for r in requests]
    module = per_cell_module([r.engine.module for r in requests], {} if made is None else made)
    engine = Together(module, counts, first.engine)
    prompts = [p for r in requests for p in r.prompt_ids_P]
    seeds = [s for r in requests for s in r.seeds]
    with evaluating(module):
        both = engine.sample(prompts, first.group_size, first.params, seeds, first.with_entropy)
    out, start = [], 0
    for r, n in zip(requests, counts, strict=True):
        out.append(part(both, r.prompt_ids_P, start, n))
        start += n
    return out


def part(both: Rollouts, prompt_ids_P: list[list[int]], start: int, n: int) -> Rollouts:
    """Rows start..start+n−1 of `both`, cut to the steps their own decoding loop would have run: it stops once all
    its rows are done, so its length is the most steps any of them was alive."""
    T = int(both.mask_PG_T[start : start + n].sum(1).max())

    def cut(t: Tensor) -> Tensor:
        return t[start : start + n, :T].clone()

    entropy = None if both.entropy_PG_T is None else cut(both.entropy_PG_T)
    return dataclasses.replace(both, prompt_ids_P=prompt_ids_P, tokens_PG_T=cut(both.tokens_PG_T),
                               logprobs_PG_T=cut(both.logprobs_PG_T), mask_PG_T=cut(both.mask_PG_T),
                               finished_PG=both.finished_PG[start : start + n].clone(), entropy_PG_T=entropy)


class Together(PyTorchEngine):
    """engine=pytorch's decoding loop over several cells' rows (`counts` of them per cell, in order), with the
    settings of `like` (a cell's engine): a prefill feeds a context once per cell, never across cells."""

    def __init__(self, module: nn.Module, counts: list[int], like: PyTorchEngine) -> None:
        super().__init__(module, like.eos_ids, like.pad_id, sum(counts), merge_lora=False,
                         max_batch_mb=like.max_batch_mb)
        self.cell_of_row = [c for c, n in enumerate(counts) for _ in range(n)]
        self.layout: Layout = module.pack_layout  # type: ignore[assignment]
        self.layout.full = counts

    def distinct(self, rows: list[list[int]]) -> tuple[list[int], list[int]] | tuple[None, None]:
        index: dict[tuple, int] = {}
        first: list[int] = []
        copies: list[int] = []
        for i, row in enumerate(rows):
            if (context := (self.cell_of_row[i], *row)) not in index:
                index[context] = len(first)
                first.append(i)
            copies.append(index[context])
        cells = len(self.layout.full)
        self.layout.prefill = [sum(1 for i in first if self.cell_of_row[i] == c) for c in range(cells)]
        return (first, copies) if len(first) < len(rows) else (None, None)


@dataclass
class Layout:
    """How many rows of the current forward pass are each cell's: the whole chunk's (`full`) in decoding, the
    distinct contexts' (`prefill`) in a prefill; chosen by the pass's row count."""

    full: list[int] = dataclasses.field(default_factory=list)
    prefill: list[int] = dataclasses.field(default_factory=list)
    current: list[int] = dataclasses.field(default_factory=list)

    def choose(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        rows = ids.shape[0]
        self.current = self.full if rows == sum(self.full) else self.prefill


class PerCell(nn.Module):
    """A layer of each cell, one module: its input's rows split by cell (`Layout.current`), each part through its
    cell's layer, the outputs joined in order."""

    def __init__(self, layers: list[nn.Module], layout: Layout) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.layout = layout

    def __getattr__(self, name: str) -> Any:
        """What the model reads of a layer besides calling it (PEFT reads its base layer's `weight` for the dtype):
        the first cell's, alike in every cell."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["layers"][0], name)  # type: ignore[index]

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        parts = x.split(self.layout.current, dim=0)
        return torch.cat([layer(p, *args, **kwargs) for layer, p in zip(self.layers, parts, strict=True)], dim=0)


def per_cell_module(modules: list[nn.Module], made: dict[tuple[int, ...], nn.Module]) -> nn.Module:
    """A module of the cells' common structure whose every layer holding weights is a `PerCell` of theirs (the
    others, and the structure, copied from the first; no weight is copied). Made once per set of modules."""
    key = tuple(id(m) for m in modules)
    if key in made:
        return made[key]
    first = modules[0]
    tensors = {id(t): t for t in [*first.parameters(), *first.buffers()]}
    packed = copy.deepcopy(first, memo=tensors)
    layout = Layout()
    owners = [name for name, m in first.named_modules() if any(True for _ in m.parameters(recurse=False))]
    for name in owners:
        layers = [m.get_submodule(name) for m in modules]
        parent, _, child = name.rpartition(".")
        setattr(packed.get_submodule(parent) if parent else packed, child, PerCell(layers, layout))
    packed.register_forward_pre_hook(layout.choose, with_kwargs=True)
    packed.pack_layout = layout  # type: ignore[assignment]
    made.clear()  # the cells still sampling change as cells end: keep the latest set only
    made[key] = packed
    return packed
