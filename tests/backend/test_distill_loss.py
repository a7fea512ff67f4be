"""distill.estimator=full in the local backend (rlvr/backend/local.py): the teacher's KL over its top-k joins the
policy loss in the same forward and backward pass, over its own tokens (every action token, a row without advantage
included) and weights, and equals a dense computation over every logit to 1e-6 in value and gradient, whatever the
micro-batches or packing. docs/algorithms.md#on-policy-distillation."""

from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from backend.passes import gradients

from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.backend.logprobs import padded_rows
from rlvr.model.tiny import TinyLlama
from rlvr.types import LoraSpec, Rollouts, TeacherSupport, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None)
TEMPERATURE = 0.7
COEF = 0.5


def backend(micro_batch_size: int = 0, packing: bool = False, budget: int = 16) -> LocalBackend:
    model, tok = TINY.load(0)
    return LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, micro_batch_size,
                        False, packing, budget)


def step(k: int = 4) -> TrainBatch:
    """2 prompts × 2 completions of 5, 3, 4 and 2 tokens; rows 1 and 3 have no advantage (they train for the
    teacher's KL alone). The teacher: random logits, its top-k at every position; weights coef / 14 tokens."""
    lengths, T, V = [5, 3, 4, 2], 5, len(TINY.alphabet) + 3
    gen = torch.Generator().manual_seed(0)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.randint(1, 13, (4, T), generator=gen).masked_fill(~mask, 0)
    engine_lp = torch.where(mask, -2.0 + 0.3 * torch.rand(4, T, generator=gen), 0.0)
    adv = torch.where(mask, torch.tensor([[0.5], [0.0], [-0.7], [0.0]]), 0.0)
    teacher = torch.log_softmax(2.0 * torch.randn(4, T, V, generator=gen), -1)
    lp, ids = teacher.topk(k, dim=-1)
    weight = mask.float() * COEF / int(mask.sum())
    ro = Rollouts([[3, 4, 5], [6, 7]], 2, tokens, engine_lp, mask, torch.ones(4, dtype=torch.bool), TEMPERATURE)
    return TrainBatch(ro, adv, None, TeacherSupport(ids, lp, weight))


def dense(b: LocalBackend, batch: TrainBatch):
    """Every logit of every row: the policy loss −Σ exp(δ)·A / n over the tokens with A ≠ 0, plus
    Σ w·D_β(p̃, q̃) with p̃, q̃ the student's and the teacher's distributions over S (renormalised, or with the rest
    of the vocabulary as one more outcome), in probabilities rather than log-probabilities."""
    ro, model, support = batch.rollouts, b.policy, batch.distill
    assert support is not None
    ids, attn, Lp = padded_rows([ro.prompt_ids_P[0]] * 2 + [ro.prompt_ids_P[1]] * 2, ro.tokens_PG_T, ro.mask_PG_T, 0)
    position = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position).logits
    T = ro.tokens_PG_T.shape[1]
    logp_all = torch.log_softmax(logits[:, Lp - 1 : Lp - 1 + T].float() / TEMPERATURE, -1)
    lp = logp_all.gather(-1, ro.tokens_PG_T[..., None]).squeeze(-1) * ro.mask_PG_T
    signal = batch.adv_PG_T != 0
    policy = (-torch.exp(lp - ro.logprobs_PG_T) * batch.adv_PG_T * signal).sum() / signal.sum()
    p_in, q_in = logp_all.gather(-1, support.ids_PG_T_K).exp(), support.logprobs_PG_T_K.exp()
    if support.tail:  # the rest of the vocabulary as one more outcome
        p = torch.cat([p_in, 1 - p_in.sum(-1, keepdim=True)], -1)
        q = torch.cat([q_in, 1 - q_in.sum(-1, keepdim=True)], -1)
    else:
        p, q = p_in / p_in.sum(-1, keepdim=True), q_in / q_in.sum(-1, keepdim=True)
    b = support.beta
    m = b * q + (1 - b) * p
    divergence = ((p * (p / q).log()).sum(-1) if b == 1 else (q * (q / p).log()).sum(-1) if b == 0
                  else b * (q * (q / m).log()).sum(-1) + (1 - b) * (p * (p / m).log()).sum(-1))
    distill = (divergence * support.weight_PG_T).sum()
    (policy + distill).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return policy.detach(), distill.detach(), grads


@pytest.mark.parametrize("k", [4, len(TINY.alphabet) + 3], ids=["top4", "whole-vocabulary"])
def test_the_teachers_kl_equals_every_logit_in_value_and_gradient(k):
    batch, loss = step(k), PolicyLoss(0.0, 0.0, 0.0)
    b = backend()
    rows, _, sums, grads = gradients(b, batch, loss)
    assert len(rows.prompts) == 4 and int(rows.scored.sum()) == 14  # every action token, rows without advantage too
    policy, distill, want = dense(b, batch)
    assert sums["loss"] == pytest.approx(float(policy), abs=1e-6)
    assert sums["distill_loss"] == pytest.approx(float(distill), abs=1e-6) and sums["distill_loss"] > 0
    assert sums["distill_kl"] == pytest.approx(float(distill) * 14 / COEF, abs=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("beta", "tail"), [(0.0, False), (0.5, True), (0.25, False)],
                         ids=["forward-kl", "jsd-tail", "jsd0.25"])
