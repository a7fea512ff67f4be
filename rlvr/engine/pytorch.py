"""`engine=pytorch`: batched sampling in the training process, from the very module the backend trains.

Each prompt is repeated G times, rows are left-padded, and decoding runs with a KV cache one token per
step for all rows at once, until every row has emitted an EOS id or `max_tokens` is reached. At each
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

Sampling draws from a `torch.Generator` seeded per call, so a run's rollouts depend on (seed, step) and
the weights alone. Given one seed per prompt instead (a distributed run, rlvr/distributed.py), each group
draws from its own generator, so a group's completions do not depend on which other groups share the batch
(nor on how many processes share the step).

Weights: under LoRA with `merge_lora: true`, the engine samples from a plain copy of the model in which
every adapted Linear holds W0 + s·B·A, refreshed by `sync` after each optimizer step (one addmm per
adapted layer). Decoding then runs no PEFT wrapper code, which on the tiny model is half of each decode
forward; the price is a second copy of the adapted weights (all other weights are shared, not copied).
With `merge_lora: false`, under full fine-tuning, or from a policy sharded by backend=fsdp (which cannot be
copied), the engine samples from the backend's module itself and `sync` has nothing to copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import, no_grad
from rlvr.protocols import Needs
from rlvr.types import Rollouts, SamplingParams

if TYPE_CHECKING:
    from torch import Generator, Tensor, nn

    Generators = Generator | list[tuple[Generator, slice]]
    """One generator for every row of a chunk, or (generator, rows) per group the chunk holds."""

torch = lazy_import("torch")
transformers = lazy_import("transformers")


class PyTorchEngine:

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"entropy", "group_seeds"}),
                     requires={"local_policy": "it samples from the trained module in this process"})

    def __init__(self, module: nn.Module, eos_ids: list[int], pad_id: int, max_batch_rows: int, merge_lora: bool):
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.max_batch_rows = max_batch_rows
        """Rows decoded together; larger requests are processed in chunks of this many rows."""
        self.merged = MergedLora.of(module) if merge_lora else None
        self.sync(module)

    def connect(self) -> None:
        """Nothing to reach: the engine is ready once built."""

    def sync(self, policy: nn.Module) -> None:
        self.module = self.merged.refresh() if self.merged is not None else policy

    @no_grad
    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int | Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        rows = [ids for ids in prompt_ids_P for _ in range(group_size)]
        device = next(self.module.parameters()).device
        if isinstance(seed, int):
            gen = torch.Generator(device=device).manual_seed(seed)
            chunk_gen = lambda start, stop: gen  # noqa: E731 - one stream for every row
        else:
            if len(seed) != len(prompt_ids_P):
                raise ValueError(f"{len(seed)} seeds for {len(prompt_ids_P)} prompts: give one per prompt")
            gens = [torch.Generator(device=device).manual_seed(s) for s in seed]

            def chunk_gen(start: int, stop: int) -> list[tuple[torch.Generator, slice]]:
                """(generator, its rows within the chunk) for each group that rows start..stop−1 touch."""
                return [(gens[p], slice(max(p * group_size, start) - start, min((p + 1) * group_size, stop) - start))
                        for p in range(start // group_size, (stop - 1) // group_size + 1)]
        was_training = self.module.training
        if was_training:
            self.module.eval()
        try:
            chunks = [
                self._decode(rows[i : i + self.max_batch_rows], params,
                             chunk_gen(i, min(i + self.max_batch_rows, len(rows))), with_entropy, device)
                for i in range(0, len(rows), self.max_batch_rows)
            ]
        finally:
            if was_training:
                self.module.train()
        T = max(c[0].shape[1] for c in chunks)

        def cat(i: int, fill: float | int) -> Tensor:
            return torch.cat([torch.nn.functional.pad(c[i], (0, T - c[i].shape[1]), value=fill) for c in chunks]).cpu()

        return Rollouts(
            prompt_ids_P=prompt_ids_P,
            group_size=group_size,
            tokens_PG_T=cat(0, self.pad_id),
            logprobs_PG_T=cat(1, 0.0),
            mask_PG_T=cat(2, False),
            finished_PG=torch.cat([c[3] for c in chunks]).cpu(),
            temperature=params.temperature,
            entropy_PG_T=cat(4, 0.0) if with_entropy else None,
        )

    def _decode(
        self, rows: list[list[int]], params: SamplingParams, gen: Generators, with_entropy: bool, device
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        N, L = len(rows), max(len(r) for r in rows)
        input_ids = torch.full((N, L), self.pad_id, dtype=torch.long, device=device)
        attn = torch.zeros((N, L), dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            input_ids[i, L - len(r) :] = torch.tensor(r, device=device)
            attn[i, L - len(r) :] = 1
        position = (attn.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(self.eos_ids, device=device)
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        tokens, logprobs, masks, entropies = [], [], [], []
        cache = transformers.DynamicCache()
        out = self.module(
            input_ids=input_ids, attention_mask=attn, position_ids=position, past_key_values=cache,
            use_cache=True, logits_to_keep=1,
        )
        next_pos = position[:, -1:] + 1
        for _ in range(params.max_tokens):
            token, logp, entropy = draw(out.logits[:, -1].float(), params, gen, with_entropy)
            alive = ~finished
            token = torch.where(alive, token, self.pad_id)
            tokens.append(token)
            logprobs.append(torch.where(alive, logp, 0.0))
            masks.append(alive)
            entropies.append(torch.where(alive, entropy, 0.0) if with_entropy else logp)
            finished = finished | torch.isin(token, eos)
            if bool(finished.all()):
                break
            attn = torch.cat([attn, torch.ones((N, 1), dtype=attn.dtype, device=device)], dim=1)
            out = self.module(
                input_ids=token[:, None], attention_mask=attn, position_ids=next_pos, past_key_values=cache,
                use_cache=True,
            )
            next_pos = next_pos + 1
        if not tokens:  # max_tokens == 0 is rejected by validation; keep shapes sane anyway
            empty = torch.zeros((N, 0), device=device)
            return empty.long(), empty, empty.bool(), finished, empty
        return (
            torch.stack(tokens, 1),
            torch.stack(logprobs, 1),
            torch.stack(masks, 1),
            finished,
            torch.stack(entropies, 1),
        )


def multinomial(probs_N_V: Tensor, gen: Generators) -> Tensor:
    """One draw per row, [N, 1]: from one generator, or from each group's own over its rows."""
    if isinstance(gen, list):
        return torch.cat([torch.multinomial(probs_N_V[rows], 1, generator=g) for g, rows in gen])
    return torch.multinomial(probs_N_V, 1, generator=gen)


