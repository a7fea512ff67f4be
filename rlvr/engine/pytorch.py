"""`engine=pytorch`: batched sampling in the training process, from the very module the backend trains.

Each prompt is repeated G times, rows are left-padded, and decoding runs with a KV cache one token per
step for all rows at once, until every row has emitted an EOS id or `max_tokens` is reached. The prefill feeds each
distinct context of a chunk once (a group's G rows are one prompt) and copies its cache and logits to the rows that
share it (`distinct_rows`): a G-th of the prefill's work, the same numbers up to float summation order (a batch of
another size; the sampled tokens were identical here, tests/engine/test_pytorch_engine.py). At each
step (the predecessor's sampler, with one deliberate change):

    scaled = logits / max(T, 1e-7);  p = softmax(scaled)
    top_p < 1: keep the smallest prefix of tokens sorted by p whose mass reaches top_p, renormalise,
               draw from that (the predecessor's rule: drop a token when cumsum − p > top_p)
    T = 0:     argmax
    returned logprob = log p(token) under the temperature-scaled distribution *before* top-p truncation
    entropy (on request) = −Σ p log p of the same distribution

The predecessor returned the truncated distribution's logprob and trained at T=1, so its importance
ratio was not 1 on-policy (docs/predecessor.md#the-training-step). Here sampler and backend agree on one
distribution.

Seeding. Each prompt's group draws from its own `torch.Generator`, seeded with the group's seed (`Engine.sample`
takes one per prompt). A group's completions therefore depend on its seed and the weights
alone: not on which other groups share the batch, how many processes share the step, nor how the rows are
chunked. Greedy decoding (T = 0) draws nothing.

Chunks. `rows` (every prompt × group_size) are decoded in consecutive chunks, each the most rows, at most
`max_batch_rows`, whose estimated peak activation memory (`Activations.bytes`) fits `max_batch_mb`; a row that
alone exceeds the budget is a chunk by itself. The budget: `max_batch_mb` MiB when set; null (auto) is
`CPU_BUDGET_MB` on a CPU and half the memory the GPU can still give (free + held by torch's allocator but unused)
on a GPU, read at each call. Chunking changes how much is in memory at once, not the draws: each row's random
numbers are the same whatever the chunks (`Noise`), and so are its logits up to float summation order (a
chunk's size and padding may change the kernels' order; the sampled tokens were identical on the CPU here,
tests/engine/ and bench/eval_memory.py, as they already were when other prompts shared a row's batch).

Turns. An episode's turn k + 1 continues turn k's context (rlvr/rollout/episodes.py): `turn_sampler()` gives the episode
loop a `Turns`, which keeps each chunk's KV cache after decoding (`Past`) and, at the next turn, narrows it to the
episodes still playing and feeds each only what its context adds (the last sampled token, the observation),
instead of re-encoding the whole context. The cache's layout: a row's own tokens where its attention mask is 1;
zeros on its left padding, on the left padding of each later feed (new tokens of different lengths are padded to
the longest) and where a row that had finished was fed a pad while the chunk decoded on; position ids count the
row's own tokens only, so each row sees what re-encoding would show it. Draws are unchanged (each context's
generator is seeded as `sample` seeds it, `Noise`), and the logits are those of re-encoding up to float
summation order: the sampled tokens were identical here and the log-probabilities within 1e-5
(tests/rollout/test_episode_cache.py). A context that does not extend what its cache holds, an episode the cache
has not seen, and a chunk whose grown cache would pass the activation budget are re-encoded in fresh chunks; so is
every turn of a model whose cache is not all plain attention (`holes_are_exact`: under linear attention or a sliding
window, the holes would change what a row sees). Cost:
the caches of the episodes still playing stay in memory between turns, while the environment steps (the KV cache
part of `Activations.bytes`, holes included), and are freed when the batch is played (`Turns.close`). The last
sampled token of a call is never fed (nothing is sampled after it; the next turn feeds it), in `sample` as here.

Weights: under LoRA with `merge_lora: true`, the engine samples from a plain copy of the model in which
every adapted Linear holds W0 + s·B·A, refreshed by `sync` after each optimizer step (one addmm per
adapted layer). Decoding then runs no PEFT wrapper code, which on the tiny model is half of each decode
forward; the price is a second copy of the adapted weights (all other weights are shared, not copied).
With `merge_lora: false`, under full fine-tuning, or from a policy sharded by backend=fsdp (which cannot be
copied), the engine samples from the backend's module itself and `sync` has nothing to copy. When the trainer
samples ahead of training (trainer.off_policy_steps ≥ 1, docs/overlap.md) the engine is built on a copy of the
policy made before the backend wrapped it (`rlvr/start.py` local_policy), and `sync` copies the trainable
weights into it: sampling then never reads a module the trainer is changing.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import, no_grad
from rlvr.protocols import Needs, Staged
from rlvr.seeds import group_seeds
from rlvr.types import Continued, Rollouts, SamplingParams, Segment

if TYPE_CHECKING:
    from torch import Generator, Tensor, nn

    from rlvr.engine.sampler_process import SamplerProcess, WorkerTurns

    Generators = list[tuple[Generator, int, slice]]
    """Per group a chunk holds, in the chunk's row order: (its generator, group_size, the chunk's rows of it, as rows
    of the group). Empty when greedy."""
    Decoded = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]
    """A chunk's sampled tokens, logprobs, mask [N, T], finished [N] and entropies [N, T] (or the logprobs)."""

