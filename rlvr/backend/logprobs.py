"""Reading the sampled tokens' log-probabilities (and entropies) from a causal LM, as the trainer and the engines that
rescore (engine=vllm with top-p < 1) both read them: rows padded side by side (`padded_rows`, the layout the engines
decode in) or packed end to end (rlvr/backend/local.py), and the LM head applied at the scored positions alone, a
chunk at a time (rlvr/backend/lm_head.py), when the model's logits are its plain head's output (`head_is_plain`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from rlvr.backend.lm_head import token_logprobs
from rlvr.lazy import lazy_import, no_grad
from rlvr.types import TeacherScores

if TYPE_CHECKING:
    from torch import Tensor, nn
    from transformers import PreTrainedModel

torch = lazy_import("torch")

LOGIT_CHUNK = 2**28
"""float32 logit elements materialised at once by `logits_logprobs` (a head that is not plain): 1 GiB."""


@contextmanager
def forward_replaced(module: nn.Module, forward: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """`module`'s forward is `forward` inside the block (an instance attribute, removed after)."""
    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.forward


@no_grad
def head_is_plain(model: nn.Module, inputs: Mapping[str, Any]) -> bool:
    """Whether the model's logits are its bias-free linear head applied to the final hidden states and nothing more
    (Llama, Qwen, Mistral …; not Gemma 2's soft-capped logits, Cohere's scaled ones): one forward pass of `inputs`
    for the last position, the head's own output compared with the model's (to 4 units in the last place)."""
    head = cast("PreTrainedModel", model).get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    raw: list[Tensor] = []
    linear = head.forward

    def recorded(x: Tensor) -> Tensor:
        raw.append(linear(x))
        return raw[-1]

    with forward_replaced(head, recorded):
        logits = model(**inputs, logits_to_keep=1).logits
    eps = torch.finfo(logits.dtype).eps
    return torch.allclose(raw[0].float(), logits.float(), rtol=4 * eps, atol=4 * eps)