def test_every_divergence_equals_every_logit_in_value_and_gradient(beta, tail):
    """distill.beta and distill.tail (docs/algorithms.md#the-full-estimator) in the backend's pass, against the same
    dense computation; `distill_kl` still reports the reverse KL."""
    plain = step()
    batch = replace(plain, distill=replace(plain.distill, beta=beta, tail=tail))
    b, loss = backend(), PolicyLoss(0.0, 0.0, 0.0)
    _, _, sums, grads = gradients(b, batch, loss)
    _, distill, want = dense(b, batch)
    assert sums["distill_loss"] == pytest.approx(float(distill), abs=1e-6) and sums["distill_loss"] > 0
    _, reverse, _ = dense(backend(), plain) if not tail else dense(backend(), replace(batch, distill=replace(
        batch.distill, beta=1.0)))
    assert sums["distill_kl"] == pytest.approx(float(reverse) * 14 / COEF, abs=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("micro_batch_size", "packing", "budget"), [(1, False, 0), (3, False, 0), (0, True, 9)])
def test_micro_batches_and_packing_leave_the_teachers_kl_unchanged(micro_batch_size, packing, budget):
    batch, loss = step(), PolicyLoss(0.0, 0.0, 0.0)
    _, _, one_sums, one = gradients(backend(), batch, loss)
    _, batches, sums, grads = gradients(backend(micro_batch_size, packing, budget), batch, loss)
    assert len(batches) > 1
    assert sums["distill_loss"] == pytest.approx(one_sums["distill_loss"], abs=1e-6)
    assert sums["loss"] == pytest.approx(one_sums["loss"], abs=1e-6)
    for name, grad in one.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6)


def test_a_step_reports_the_teachers_kl_and_trains_on_it_alone():
    batch = step()
    no_advantage = TrainBatch(batch.rollouts, torch.zeros_like(batch.adv_PG_T), None, batch.distill)
    metrics = backend().train_step(no_advantage, PolicyLoss(0.0, 0.0, 0.0), lr=1e-3)
    assert metrics["loss"] == 0.0 and metrics["local_train_rows"] == 4 and metrics["grad_norm"] > 0
    assert metrics["distill/loss"] == pytest.approx(metrics["distill/support_kl"] * COEF, rel=1e-5)


@pytest.mark.parametrize("reference", [False, True], ids=["live", "base"])
def test_the_self_teachers_scores_are_the_policys_at_the_sampling_temperature(reference):
    """transform.estimator=full's self-teacher pass (LocalBackend.self_teacher_scores): the sampled tokens'
    log-probabilities and the top-4 of log-softmax(logits / T) at each position, the policy's (or, with the adapter
    off, the base's) as `dense` computes them, over every micro-batch layout."""
    batch = step()
    model, tok = TINY.load(0)
    b = LocalBackend(model, LoraSpec(4, 8.0, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu", (0.9, 0.95),
                     1e-8, 0.0, 0.0, 3, False)
    with torch.no_grad():  # a non-zero adapter, so that the base differs from the policy
        for name, p in b.policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    training = b.policy.training
    scores = b.self_teacher_scores(batch.rollouts, 4, reference)
    ro = batch.rollouts
    ids, attn, Lp = padded_rows([ro.prompt_ids_P[0]] * 2 + [ro.prompt_ids_P[1]] * 2, ro.tokens_PG_T, ro.mask_PG_T, 0)
    with torch.no_grad(), b.policy.disable_adapter() if reference else nullcontext():
        logits = b.policy(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    T = ro.tokens_PG_T.shape[1]
    logp = torch.log_softmax(logits[:, Lp - 1: Lp - 1 + T].float() / TEMPERATURE, -1)
    mask = ro.mask_PG_T
    torch.testing.assert_close(scores.logprobs_N_T, logp.gather(-1, ro.tokens_PG_T[..., None]).squeeze(-1) * mask,
                               rtol=0, atol=1e-5)
    values, indices = logp.topk(4, dim=-1)
    assert scores.topk_ids_N_T_K is not None and scores.topk_logprobs_N_T_K is not None
    assert torch.equal(scores.topk_ids_N_T_K[mask], indices[mask])
    torch.testing.assert_close(scores.topk_logprobs_N_T_K[mask], values[mask], rtol=0, atol=1e-5)
    assert b.policy.training == training  # its mode is given back


def test_the_ema_teacher_moves_a_rate_toward_the_policy_swaps_in_and_out_exactly_and_is_checkpointed(tmp_path):
    """transform.teacher=ema (LocalBackend.ema_update, ema_weights): θ_ema starts at θ0; after the policy moves to θ1,
    one update at rate r = 0.25 gives 0.75·θ0 + 0.25·θ1; inside `ema_weights` the adapter is θ_ema, after it θ1 bit
    for bit; a checkpoint holds θ_ema, and a backend loading it goes on from it."""
    model, tok = TINY.load(0)
    lora = LoraSpec(4, 8.0, 0.0, ["q_proj", "v_proj"])
    b = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    trained = b.trainee.trained_weights()
    assert trained and all("lora_" in name for name in trained)
    theta0 = {n: p.detach().clone() for n, p in trained.items()}
    b.ema_update(0.25)  # the first call: θ_ema = θ0
    with torch.no_grad():
        for p in trained.values():
            p.add_(0.5)
    theta1 = {n: p.detach().clone() for n, p in trained.items()}
    b.ema_update(0.25)
    assert b.ema is not None
    for n in trained:
        torch.testing.assert_close(b.ema[n], 0.75 * theta0[n] + 0.25 * theta1[n], rtol=0, atol=1e-7)
    with b.ema_weights():
        assert all(torch.equal(p, b.ema[n]) for n, p in trained.items())
    assert all(torch.equal(p, theta1[n]) for n, p in trained.items())
    b.save(tmp_path)
    model2, _ = TINY.load(0)
    other = LocalBackend(model2, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    other.load(tmp_path)
    assert other.ema is not None and all(torch.equal(other.ema[n], b.ema[n]) for n in trained)
