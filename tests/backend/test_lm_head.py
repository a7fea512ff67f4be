"""rlvr/backend/lm_head.py: log p(target) and the entropy of softmax(h·Wᵀ / T), chunk by chunk over the tokens, equal
in value and gradient to the plain path that materialises every logit (docs/memory.md#the-chunked-lm-head)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from rlvr.backend.lm_head import default_chunk_tokens, token_logprobs

LN2 = math.log(2.0)


def assert_within(got, want, tol=1e-6):
    """|got − want| ≤ tol · max(1, max |want|). Two float32 evaluations that sum in different orders (one [K, V] matmul
    against chunks of it, a gradient accumulated chunk by chunk) differ by a few ulps of the largest entry. Measured
    over 26,000 draws of these sizes, relative to max(1, max |float64 value|): log p and the entropy of either head are
    within 5e-7 of float64 and of each other; the gradients of the plain head within 1.3e-6 of float64, those of the
    chunked one within 1.6e-6, and of each other within 1.7e-6, hence GRAD_TOL. In float64 the heads agree to 1e-12."""
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=tol * scale, rtol=0)


GRAD_TOL = 2e-6


def plain(hidden_K_H, weight_V_H, targets_K, temperature):
    """The reference: every logit [K, V] at once, log_softmax, gather; the entropy from the full softmax (in float32,
    or float64 for float64 inputs)."""
    dtype = torch.promote_types(torch.float32, torch.promote_types(hidden_K_H.dtype, weight_V_H.dtype))
    z = (hidden_K_H.to(dtype) @ weight_V_H.to(dtype).T) / max(temperature, 1e-7)
    logp_K_V = torch.log_softmax(z, dim=-1)
    logp = logp_K_V.gather(-1, targets_K[:, None]).squeeze(-1)
    entropy = -(logp_K_V.exp() * logp_K_V).sum(-1)
    return logp, entropy


def test_one_token_three_words_by_hand():
    # H = 1, V = 3, T = 2: h = [2 ln 2], W = [[0], [0], [1]]
    #   → logits h·Wᵀ = [0, 0, 2 ln 2], z = logits / T = [0, 0, ln 2]
    #   lse = log(e⁰ + e⁰ + e^{ln 2}) = log 4 = 2 ln 2 → p = [1/4, 1/4, 1/2]
    #   target 2: log p = ln 2 − 2 ln 2 = −ln 2
    #   entropy = −(2 · ¼ · log ¼ + ½ · log ½) = ln 2 + ½ ln 2 = 1.5 ln 2
    # d log p / dz = onehot − p = [−1/4, −1/4, 1/2]
    #   d/dh = Σ_v (d/dz_v) · W_v / T = ½ · 1 / 2 = 1/4
    #   d/dW_v = (d/dz_v) · h / T = [−1/4, −1/4, 1/2] · ln 2
    # dH/dz = −p ⊙ (z − Σ p z), Σ p z = ½ ln 2 → −[¼ · (−½ ln 2), ¼ · (−½ ln 2), ½ · (½ ln 2)] = [1/8, 1/8, −1/4] · ln 2
    #   d/dh = −¼ ln 2 · 1 / 2 = −ln 2 / 8;   d/dW_v = (dH/dz_v) · h / T = [1/8, 1/8, −1/4] · ln 2 · ln 2
    def fresh():
        h = torch.tensor([[2 * LN2]], requires_grad=True)
        w = torch.tensor([[0.0], [0.0], [1.0]], requires_grad=True)
        return h, w

    h, w = fresh()
    logp, entropy = token_logprobs(h, w, torch.tensor([2]), 2.0, with_entropy=True)
    torch.testing.assert_close(logp, torch.tensor([-LN2]))
    torch.testing.assert_close(entropy, torch.tensor([1.5 * LN2]))
    logp.sum().backward()
    torch.testing.assert_close(h.grad, torch.tensor([[0.25]]))
    torch.testing.assert_close(w.grad, torch.tensor([[-0.25], [-0.25], [0.5]]) * LN2)

    h, w = fresh()
    _, entropy = token_logprobs(h, w, torch.tensor([2]), 2.0, with_entropy=True)
    entropy.sum().backward()
    torch.testing.assert_close(h.grad, torch.tensor([[-LN2 / 8]]))
    torch.testing.assert_close(w.grad, torch.tensor([[0.125], [0.125], [-0.25]]) * LN2 * LN2)


@st.composite
def cases(draw):
    K = draw(st.integers(0, 40))
    V = draw(st.integers(1, 48))
    H = draw(st.integers(1, 12))
    chunk = draw(st.one_of(st.none(), st.integers(1, 48)))
    temperature = draw(st.sampled_from([1.0, 0.6, 1.7]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(K, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) / math.sqrt(H)
    targets = torch.randint(0, V, (K,), generator=gen)
    upstream = torch.randn(2, K, generator=gen)
    return hidden, weight, targets, temperature, chunk, upstream


def grads(fn, hidden, weight, targets, temperature, mix):
    """(log p, entropy, ∂loss/∂hidden, ∂loss/∂weight) for loss = Σ mix[0]·log p + Σ mix[1]·entropy."""
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp, entropy = fn(h, w, targets, temperature)
    loss = (mix[0] * logp).sum() + (mix[1] * entropy).sum()
    if loss.requires_grad:
        loss.backward()
    return logp.detach(), entropy.detach(), h.grad, w.grad


def case_of(K, V, H, chunk, temperature, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(K, H, generator=gen), torch.randn(V, H, generator=gen) / math.sqrt(H),
            torch.randint(0, V, (K,), generator=gen), temperature, chunk, torch.randn(2, K, generator=gen))


@pytest.mark.parametrize(("K", "chunk", "temperature"), [
    (0, None, 1.0),   # no token
    (0, 1, 0.5),
    (7, 1, 0.5),      # a chunk a token
    (7, 3, 1.7),      # 3 + 3 + 1
    (6, 3, 1.0),      # 3 + 3
    (7, 100, 0.5),    # one chunk, larger than K
])
def test_edges_equal_the_plain_path(K, chunk, temperature):
    check_equals_plain(case_of(K, 9, 4, chunk, temperature), torch.float32)


@settings(max_examples=120, deadline=None)
@given(cases(), st.sampled_from([torch.float32, torch.float64]))
def test_equals_the_plain_path_in_values_and_gradients(case, dtype):
    check_equals_plain(case, dtype)


def check_equals_plain(case, dtype):
    hidden, weight, targets, temperature, chunk, upstream = case
    hidden, weight, upstream = hidden.to(dtype), weight.to(dtype), upstream.to(dtype)
    K = hidden.shape[0]
    tolerances = (1e-6, 1e-6, GRAD_TOL, GRAD_TOL) if dtype == torch.float32 else (1e-12,) * 4

    def chunked(h, w, t, temp):
        return token_logprobs(h, w, t, temp, with_entropy=True, chunk_tokens=chunk)

    ones, zeros = torch.ones(K, dtype=dtype), torch.zeros(K, dtype=dtype)
    for mix in ((ones, zeros), (zeros, ones), upstream):  # log p alone, the entropy alone, both with random grads
        got = grads(chunked, hidden, weight, targets, temperature, mix)
        want = grads(plain, hidden, weight, targets, temperature, mix)
        for g, w, tol in zip(got, want, tolerances):
            if w is None:  # K = 0: nothing reaches the inputs on the plain path
                assert g is None or not g.any()
            else:
                assert_within(g, w, tol)


@settings(max_examples=40, deadline=None)
@given(cases())
def test_without_entropy_is_log_p_alone(case):
    hidden, weight, targets, temperature, chunk, upstream = case
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp, entropy = token_logprobs(h, w, targets, temperature, chunk_tokens=chunk)
    assert entropy is None and logp.dtype == torch.float32 and logp.shape == targets.shape
    (upstream[0] * logp).sum().backward()
    got = grads(plain, hidden, weight, targets, temperature, (upstream[0], torch.zeros(len(targets))))
    assert_within(logp.detach(), got[0])
    if len(targets):
        assert_within(h.grad, got[2], GRAD_TOL)
        assert_within(w.grad, got[3], GRAD_TOL)
    # the entropy computed but left out of the loss: no gradient reaches it (its backward skips the entropy's terms)
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp2, entropy2 = token_logprobs(h2, w2, targets, temperature, chunk_tokens=chunk, with_entropy=True)
    assert entropy2 is not None and torch.equal(logp2, logp)
    (upstream[0] * logp2).sum().backward()
    if len(targets):
        assert torch.equal(h2.grad, h.grad) and torch.equal(w2.grad, w.grad)


def test_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3, 1])

    def both(h, w):
        # chunk_tokens=2: chunks of 2, 2 and 1 tokens
        return token_logprobs(h, w, targets, 0.7, with_entropy=True, chunk_tokens=2)

    def logp_only(h, w):
        return token_logprobs(h, w, targets, 1.3, chunk_tokens=3)[0]

    assert torch.autograd.gradcheck(both, (hidden, weight))
    assert torch.autograd.gradcheck(logp_only, (hidden, weight))


def test_float64_inputs_are_computed_in_float64():
    hidden = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    logp, entropy = token_logprobs(hidden, weight, torch.tensor([0, 1, 2, 3]), 1.0, with_entropy=True)
    assert logp.dtype == entropy.dtype == torch.float64
    (logp + entropy).sum().backward()
    assert hidden.grad.dtype == torch.float64 and weight.grad.dtype == torch.float64


def test_bfloat16_head_rounds_its_logits_as_the_models_head_and_returns_bfloat16_gradients():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 6, generator=gen).bfloat16().requires_grad_(True)
    weight = (torch.randn(11, 6, generator=gen) / 3).bfloat16().requires_grad_(True)
    targets = torch.randint(0, 11, (9,), generator=gen)
    mix = torch.randn(2, 9, generator=gen)
    logp, entropy = token_logprobs(hidden, weight, targets, 0.8, with_entropy=True, chunk_tokens=4)
    assert logp.dtype == entropy.dtype == torch.float32
    ((mix[0] * logp).sum() + (mix[1] * entropy).sum()).backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16

    def model_head(h, w, targets_K, temperature):
        """A bf16 model's plain path: its head's bf16 logits, upcast, then the float32 softmax."""
        return plain((h @ w.T).float(), torch.eye(11), targets_K, temperature)

    want = grads(model_head, hidden.detach(), weight.detach(), targets, 0.8, mix)
    assert_within(logp.detach(), want[0])  # the same bf16-rounded logits: float32 agreement
    assert_within(entropy.detach(), want[1])
    # gradients: float32 ∂z against autograd's bf16 one, then bf16 matmuls alike: a few bf16 ulps
    torch.testing.assert_close(hidden.grad.float(), want[2].float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(weight.grad.float(), want[3].float(), rtol=2e-2, atol=2e-2)


def test_frozen_head_gets_no_gradient_and_frozen_hidden_none():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(6, 4, generator=gen)
    weight = torch.randn(10, 4, generator=gen)
    targets = torch.randint(0, 10, (6,), generator=gen)
    want = grads(plain, hidden, weight, targets, 1.0, (torch.ones(6), torch.ones(6)))

    h = hidden.clone().requires_grad_(True)  # LoRA: the head is frozen
    logp, entropy = token_logprobs(h, weight, targets, 1.0, with_entropy=True, chunk_tokens=4)
    (logp + entropy).sum().backward()
    assert weight.grad is None
    assert_within(h.grad, want[2], GRAD_TOL)

    w = weight.clone().requires_grad_(True)  # hidden states computed without a graph
    logp, entropy = token_logprobs(hidden, w, targets, 1.0, with_entropy=True, chunk_tokens=4)
    (logp + entropy).sum().backward()
    assert hidden.grad is None
    assert_within(w.grad, want[3], GRAD_TOL)

    logp, entropy = token_logprobs(hidden, weight, targets, 1.0, with_entropy=True)  # nothing needs a gradient
    assert not logp.requires_grad and not entropy.requires_grad


def test_tied_head_accumulates_into_the_shared_parameter():
    # the input embedding and the head are one parameter: its gradient is the embedding's plus the head's
    torch.manual_seed(3)
    V, H, K = 13, 5, 7
    ids = torch.randint(0, V, (K,))
    targets = torch.randint(0, V, (K,))
    mix = torch.randn(2, K)

    def run(fn):
        embed = torch.nn.Embedding(V, H)
        with torch.no_grad():
            embed.weight.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(4)))
        hidden = torch.tanh(embed(ids))  # a stand-in for the model between the embedding and the head
        logp, entropy = fn(hidden, embed.weight, targets, 0.9)
        ((mix[0] * logp).sum() + (mix[1] * entropy).sum()).backward()
        return embed.weight.grad

    got = run(lambda h, w, t, temp: token_logprobs(h, w, t, temp, with_entropy=True, chunk_tokens=3))
    assert_within(got, run(plain), GRAD_TOL)


class LargestTensor(TorchDispatchMode):
    """The most elements any op produced while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_holds_every_logit():
    K, V, H, chunk = 64, 1000, 8, 8
    hidden = torch.randn(K, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (K,))
    with LargestTensor() as mode:
        logp, entropy = token_logprobs(hidden, weight, targets, 0.9, with_entropy=True, chunk_tokens=chunk)
        (logp + entropy).sum().backward()
    assert mode.largest == chunk * V  # one chunk's logits (the weight and its gradient are V·H = V·8 too)
    with LargestTensor() as mode:
        logp, entropy = plain(hidden, weight, targets, 0.9)
        (logp + entropy).sum().backward()
    assert mode.largest == K * V


def test_default_chunk_is_a_quarter_gibibyte_of_float32_logits():
    assert default_chunk_tokens(151_936) == 441  # 2²⁶ elements / 151,936 → 441 tokens: 441 · 151,936 · 4 B ≈ 256 MiB
    assert default_chunk_tokens(10**9) == 1
    assert default_chunk_tokens(12) == 2**26 // 12


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="hidden"):
        token_logprobs(torch.zeros(3, 4), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long), 1.0, chunk_tokens=0)