torch = lazy_import("torch")
transformers = lazy_import("transformers")

CPU_BUDGET_MB = 1024
"""`max_batch_mb: null` on a CPU. Larger chunks stopped paying well below it on the 2-core machine: 1,000 rows of
600 tokens through the tiny model (bench/eval_memory.py) took 63 / 59 / 69 / 70 / 84 s in chunks of 128 MiB /
256 MiB / 1 GiB / 4 GiB / all rows (15 GB), and a 110M-parameter Llama decoded no faster past 64 rows a chunk
(~200 MiB); 1 GiB keeps that margin for larger models while bounding what decoding adds to the process. A real
model with long contexts decodes few rows a chunk under it: raise `max_batch_mb` where the memory is there."""
GPU_BUDGET_FRACTION = 0.5
"""`max_batch_mb: null` on a GPU: this share of the memory still available when `sample` is called (decoding and
the training step do not overlap; the other half is the estimate's margin)."""


def trainable(policy: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """`policy`'s trainable parameters by name, detached; a sharded parameter (backend=fsdp, gathered for sampling)
    whole (on every rank: a collective)."""
    for name, param in policy.named_parameters():
        if param.requires_grad:
            yield name, (param.full_tensor() if hasattr(param, "full_tensor") else param).detach()


@no_grad
def copy_trainable(weights: Iterator[tuple[str, Tensor]], copy_: nn.Module) -> None:
    """`weights` (`trainable`'s) into `copy_`, a module of the policy's structure, by name."""
    into = dict(copy_.named_parameters())
    for name, tensor in weights:
        into[name].copy_(tensor)


@dataclass(frozen=True)
class Activations:
    """What sizes a chunk's activation memory, from the model's config (its text part)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    attention: str
    """The config's attention implementation: eager materialises the [heads, L, L] scores."""
    itemsize: int
    """Bytes per element of the compute dtype (the parameters')."""

    @classmethod
    def of(cls, module: nn.Module) -> Activations | None:
        """None when the module has no transformers config to read (then only `max_batch_rows` bounds chunks)."""
        config: Any = getattr(module, "config", None)
        if config is None:
            return None
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        try:
            heads = config.num_attention_heads
            return cls(
                layers=config.num_hidden_layers, heads=heads,
                kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                hidden=config.hidden_size,
                intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
                vocab=config.vocab_size, attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
                itemsize=next(module.parameters()).dtype.itemsize,
            )
        except (AttributeError, TypeError, StopIteration):
            return None

    def bytes(self, rows: int, length: int, max_tokens: int) -> int:
        """Estimated peak bytes of decoding `rows` rows left-padded to `length` tokens, up to `max_tokens` more:

            kv cache    layers · 2 · kv_heads · (length + max_tokens) · head_dim · b      (kept to the last token)
            attention   eager:  heads · length² · (b + max(b, 4))  +  length² · b        (prefill: the scores and
                                their fp32 softmax alive at once, + the additive mask)
                        sdpa:   length² · 1 (the boolean mask; the kernel keeps no scores);  flash: 0
            layer       length · (4 · hidden + 3 · intermediate) · b                      (one layer's prefill
                                activations: residual, norm, q/k/v/o; the MLP's gate, up and their product)
            logits      8 · vocab · 4                                                     (one step's fp32 copies:
                                log-softmax, probabilities, sort values and indices, cumsum)

        each per row, b the compute dtype's bytes. The weights are not counted (they are there either way)."""
        b, S, L = self.itemsize, length + max_tokens, length
        kv = self.layers * 2 * self.kv_heads * S * self.head_dim * b
        if self.attention == "eager":
            attention = self.heads * L * L * (b + max(b, 4)) + L * L * b
        elif self.attention == "sdpa":
            attention = L * L
        else:
            attention = 0
        layer = L * (4 * self.hidden + 3 * self.intermediate) * b
        logits = 8 * self.vocab * 4
        return rows * (kv + attention + layer + logits)


@dataclass
class Past:
    """A chunk's KV cache after a `_decode`: what its rows' next turn continues from (module docstring "Turns")."""

    cache: Any
    """The transformers cache: every layer's keys and values, [N, heads, S, head_dim]."""
    attn: Tensor
    """[N, S]: 1 where a position holds one of the row's own tokens, 0 on padding and on what a row that had
    finished was fed."""
    lengths: Tensor
    """[N]: the row's own tokens in the cache (its next token's position id)."""

    def select(self, rows: Tensor) -> Past:
        """These rows only, in this order (the cache is narrowed in place)."""
        self.cache.reorder_cache(rows)  # every layer kind's states, a linear-attention layer's too
        return Past(self.cache, self.attn[rows], self.lengths[rows])


@contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """`module` in eval mode inside (dropout off), back to training mode after if it was."""
    was_training = module.training
    if was_training:
        module.eval()
    try:
        yield
    finally:
        if was_training:
            module.train()


@dataclass
class _Cached:
    """One chunk's cache and, per row, the episode it holds and the ids whose keys and values it holds."""

    past: Past
    keys: list[int]
    ids: list[list[int]]


class Turns:
    """The turns of one batch of episodes, each episode's KV cache kept from one turn to the next (module
    docstring "Turns"). `PyTorchEngine.turn_sampler()` makes one per played batch; `close` frees the caches."""

    def __init__(self, engine: PyTorchEngine) -> None:
        self.engine = engine
        self.chunks: list[_Cached] = []
        self.synced = engine.synced
        """The engine's weights the caches were computed with: a `sync` since drops them."""
        self.pool: list[Generator] = []
        """The generators `generators` hands out, reseeded for each chunk."""

    @no_grad
    def sample(self, keys: list[int], contexts: list[list[int]], params: SamplingParams, seeds: Sequence[int],
               with_entropy: bool = False) -> Rollouts:
        """One completion of each context, as `PyTorchEngine.sample(contexts, 1, params, seeds, with_entropy)`
        would sample it: the same draws (seed i for context i), the same tokens, the log-probabilities to float
        summation order. `keys[i]` names context i's episode; an episode whose context extends what its cache
        holds feeds only the new tokens."""
        engine, device = self.engine, next(self.engine.module.parameters()).device
        seeds = group_seeds(seeds, len(contexts))
        if self.synced != engine.synced:
            self.chunks = []
        where = {k: (c, r) for c, chunk in enumerate(self.chunks) for r, k in enumerate(chunk.keys)}
        kept: dict[int, list[int]] = {}  # chunk → the calls' rows that continue from it
        fresh: list[int] = []
        for i, (key, context) in enumerate(zip(keys, contexts, strict=True)):
            c, r = where.get(key, (-1, -1))
            held = self.chunks[c].ids[r] if c >= 0 else None
            if held is not None and len(context) > len(held) and context[: len(held)] == held:
                kept.setdefault(c, []).append(i)
            else:
                fresh.append(i)
        budget = engine.budget_bytes(device)
        jobs: list[tuple[list[int], list[list[int]], Past | None]] = []  # (the call's rows, what each feeds, cache)
        for c, calls in kept.items():
            chunk, rows = self.chunks[c], [where[keys[i]][1] for i in calls]
            feed = [contexts[i][len(chunk.ids[r]):] for i, r in zip(calls, rows, strict=True)]
            length = chunk.past.attn.shape[1] + max(len(f) for f in feed)
            activations = engine.activations
            if activations is not None and activations.bytes(len(calls), length, params.max_tokens) > budget:
                fresh += calls  # a cache grown past the budget: these rows are re-encoded in chunks that fit
                continue
            jobs.append((calls, feed, chunk.past.select(torch.tensor(rows, device=device))))
        fresh.sort()
        spans = engine.chunks([contexts[i] for i in fresh], params.max_tokens, budget)
        jobs += [(fresh[start:stop], [contexts[i] for i in fresh[start:stop]], None) for start, stop in spans]
        self.chunks, decoded, order = [], [], []
        with evaluating(engine.module):
            for calls, feed, past in jobs:
                gen = [] if params.temperature == 0 else [(g.manual_seed(seeds[i]), 1, slice(0, 1)) for g, i in
                                                          zip(self.generators(len(calls), device), calls, strict=True)]
                out, after = engine._decode(feed, params, gen, with_entropy, device, past)
                fed, sampled = out[2][:, : out[0].shape[1] - 1].sum(1).tolist(), out[0].tolist()
                if engine.caches_continue:
                    self.chunks.append(_Cached(after, [keys[i] for i in calls],
                                               [contexts[i] + sampled[j][: fed[j]] for j, i in enumerate(calls)]))
                decoded.append(out)
                order += calls
        self.synced = engine.synced
        position = torch.empty(len(order), dtype=torch.long)
        position[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        return engine._rollouts(contexts, 1, params, decoded, with_entropy, position)

    def generators(self, count: int, device) -> list[Generator]:
        """`count` generators to seed, made once per played batch: a chunk's draws are over (`_decode` returned)
        before the next chunk reseeds them."""
        while len(self.pool) < count:
            self.pool.append(torch.Generator(device=device))
        return self.pool[:count]

    def close(self) -> None:
        """Free the caches (the episodes are played)."""
        self.chunks = []


class PyTorchEngine:

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"entropy", "group_seeds", "trainer_module", "partial_rollouts",
                                         "staged_sync"}),
                     requires={"local_policy": "it samples from the trained module in this process"})

    def __init__(self, policy: nn.Module, eos_ids: list[int], pad_id: int, max_batch_rows: int, merge_lora: bool,
                 max_batch_mb: int | None = None):
        if max_batch_rows < 1 or (max_batch_mb is not None and max_batch_mb <= 0):
            raise ValueError(f"engine.max_batch_rows={max_batch_rows} must be >= 1 and engine.max_batch_mb="
                             f"{max_batch_mb} > 0 or null (auto)")
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.max_batch_rows = max_batch_rows
        """The most rows decoded together."""
        self.max_batch_mb = max_batch_mb
        """The activation budget of one chunk in MiB (`Activations.bytes`); None: auto (module docstring)."""
        self.activations = Activations.of(policy)
        self.caches_continue = holes_are_exact(policy)
        """Whether `Turns` may continue a cache with holes in it (module docstring "Turns")."""
        self.source = policy
        """The module sampled from: the trainer's own, or a copy of it the engine was given (`sync`)."""
        self.merged = MergedLora.of(policy) if merge_lora else None
        self.synced = 0
        """How many `sync`s: a `Turns`' caches hold keys and values of the weights of one."""
        self.sync(policy)
        self.worker: SamplerProcess | None = None
        """Where `sample` runs once sampling runs beside training on a CPU (`sample_beside_training`)."""

    def connect(self) -> None:
        """Nothing to reach: the engine is ready once built."""

    def sync(self, policy: nn.Module) -> int:
        """Sample from `policy` (its merged copy refreshed in memory under LoRA); writes nothing: 0 bytes. An engine
        built on a copy of the policy (trainer.off_policy_steps ≥ 1: it samples while the trainer trains) first
        copies the policy's trainable weights into it."""
        if policy is not self.source:
            copy_trainable(trainable(policy), self.source)
        self._refresh()
        return 0

    def stage(self, policy: nn.Module) -> Staged:
        """`sync(policy)` in two halves (rlvr/overlap.py): a copy of the policy's trainable weights now, into the
        engine's copy of the policy when loaded. Only an engine built on a copy stages (sampling ahead): its
        memory is a copy of the trainable weights (the adapter's, under LoRA) for each version staged but not yet
        loaded."""
        if policy is self.source:
            raise RuntimeError("PyTorchEngine.stage needs an engine built on a copy of the policy (sampling ahead)")
        weights = [(name, tensor.clone()) for name, tensor in trainable(policy)]

        def load() -> None:
            copy_trainable(iter(weights), self.source)
            self._refresh()

        return Staged(load, 0)

    def _refresh(self) -> None:
        """Sample from the source's weights as they are now (its merged copy recomputed under LoRA)."""
        self.module = self.merged.refresh() if self.merged is not None else self.source
        self.synced += 1

    def sleep(self) -> None:
        """Nothing to give back: the engine decodes with the trainer's own module (and a merged copy it keeps)."""

    def sample_beside_training(self, beside: bool) -> None:
        """True: sampling now runs in the trainer's sampler thread while it trains (from a copy of the policy:
        `sync`). On a CPU it moves to a worker process that reads this engine's weights in shared memory
        (rlvr/engine/sampler_process.py: a small model's decoding is mostly Python, which a thread would run under
        the trainer's GIL); on a GPU it stays in the thread (the kernels release the GIL). False: back here."""
        if not beside:
            self.close()
        elif self.worker is None and next(self.module.parameters()).device.type == "cpu":
            from rlvr.engine.sampler_process import SamplerProcess

            self.worker = SamplerProcess(self.module, functools.partial(
                PyTorchEngine, eos_ids=self.eos_ids, pad_id=self.pad_id, max_batch_rows=self.max_batch_rows,
                merge_lora=False, max_batch_mb=self.max_batch_mb))

    def close(self) -> None:
        """The worker process ends, if there is one; otherwise nothing to release: the engine holds the policy (and
        its merged copy) only."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    @no_grad
    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        if self.worker is not None:
            return self.worker.sample(prompt_ids_P, group_size, params, seeds, with_entropy)
        rows = [ids for ids in prompt_ids_P for _ in range(group_size)]
        device = next(self.module.parameters()).device
        seeds = group_seeds(seeds, len(prompt_ids_P))

        def chunk_gen(start: int, stop: int) -> Generators:
            """For each group that rows start..stop−1 touch, a generator fresh from its seed (module docstring)."""
            if params.temperature == 0:
                return []
            gens = []
            for p in range(start // group_size, (stop - 1) // group_size + 1):
                first, last = max(p * group_size, start), min((p + 1) * group_size, stop)
                gens.append((torch.Generator(device=device).manual_seed(seeds[p]), group_size,
                             slice(first - p * group_size, last - p * group_size)))
            return gens

        with evaluating(self.module):
            chunks = [self._decode(rows[start:stop], params, chunk_gen(start, stop), with_entropy, device)[0]
                      for start, stop in self.chunks(rows, params.max_tokens, self.budget_bytes(device))]
        return self._rollouts(prompt_ids_P, group_size, params, chunks, with_entropy)

    @no_grad
    def continue_rows(self, segment: Segment) -> Continued:
        """Partial rollouts (rlvr/rollout/partial.py): `segment`'s rows prefilled under the current weights (their
        keys and values recomputed), then decoded until the segment may end (`Segment`); in the sampler process
        while sampling runs beside training on a CPU."""
        if self.worker is not None:
            return self.worker.call("continue", (segment,))
        if segment.settled:
            return Continued.nothing(segment)
        with evaluating(self.module):
            return self._continue(segment, next(self.module.parameters()).device)

    def _continue(self, segment: Segment, device) -> Continued:
        """`continue_rows` in this process. A row that ends leaves the batch (its cache rows dropped): a segment's
        cost follows the tokens its rows still sample, not its longest row times its rows."""
        N = len(segment.contexts)
        logits, cache, attn, position = self._prefill(segment.contexts, device)
        next_pos, eos = position[:, -1:] + 1, torch.tensor(self.eos_ids, device=device)
        budgets = torch.tensor(segment.budgets, device=device)
        ended, ended_eos = (torch.zeros(N, dtype=torch.bool, device=device) for _ in range(2))
        live = torch.arange(N, device=device)  # the batch's rows, as indices into the segment's
        noise = RowNoise(segment.seeds, segment.offsets)
        out: list[list[list]] = [[[] for _ in range(N)] for _ in range(3)]  # tokens, log-probs, entropies
        for t in range(max(segment.budgets)):
            token, logp, entropy = draw(logits.float(), segment.params, noise, t, segment.with_entropy)
            for values, drawn in zip(out, (token, logp, entropy), strict=True):
                for row, value in zip(live.tolist(), drawn.tolist(), strict=True):
                    values[row].append(value)
            hit = torch.isin(token, eos)
            done = hit | (budgets[live] <= t + 1)
            ended_eos[live[hit]], ended[live[done]] = True, True
            if bool(ended.all()) or segment.may_end(ended.tolist(), [t + 1] * N):  # every live row drew t + 1
                break
            keep = (~done).nonzero().squeeze(1)
            if len(keep) < len(live):
                cache.reorder_cache(keep)
                attn, next_pos, token, live = attn[keep], next_pos[keep], token[keep], live[keep]
                noise.keep(keep.tolist())
            attn = torch.cat([attn, attn.new_ones((len(live), 1))], dim=1)
            logits = self.module(input_ids=token[:, None], attention_mask=attn, position_ids=next_pos,
                                 past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        return Continued(out[0], out[1], out[2] if segment.with_entropy else None, ended.cpu().tolist(),
                         ended_eos.cpu().tolist())

    def _prefill(self, rows: list[list[int]], device) -> tuple[Tensor, Any, Tensor, Tensor]:
        """(the last position's logits, the cache, the attention mask, the positions) of `rows` left-padded to the
        longest and prefilled under the current weights, for `_continue`. Each distinct row is fed once
        (`distinct_rows`: a group admitted in this job is G copies of its prompt). On a CPU, where a position held out
        by the mask is exact (`caches_continue`: plain attention), the rows then go in buckets of like length
        (`buckets`) whose keys and values are left-padded to the longest and joined: a CPU's prefill costs its padded
        positions, and a pool in flight is mostly short rows beside a few long ones, which one batch would pad to the
        longest. A GPU's pass costs about the same over a few thousand positions, so there buckets would only add
        passes: one batch, as before (not measured on a GPU)."""
        L = max(len(r) for r in rows)
        attn = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
        first, copies = distinct_rows(rows)
        distinct = rows if first is None else [rows[i] for i in first]
        parts = buckets([len(r) for r in distinct]) if self.caches_continue and torch.device(device).type == "cpu" \
            else [list(range(len(distinct)))]
        logits, caches = [], []
        for part in parts:
            fed = [distinct[n] for n in part]
            width = max(len(r) for r in fed)
            ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in fed], dtype=torch.long, device=device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in fed], dtype=torch.long, device=device)
            caches.append(transformers.DynamicCache(config=self.module.config))
            position = (mask.cumsum(-1) - 1).clamp(min=0)
            logits.append(self.module(input_ids=ids, attention_mask=mask, position_ids=position,
                                      past_key_values=caches[-1], use_cache=True, logits_to_keep=1).logits[:, -1])

        def joined(layer: int, kind: str) -> Tensor:  # the buckets' keys or values, each left-padded to L
            states = [getattr(c.layers[layer], kind) for c in caches]
            return torch.cat([torch.nn.functional.pad(t, (0, 0, L - t.shape[2], 0)) for t in states])

        cache = caches[0] if len(caches) == 1 else transformers.DynamicCache(
            [(joined(layer, "keys"), joined(layer, "values")) for layer in range(len(caches[0].layers))],
            config=self.module.config)
        fed_at = {n: i for i, n in enumerate(n for part in parts for n in part)}  # a distinct row's place as fed
        index = [fed_at[c] for c in (copies if copies is not None else range(len(distinct)))]
        last = torch.cat(logits)
        if index != list(range(len(index))):  # back to the rows' order, each row its context's
            cache.reorder_cache(torch.tensor(index, device=device))
            last = last[torch.tensor(index, device=device)]
        return last, cache, attn, (attn.cumsum(-1) - 1).clamp(min=0)

    def _rollouts(self, prompt_ids_P: list[list[int]], group_size: int, params: SamplingParams,
                  chunks: list[Decoded], with_entropy: bool, order: Tensor | None = None) -> Rollouts:
        """The chunks' rows, in order (or in `order`, indices into the chunks' rows), as one `Rollouts`."""
        T = max(c[0].shape[1] for c in chunks)

        def cat(i: int, fill: float | int) -> Tensor:
            out = torch.cat([torch.nn.functional.pad(c[i], (0, T - c[i].shape[1]), value=fill) for c in chunks])
            return (out if order is None else out[order.to(out.device)]).cpu()

        finished = torch.cat([c[3] for c in chunks])
        return Rollouts(
            prompt_ids_P=prompt_ids_P,
            group_size=group_size,
            tokens_PG_T=cat(0, self.pad_id),
            logprobs_PG_T=cat(1, 0.0),
            mask_PG_T=cat(2, False),
            finished_PG=(finished if order is None else finished[order.to(finished.device)]).cpu(),
            temperature=params.temperature,
            entropy_PG_T=cat(4, 0.0) if with_entropy else None,
        )

    def turn_sampler(self) -> Turns | WorkerTurns:
        """A sampler of an episode batch's turns that keeps each episode's KV cache from one turn to the next
        (module docstring "Turns"), in the worker process while sampling runs there (`sample_beside_training`)."""
        return self.worker.turn_sampler() if self.worker is not None else Turns(self)

    def budget_bytes(self, device) -> int:
        """One chunk's activation budget (module docstring)."""
        if self.max_batch_mb is not None:
            return int(self.max_batch_mb * 2**20)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(GPU_BUDGET_FRACTION * (free + unused))
        return CPU_BUDGET_MB * 2**20

    def chunks(self, rows: list[list[int]], max_tokens: int, budget: int) -> list[tuple[int, int]]:
        """(start, stop) of consecutive chunks: each the most rows, up to `max_batch_rows`, whose estimate at the
        chunk's longest row fits `budget` bytes; at least one row."""
        spans, start, longest = [], 0, 0
        for i, row in enumerate(rows):
            n, length = i - start + 1, max(longest, len(row))
            over = self.activations is not None and self.activations.bytes(n, length, max_tokens) > budget
            if n > 1 and (n > self.max_batch_rows or over):
                spans.append((start, i))
                start, length = i, len(row)
            longest = length
        return [*spans, (start, len(rows))] if rows else []

    def distinct(self, rows: list[list[int]]) -> tuple[list[int], list[int]] | tuple[None, None]:
        """What a fresh chunk's prefill feeds once and copies (`distinct_rows`; a pack's rows are distinct per cell,
        rlvr/pack/sampling.py)."""
        return distinct_rows(rows)

    def _decode(
        self, rows: list[list[int]], params: SamplingParams, gen: Generators, with_entropy: bool, device,
        past: Past | None = None,
    ) -> tuple[Decoded, Past]:
        """Decode `rows` (after `past`, a cache holding their earlier tokens, when given: then `rows` are the new
        tokens only). Returns the sampled tensors and the cache as it stands after them (module docstring "Turns")."""
        N, L = len(rows), max(len(r) for r in rows)
        input_ids = torch.tensor([[self.pad_id] * (L - len(r)) + r for r in rows], dtype=torch.long, device=device)
        attn = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
        position = (attn.cumsum(-1) - 1).clamp(min=0)
        if past is not None:
            position = position + past.lengths[:, None]
            attn = torch.cat([past.attn, attn], dim=1)
        eos = torch.tensor(self.eos_ids, device=device)
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        tokens, logprobs, masks, entropies = [], [], [], []
        # with the config: a model whose layers keep other state than keys and values (Qwen3.5's linear attention)
        cache = past.cache if past is not None else transformers.DynamicCache(config=self.module.config)
        first, copies = self.distinct(rows) if past is None else (None, None)
        feed = slice(None) if first is None else torch.tensor(first, device=device)
        logits = self.module(
            input_ids=input_ids[feed], attention_mask=attn[feed], position_ids=position[feed], past_key_values=cache,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        if copies is not None:  # each row its context's prefill: a group's G rows were one prompt, prefilled once
            index = torch.tensor(copies, device=device)
            cache.reorder_cache(index)
            logits = logits[index]
        next_pos = position[:, -1:] + 1
        noise = Noise(gen, params.max_tokens)
        for t in range(params.max_tokens):
            token, logp, entropy = draw(logits.float(), params, noise, t, with_entropy)
            alive = ~finished
            token = torch.where(alive, token, self.pad_id)
            tokens.append(token)
            logprobs.append(torch.where(alive, logp, 0.0))
            masks.append(alive)
            entropies.append(torch.where(alive, entropy, 0.0) if with_entropy else logp)
            finished = finished | torch.isin(token, eos)
            if t == params.max_tokens - 1 or bool(finished.all()):
                break  # the last token is not fed: nothing is sampled after it
            # a finished row's pad is fed with attention 0: the cache then holds its own tokens only
            attn = torch.cat([attn, alive[:, None].to(attn.dtype)], dim=1)
            logits = self.module(
                input_ids=token[:, None], attention_mask=attn, position_ids=next_pos, past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            next_pos = next_pos + 1
        if not tokens:  # max_tokens == 0 is rejected by validation; keep shapes sane anyway
            empty = torch.zeros((N, 0), device=device)
            return (empty.long(), empty, empty.bool(), finished, empty), Past(cache, attn, position[:, -1] + 1)
        decoded = (torch.stack(tokens, 1), torch.stack(logprobs, 1), torch.stack(masks, 1), finished,
                   torch.stack(entropies, 1))
        fed = decoded[2][:, : len(tokens) - 1]  # the sampled tokens fed back: every one but the last step's
        return decoded, Past(cache, attn, position[:, -1] + 1 + fed.sum(1))


def holes_are_exact(module: nn.Module) -> bool:
    """Whether every layer of the module's cache is plain attention, which a position held out by the attention mask
    leaves exactly as re-encoding without it would. A linear-attention layer (Qwen3.5's Gated DeltaNet) runs its
    convolution and recurrent state through such a position, and a sliding-window layer counts it in its window: under
    those a `Turns` cache is not continued, each turn is re-encoded."""
    config = getattr(module, "config", None)
    if config is None:
        return False
    return all(type(layer) is transformers.cache_utils.DynamicLayer
               for layer in transformers.DynamicCache(config=config).layers)


PREFILL_CALL_POSITIONS = 64
"""What one more forward pass costs on a CPU, in padded positions, where `buckets` weighs splitting a prefill (measured
with the tiny model on one core: a pass ~1.3 ms of overhead, a position ~20 µs)."""


def buckets(lengths: Sequence[int], call: int = PREFILL_CALL_POSITIONS) -> list[list[int]]:
    """The indices of `lengths` in buckets of like length, shortest first, each to be prefilled as one left-padded
    batch: those that cost the fewest positions, its rows times its longest for each bucket plus `call` (a dynamic
    programme over the sorted lengths, cutting only between distinct ones)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cuts = [i for i in range(1, len(order) + 1) if i == len(order) or lengths[order[i]] != lengths[order[i - 1]]]
    cost: dict[int, int] = {0: 0}
    back: dict[int, int] = {}
    for j in cuts:
        cost[j], back[j] = min((cost[i] + call + (j - i) * lengths[order[j - 1]], i) for i in (0, *cuts) if i < j)
    out, j = [], len(order)
    while j:
        out.append(order[back[j]:j])
        j = back[j]
    return out[::-1]


def distinct_rows(rows: list[list[int]]) -> tuple[list[int], list[int]] | tuple[None, None]:
    """(the first row of each distinct context, per row the index of its context among them), or (None, None) when
    the rows are all distinct: what a prefill feeds once and expands to every row."""
    index: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    copies: list[int] = []
    for i, row in enumerate(rows):
        if (context := tuple(row)) not in index:
            index[context] = len(first)
            first.append(i)
        copies.append(index[context])
    return (first, copies) if len(first) < len(rows) else (None, None)


NOISE_WINDOW = 4096
"""The most elements of one group row's noise (`Noise`) drawn at once: steps × vocabulary."""


class Noise:
    """The exponential race's noise (`multinomial`) for a chunk's rows, E ~ Exp(1) per row and token, step by step.

    Each group's generator draws E for all its group_size rows at every step, also when the chunk holds only some of
    them, so that a row's draw at step t is the same whatever the chunking. The draws are made a window of W steps at
    a time: one `exponential_` of [W · group_size, V] per group, not W of [group_size, V]; a generator's stream is
    consumed in order, so on a CPU these are the very numbers the W one-step calls draw (tests/engine/), and
    W = NOISE_WINDOW // V, at least 1 and at most the steps left of max_tokens, depends on the vocabulary and
    max_tokens alone, never on the chunk. A real vocabulary's W is 1 (a draw per step, as before); model=tiny's
    episodes (128 generators of one row each, two steps a turn) draw half as often, and no step loops over them."""

    def __init__(self, gen: Generators, max_tokens: int) -> None:
        self.gen, self.max_tokens = gen, max_tokens
        self.group_size = gen[0][1] if gen else 1
        if any(group_size != self.group_size for _, group_size, _ in gen):
            raise ValueError("a chunk's groups are of one group_size")
        full = all(within == slice(0, self.group_size) for _, _, within in gen)
        self.rows = None if full else torch.tensor(
            [g * self.group_size + r for g, (_, _, within) in enumerate(gen) for r in range(within.start, within.stop)])
        """Which of the groups' rows are the chunk's (None: all)."""
        self.drawn: Tensor | None = None
        """[W, N, V]: this window's noise, step by step."""
        self.start = 0
        """The step the window starts at."""

    def at(self, t: int, like: Tensor) -> Tensor:
        """Step t's noise [N, V] (t counts up from 0, one call per step), shaped and typed as `like`."""
        if self.drawn is None or t >= self.start + len(self.drawn):
            vocab, groups = like.shape[-1], len(self.gen)
            window, size = max(1, min(self.max_tokens - t, NOISE_WINDOW // vocab)), self.group_size
            race = torch.empty((groups * window * size, vocab), dtype=like.dtype, device=like.device)
            for i, (g, _, _) in enumerate(self.gen):
                race[i * window * size : (i + 1) * window * size].exponential_(1, generator=g)
            drawn = race.view(groups, window, size, vocab).transpose(0, 1).reshape(window, groups * size, vocab)
            self.drawn = drawn if self.rows is None else drawn[:, self.rows.to(drawn.device)]
            self.start = t
        return self.drawn[t - self.start]


TOKEN_STRIDE = 0x9E3779B97F4A7C15
"""Mixes a row's seed with a token index (`RowNoise`): the golden ratio's 64-bit constant, as splitmix64 steps by."""


class RowNoise:
    """The exponential race's noise (`multinomial`) of partial rollouts: row n's token at index offsets[n] + t drawn
    from a generator seeded by (seeds[n], offsets[n] + t) alone, so a row's draws do not depend on where its sampling
    was cut into segments, nor on the other rows it was decoded with."""

    def __init__(self, seeds: list[int], offsets: list[int]) -> None:
        self.seeds, self.offsets = seeds, offsets

    def keep(self, rows: list[int]) -> None:
        """These rows only, in this order (the others left the batch)."""
        self.seeds, self.offsets = [self.seeds[r] for r in rows], [self.offsets[r] for r in rows]

    def at(self, t: int, like: Tensor) -> Tensor:
        gen = torch.Generator(device=like.device)
        out = torch.empty_like(like)
        for n, (seed, offset) in enumerate(zip(self.seeds, self.offsets, strict=True)):
            gen.manual_seed((seed + (offset + t) * TOKEN_STRIDE) % 2**63)
            out[n].exponential_(1, generator=gen)
        return out


def multinomial(probs_N_V: Tensor, noise: Noise | RowNoise, t: int) -> Tensor:
    """One draw per row, [N, 1], by the exponential race: argmax(p / E), E ~ Exp(1) (torch.multinomial's own rule
    for one draw, which it equals draw for draw), E step t's `noise`."""
    if not bool(torch.isfinite(probs_N_V).all()):
        raise RuntimeError("probability tensor contains either inf or nan: the policy's logits are not finite")
    return (probs_N_V / noise.at(t, probs_N_V)).argmax(-1, keepdim=True)


def draw(logits_N_V: Tensor, params: SamplingParams, noise: Noise | RowNoise, t: int, with_entropy: bool):
    """Decoding step t: (token [N], logprob [N], entropy [N] or the logprob tensor as a placeholder)."""
    logp_N_V = torch.log_softmax(logits_N_V / max(params.temperature, 1e-7), dim=-1)
    if params.temperature == 0:
        token = logp_N_V.argmax(-1)
    else:
        probs = logp_N_V.exp()
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) > params.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            choice = multinomial(sorted_p, noise, t)
            token = order.gather(-1, choice).squeeze(-1)
        else:
            token = multinomial(probs, noise, t).squeeze(-1)
    logp = logp_N_V.gather(-1, token[:, None]).squeeze(-1)
    entropy = -(logp_N_V.exp() * logp_N_V).nan_to_num().sum(-1) if with_entropy else logp
    return token, logp, entropy


class MergedLora:
    """A plain (PEFT-free) copy of a LoRA-wrapped model whose adapted Linears hold W0 + s·B·A.

    Only the adapted Linear weights are new tensors; embeddings, norms, the head and every other
    parameter or buffer are shared with the live model.
    """

    def __init__(self, plain: nn.Module, pairs: list[tuple[Any, Any]]) -> None:
        self.plain = plain.eval()
        self.pairs = pairs
        """(LoRA layer in the live model, merged Linear in the copy): PEFT's attributes are typed loosely."""

    @classmethod
    def of(cls, policy: nn.Module) -> MergedLora | None:
        """None when there is nothing to merge (no PEFT LoRA), it cannot be merged exactly (non-Linear
        base layers, DoRA, several active adapters) or the policy is sharded (FSDP modules cannot be copied)."""
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(policy, PeftModel) or isinstance(policy, FSDPModule):
            return None
        base = policy.get_base_model()
        layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        for m in layers.values():
            if not isinstance(m.base_layer, torch.nn.Linear) or len(m.active_adapters) != 1 or any(m.use_dora.values()):
                return None
        adapted = {id(m.base_layer.weight) for m in layers.values()}
        shared = {id(t): t for t in [*base.parameters(), *base.buffers()] if id(t) not in adapted}
        plain = copy.deepcopy(base, memo=shared)
        pairs: list[tuple[Any, Any]] = []
        for name, live in layers.items():
            parent, _, child = name.rpartition(".")
            merged: Any = plain.get_submodule(name).base_layer
            setattr(plain.get_submodule(parent) if parent else plain, child, merged)
            merged.weight.requires_grad_(False)
            pairs.append((live, merged))
        return cls(plain, pairs)

    @no_grad
    def refresh(self) -> nn.Module:
        for live, merged in self.pairs:
            name = live.active_adapters[0]
            A, B = live.lora_A[name].weight, live.lora_B[name].weight
            delta = B.float() @ A.float()
            if live.fan_in_fan_out:
                delta = delta.T
            # torch.add, not add_: for fp32 weights .float() is W0 itself, which must stay untouched
            merged.weight.copy_(torch.add(live.base_layer.weight.float(), delta, alpha=live.scaling[name]))
        return self.plain