def draw(logits_N_V: Tensor, params: SamplingParams, gen: Generators, with_entropy: bool):
    """One decoding step: (token [N], logprob [N], entropy [N] or the logprob tensor as a placeholder)."""
    logp_N_V = torch.log_softmax(logits_N_V / max(params.temperature, 1e-7), dim=-1)
    if params.temperature == 0:
        token = logp_N_V.argmax(-1)
    else:
        probs = logp_N_V.exp()
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) > params.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            choice = multinomial(sorted_p, gen)
            token = order.gather(-1, choice).squeeze(-1)
        else:
            token = multinomial(probs, gen).squeeze(-1)
    logp = logp_N_V.gather(-1, token[:, None]).squeeze(-1)
    entropy = -(logp_N_V.exp() * logp_N_V).nan_to_num().sum(-1) if with_entropy else logp
    return token, logp, entropy


class MergedLora:
    """A plain (PEFT-free) copy of a LoRA-wrapped model whose adapted Linears hold W0 + s·B·A.

    Only the adapted Linear weights are new tensors; embeddings, norms, the head and every other
    parameter or buffer are shared with the live model.
    """

    def __init__(self, plain: nn.Module, pairs: list[tuple[nn.Module, nn.Linear]]) -> None:
        self.plain = plain.eval()
        self.pairs = pairs
        """(LoRA layer in the live model, merged Linear in the copy)."""

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
        pairs = []
        for name, live in layers.items():
            parent, _, child = name.rpartition(".")
            merged = plain.get_submodule(name).base_layer
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
