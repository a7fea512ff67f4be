"""A language-model head that never holds every logit (docs/memory.md#the-chunked-lm-head).

`token_logprobs(hidden_K_H, weight_V_H, targets_K, T)` gives, for K flat token positions (final hidden states
after the model's final norm, already gathered), the float32 log-probability of each target under

    p = softmax(z),  z = h·Wᵀ / max(T, 1e-7)          (a bias-free head, W [V, H], maybe tied with the embedding)

and, with `with_entropy=True`, the entropy H = −Σ p log p = lse(z) − Σ p z of the same distribution. It is one
`torch.autograd.Function` that walks K a chunk of `chunk_tokens` positions at a time:

* forward: the chunk's logits [chunk, V] in float32, their max and log Σ exp(z − max) (kept: 2 floats a token),
  log p = z − max − log Σ exp(z − max) as log_softmax computes it (the target's is gathered) and, with the
  entropy, p and H = −Σ p log p (kept). The chunk's logits are then dropped; what backward keeps is the inputs
  (references, no copy) and 2 or 3 floats a token.
* backward recomputes each chunk's log p by the same operations and, with g the upstream gradients,

      ∂L/∂z = g_logp · (onehot(target) − p) − g_H · p ⊙ (log p + H)
      ∂L/∂logits = ∂L/∂z / T,   ∂L/∂h = (∂L/∂logits) · W,   ∂L/∂W += (∂L/∂logits)ᵀ · h

  (∂H/∂z = −p ⊙ (z − Σ p z), and z − Σ p z = log p + H), summing ∂L/∂W over the chunks in float32. A gradient goes
  only to an input that needs one (`needs_input_grad`): a frozen head (LoRA) costs no [V, H] accumulator and no
  second matmul. Gradients come back in each input's dtype (bf16 weight → bf16 gradient, rounded once at the end);
  a tied weight gets the head's gradient from this Function and the embedding's from its own op, and autograd
  adds them into the one parameter.

The softmax's math is float32 whatever the inputs' dtype (float64 if one is float64, for `gradcheck`). A chunk's
logits are computed as the model's own head computes them: in the inputs' dtype when hidden and weight share one (a
bf16 model's logits rounded to bf16 as its plain path rounds them, then upcast: no float32 copy of the weight), and
∂L/∂h is a matmul in the weight's dtype, as autograd through the model's head does it. Peak memory beyond the
inputs and the outputs is thus, whatever K is,

    chunk · V · 4 bytes for log p alone (the exponential is taken in place), twice that with the entropy (p, log p)
      + V·H·4 bytes in backward (the float32 ∂L/∂W, when the weight needs a gradient)

against K·V·4 bytes and several more of that size when every logit is materialised. The default chunk is
CHUNK_ELEMENTS // V tokens: 2²⁶ float32 logits, 256 MiB — 441 tokens at Qwen's V = 151,936; at a tiny vocabulary
all of K is one chunk. Fewer tokens per chunk means smaller, less efficient matmuls; 441 rows keep them well fed
on a GPU. The cost in time is one more head matmul (backward recomputes the logits); no more exponentials. Second
derivatives are not provided (a policy loss needs none).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor
    from torch import dtype as DType

torch = lazy_import("torch")

CHUNK_ELEMENTS = 2**26
"""Float32 logits per chunk when `chunk_tokens` is not given: 256 MiB (441 tokens at V = 151,936)."""

MIN_TEMPERATURE = 1e-7
"""z = logits / max(T, MIN_TEMPERATURE), as the plain path (rlvr/backend/local.py) divides."""


def default_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk so that a chunk's float32 logits are CHUNK_ELEMENTS (at least 1 token)."""
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def token_logprobs(
    hidden_K_H: Tensor,
    weight_V_H: Tensor,
    targets_K: Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(log p(target) [K], entropy [K] or None), float32, under softmax(hidden · weightᵀ / max(T, 1e-7)), never
    holding more than `chunk_tokens` positions' logits at once (default `default_chunk_tokens(V)`); differentiable
    with respect to `hidden_K_H` and `weight_V_H` (those that require grad)."""
    if hidden_K_H.dim() != 2 or weight_V_H.dim() != 2 or hidden_K_H.shape[1] != weight_V_H.shape[1]:
        raise ValueError(f"hidden [K, H] and weight [V, H] do not fit: {tuple(hidden_K_H.shape)} and "
                         f"{tuple(weight_V_H.shape)}")
    if tuple(targets_K.shape) != (hidden_K_H.shape[0],):
        raise ValueError(f"targets must be [K] = [{hidden_K_H.shape[0]}], got {tuple(targets_K.shape)}")
    if weight_V_H.shape[0] == 0:
        raise ValueError("the vocabulary is empty (weight [0, H])")
    chunk = default_chunk_tokens(weight_V_H.shape[0]) if chunk_tokens is None else chunk_tokens
    if chunk < 1:
        raise ValueError(f"chunk_tokens must be ≥ 1, got {chunk_tokens}")
    targets = targets_K.to(device=hidden_K_H.device, dtype=torch.long)
    out = _chunked_head().apply(hidden_K_H, weight_V_H, targets, float(temperature), with_entropy, chunk)
    return (out[0], out[1]) if with_entropy else (out, None)


def math_dtype(hidden: Tensor, weight: Tensor) -> DType:
    """float32, or float64 when an input is float64 (`torch.autograd.gradcheck` differentiates numerically)."""
    return torch.promote_types(torch.float32, torch.promote_types(hidden.dtype, weight.dtype))


def head_logits(hidden_c_H: Tensor, weight_V_H: Tensor, dtype: DType) -> Tensor:
    """A chunk's logits [c, V] in `dtype`, computed as the model's own head computes them: in the inputs' dtype when
    they share one (bf16 logits rounded as the plain path rounds them, then upcast; no float32 copy of the weight),
    else both upcast."""
    if hidden_c_H.dtype == weight_V_H.dtype:
        return torch.mm(hidden_c_H, weight_V_H.T).to(dtype)
    return torch.mm(hidden_c_H.to(dtype), weight_V_H.to(dtype).T)


@functools.cache
def _chunked_head() -> Any:
    """The autograd Function, built on first use so that importing this module does not import torch."""

    function: Any = torch.autograd.Function

    class ChunkedHead(function):
        @staticmethod
        def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                    with_entropy: bool, chunk: int) -> Any:
            t = max(temperature, MIN_TEMPERATURE)
            K, dtype = hidden.shape[0], math_dtype(hidden, weight)
            logp = torch.empty(K, dtype=dtype, device=hidden.device)
            z_max, log_sum = torch.empty_like(logp), torch.empty_like(logp)  # logsumexp(z) = z_max + log_sum
            entropy = torch.empty_like(logp) if with_entropy else None
            for s in range(0, K, chunk):
                e = min(s + chunk, K)
                shifted = head_logits(hidden[s:e], weight, dtype).div_(t)  # z
                z_max[s:e] = shifted.amax(-1)
                shifted.sub_(z_max[s:e, None])  # z − max; log p = z − max − log Σ exp(z − max), as log_softmax
                if entropy is None:  # one [chunk, V] buffer: exp in place once the target's z − max is read
                    target_shifted = shifted.gather(-1, targets[s:e, None]).squeeze(-1)
                    log_sum[s:e] = shifted.exp_().sum(-1).log_()
                    logp[s:e] = target_shifted - log_sum[s:e]
                else:  # two: p and log p
                    exp_c_V = shifted.exp()
                    sum_exp = exp_c_V.sum(-1)
                    log_sum[s:e] = sum_exp.log()
                    logp_c_V = shifted.sub_(log_sum[s:e, None])
                    logp[s:e] = logp_c_V.gather(-1, targets[s:e, None]).squeeze(-1)
                    entropy[s:e] = exp_c_V.div_(sum_exp[:, None]).mul_(logp_c_V).sum(-1).neg_()
                    del exp_c_V, logp_c_V
                del shifted
            ctx.temperature, ctx.chunk, ctx.with_entropy = t, chunk, with_entropy
            ctx.set_materialize_grads(False)
            if entropy is None:
                ctx.save_for_backward(hidden, weight, targets, z_max, log_sum)
                return logp
            ctx.save_for_backward(hidden, weight, targets, z_max, log_sum, entropy)
            return logp, entropy

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, g_logp: Tensor | None, g_entropy: Tensor | None = None) -> tuple[Tensor | None, ...]:
            hidden, weight, targets, z_max, log_sum, *saved = ctx.saved_tensors
            entropy = saved[0] if ctx.with_entropy else None
            need_hidden, need_weight = ctx.needs_input_grad[:2]
            nothing = (None,) * 6
            if (g_logp is None and g_entropy is None) or not (need_hidden or need_weight):
                return nothing
            t, chunk, K, dtype = ctx.temperature, ctx.chunk, hidden.shape[0], math_dtype(hidden, weight)
            grad_hidden = torch.empty_like(hidden) if need_hidden else None
            grad_weight_up = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
            for s in range(0, K, chunk):
                e = min(s + chunk, K)
                # the forward's log p, recomputed by the same operations
                logp_c_V = head_logits(hidden[s:e], weight, dtype).div_(t).sub_(z_max[s:e, None])
                logp_c_V.sub_(log_sum[s:e, None])
                # ∂L/∂z = g_logp · (onehot − p) − g_H · p ⊙ (log p + H)
                if g_entropy is not None and entropy is not None:  # two [chunk, V] buffers: p and log p
                    p = logp_c_V.exp()
                    dz = logp_c_V.add_(entropy[s:e, None]).mul_(g_entropy[s:e, None])
                    if g_logp is not None:
                        dz.add_(g_logp[s:e, None])
                    dz.mul_(p).neg_()
                    del p  # freed before the matmuls
                else:  # one: p in place of log p
                    assert g_logp is not None
                    dz = logp_c_V.exp_().mul_(g_logp[s:e, None].neg())
                del logp_c_V  # dz holds the buffer
                if g_logp is not None:
                    dz.scatter_add_(-1, targets[s:e, None], g_logp[s:e, None])
                dz.div_(t)  # ∂z/∂logits = 1/T
                if grad_hidden is not None:  # in the weight's dtype, as autograd through the model's head
                    grad_hidden[s:e] = torch.mm(dz.to(weight.dtype), weight)
                if grad_weight_up is not None:
                    grad_weight_up.addmm_(dz.T, hidden[s:e].to(dtype))
                del dz
            grad_weight = None if grad_weight_up is None else grad_weight_up.to(weight.dtype)
            return grad_hidden, grad_weight, None, None, None, None

    return ChunkedHead