def logits_logprobs(logits_K_V: Tensor, targets_K: Tensor, temperature: float, with_entropy: bool = False,
                    support_K_S: Tensor | None = None) -> tuple[Tensor | None, ...]:
    """([K] log softmax(logits / T)[target], [K] entropy or None) in float32, a slice of positions at a time: a
    150k-token vocabulary never has its whole [K, V] float32 log-softmax in memory at once (≤ LOGIT_CHUNK elements).
    With `support_K_S`, also [K, S] the log-probabilities of those tokens (a third entry)."""
    step = max(1, LOGIT_CHUNK // max(1, logits_K_V.shape[-1]))
    empty = logits_K_V.new_zeros((0,), dtype=torch.float32)
    width = 0 if support_K_S is None else support_K_S.shape[1]
    logp, entropy, support = [empty], [empty], [empty.new_zeros((0, width))]
    for k in range(0, logits_K_V.shape[0], step):
        logp_c_V = torch.log_softmax(logits_K_V[k : k + step].float() / max(temperature, 1e-7), dim=-1)
        logp.append(logp_c_V.gather(-1, targets_K[k : k + step, None]).squeeze(-1))
        if with_entropy:
            entropy.append(-(logp_c_V.exp() * logp_c_V).sum(-1))
        if support_K_S is not None:
            support.append(logp_c_V.gather(-1, support_K_S[k : k + step]))
    out = (torch.cat(logp), torch.cat(entropy) if with_entropy else None)
    return out if support_K_S is None else (*out, torch.cat(support))


def padded_rows(prompts: list[list[int]], tokens_N_T: Tensor, mask_N_T: Tensor, pad_id: int, Lp: int | None = None):
    """input ids [N, Lp+T] (row i = prompts[i] left-padded with `pad_id` to Lp, by default the longest prompt's
    length, then its completion), attention mask, and Lp: the layout the engines decode in."""
    Lp = max((len(p) for p in prompts), default=0) if Lp is None else Lp
    prompt = torch.full((len(prompts), Lp), pad_id, dtype=torch.long)
    prompt_attn = torch.zeros((len(prompts), Lp), dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt[i, Lp - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_attn[i, Lp - len(p) :] = 1
    return torch.cat([prompt, tokens_N_T], 1), torch.cat([prompt_attn, mask_N_T.long()], 1), Lp


def padded_logprobs(model: nn.Module, ids: Tensor, attn: Tensor, Lp: int, tokens_N_T: Tensor, temperature: float,
                    with_entropy: bool = False, scored_N_T: Tensor | None = None, support_N_T_K: Tensor | None = None):
    """[n, T] log-probabilities of the completion tokens of padded rows (`padded_rows`, on the model's device) under
    the temperature-scaled policy; 0 where the completion is padding. Position ids count each row's real tokens from
    0, as the engine decoded them; the logits at position Lp−1+t predict completion token t. With `with_entropy`,
    (log-probs, entropies of the same distributions). With `scored_N_T` (bool [n, T], real tokens only) the head is
    applied at those positions alone and the others read 0. With `support_N_T_K` (token ids), (log-probs, entropies
    or None, [n, T, K] the log-probabilities of those tokens at each position): `position_logprobs`."""
    n, T = tokens_N_T.shape
    if Lp < 1 and n:
        raise ValueError("a row with an empty prompt has no position to predict its first token")
    position = (attn.cumsum(-1) - 1).clamp(min=0)
    scored = attn[:, Lp:].bool() if scored_N_T is None else scored_N_T.to(attn.device)
    row, t = scored.nonzero(as_tuple=True)
    support = None if support_N_T_K is None else support_N_T_K.to(ids.device)[row, t]
    return scatter(position_logprobs(model, ids, attn, position, row, Lp - 1 + t, tokens_N_T.to(ids.device)[row, t],
                                     temperature, with_entropy, support), n, T, row, t)


PLAIN_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Model → whether its head is plain (`head_is_plain`), found on its first pass."""


def position_logprobs(model: nn.Module, ids: Tensor, attn: Tensor | None, position: Tensor, row: Tensor, at: Tensor,
                      targets: Tensor, temperature: float, with_entropy: bool, support_K_S: Tensor | None = None
                      ) -> tuple[Tensor | None, ...]:
    """[K] log p(targets[k]) under softmax(logits[row[k], at[k]] / T), in float32, from one forward pass of `model`
    (and the entropy of that distribution, with `with_entropy`).

    With a plain head (`PLAIN_HEADS`) the LM head's own forward is swapped, for this pass, for one that applies it
    to the K positions alone, a chunk at a time (`lm_head.token_logprobs`, recomputed in backward): no logits exist
    for the other positions (prompts, padding) and never [K, V] for all K at once. It runs inside the model's
    forward and its result is the model's output, so a sharded model (backend=fsdp) has the head's weight gathered
    when it is read, in forward and in backward, as for the logits it replaces.

    With `support_K_S` (token ids, [K, S]: distill.estimator=full's teacher top-k), (log-probs, entropies or None,
    [K, S] the log-probabilities of those tokens), all from the model's own logits at the K positions: [K, V] float32
    logits and their log-softmax are held at once (the micro-batch bounds K), as for a head that is not plain."""
    row, at = row.to(ids.device), at.to(ids.device)
    inputs = {"input_ids": ids, "attention_mask": attn, "position_ids": position, "use_cache": False}
    if support_K_S is not None:
        return logits_logprobs(model(**inputs).logits[row, at], targets, temperature, with_entropy, support_K_S)
    if model not in PLAIN_HEADS:
        PLAIN_HEADS[model] = head_is_plain(model, inputs)
    if not PLAIN_HEADS[model]:
        return logits_logprobs(model(**inputs).logits[row, at], targets, temperature, with_entropy)
    head = cast("PreTrainedModel", model).get_output_embeddings()

    def logprobs(hidden_B_L_H: Tensor) -> Tensor:
        logp, entropy = token_logprobs(hidden_B_L_H[row, at], head.weight, targets, temperature,
                                       with_entropy=with_entropy)
        return logp if entropy is None else torch.stack([logp, entropy])

    with forward_replaced(head, logprobs):
        out = model(**inputs, logits_to_keep=0).logits
    return (out[0], out[1]) if with_entropy else (out, None)


def scatter(flat: tuple[Tensor | None, ...], n: int, T: int, row: Tensor, t: Tensor):
    """The K flat values back at their (row, t) of [n, T] (of [n, T, S] for [K, S] values), 0 elsewhere: the
    log-probabilities alone, (log-probs, entropies) when both came, and every entry (None kept) of a longer tuple."""
    out: list[Tensor | None] = []
    for values in flat:
        if values is None:
            out.append(None)
            continue
        placed = values.new_zeros((n, T, *values.shape[1:]))
        placed[row.to(values.device), t.to(values.device)] = values
        out.append(placed)
    if len(out) > 2:
        return tuple(out)
    return out[0] if out[1] is None else (out[0], out[1])


def score_rows(model: nn.Module, prompts: Sequence[Sequence[int]], completions_N_T: Tensor, lengths: Sequence[int],
               topk: int, batch_rows: int, temperature: float = 1.0) -> TeacherScores:
    """`model`'s scores of N rows (`Teacher.score`), in no-grad passes of `batch_rows` (≥ 1) rows, each row its prompt
    then its completion, right-padded: log-softmax(logits / `temperature`) at the position before each completion token,
    of that token and, with `topk` = k ≥ 1, of the k most likely (all of them when the vocabulary is smaller)."""
    device = next(model.parameters()).device
    N, T = completions_N_T.shape
    lp = torch.zeros(N, T)
    ids = top = None
    with torch.no_grad():
        for a in range(0, N, batch_rows):
            rows = range(a, min(a + batch_rows, N))
            seqs = [list(prompts[i]) + completions_N_T[i, :lengths[i]].tolist() for i in rows]
            width = max(len(s) for s in seqs)
            input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
            attention = torch.zeros(len(seqs), width, dtype=torch.long)
            for j, s in enumerate(seqs):
                input_ids[j, :len(s)] = torch.tensor(s)
                attention[j, :len(s)] = 1
            logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
            logp = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
            if topk and ids is None:
                k = min(topk, logp.shape[-1])
                ids, top = torch.zeros(N, T, k, dtype=torch.long), torch.zeros(N, T, k)
            for j, i in enumerate(rows):
                at = len(prompts[i]) - 1 + torch.arange(lengths[i])  # the position before each completion token
                lp[i, :lengths[i]] = logp[j, at].gather(-1, completions_N_T[i, :lengths[i], None]).squeeze(-1)
                if ids is not None and top is not None:
                    values, indices = logp[j, at].topk(ids.shape[-1], dim=-1)
                    top[i, :lengths[i]], ids[i, :lengths[i]] = values, indices
    return TeacherScores(lp, ids, top)
