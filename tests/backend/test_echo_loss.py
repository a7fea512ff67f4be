"""ECHO in the local backend (rlvr/backend/local.py) and the selective head (issue 26, requirements 4 and 5): the
policy loss and ECHO's −Σ w·log π come from one forward and one backward per pass, the LM head is applied at the
scored positions alone (sampled tokens of rows with signal ∪ ECHO targets), and the result equals a dense
computation over every logit to 1e-6 in value and gradient, whatever the micro-batches or packing."""

import pytest
import torch
from backend.passes import gradients

import rlvr.backend.logprobs as logprobs_module
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.backend.logprobs import padded_rows
from rlvr.model.tiny import TinyLlama
from rlvr.types import Rollouts, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None)
TEMPERATURE = 0.7


def backend(micro_batch_size: int = 0, packing: bool = False, budget: int = 16) -> LocalBackend:
    model, tok = TINY.load(0)
    return LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, micro_batch_size,
                        False, packing, budget)


def step() -> TrainBatch:
    """2 prompts × 2 episodes: actions (a) and observations (o: body, t: template), advantages on some actions;
    row 1 has ECHO targets and no advantage (it trains for ECHO alone), row 3 has neither (dropped)."""
    layout = ["aaootao", "aoooo", "aaatooa", "aoo"]
    T = max(map(len, layout))
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[t < len(r) for t in range(T)] for r in layout])
    actions = torch.tensor([[t < len(r) and r[t] == "a" for t in range(T)] for r in layout])
    body = torch.tensor([[t < len(r) and r[t] == "o" for t in range(T)] for r in layout])
    tokens = torch.randint(1, 13, (4, T), generator=gen).masked_fill(~mask, 0)
    engine_lp = torch.where(actions, -2.0 + 0.3 * torch.rand(4, T, generator=gen), 0.0)
    adv = torch.where(actions, torch.tensor([[0.5], [0.0], [-0.7], [0.0]]), 0.0)
    adv[0, 1] = 0.0  # a sampled token without advantage in a row with signal: scored (mismatch/*), not in the loss
    echo = torch.where(body, torch.tensor([[0.02], [0.03], [0.01], [0.0]]), 0.0)
    ro = Rollouts([[3, 4, 5], [6, 7]], 2, tokens, engine_lp, mask, torch.ones(4, dtype=torch.bool), TEMPERATURE,
                  actions_PG_T=actions, turn_PG_T=torch.where(actions, 0, -1), observation_body_PG_T=body)
    return TrainBatch(ro, adv, echo)


def dense(b: LocalBackend, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Every logit of every row: log_softmax(logits / T) at each completion token, the policy loss −Σ exp(δ)·A / n
    over the tokens with A ≠ 0 (clip 0, token_mean) plus ECHO's −Σ w·log π, and its gradients."""
    ro, model = batch.rollouts, b.policy
    ids, attn, Lp = padded_rows(ro.prompt_ids_P[:1] * 2 + ro.prompt_ids_P[1:] * 2, ro.tokens_PG_T, ro.mask_PG_T, 0)
    position = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position).logits
    T = ro.tokens_PG_T.shape[1]
    logp_all = torch.log_softmax(logits[:, Lp - 1 : Lp - 1 + T].float() / TEMPERATURE, -1)
    lp = logp_all.gather(-1, ro.tokens_PG_T[..., None]).squeeze(-1) * ro.mask_PG_T
    signal = (batch.adv_PG_T != 0) & ro.actions_PG_T
    policy = (-torch.exp(lp - ro.logprobs_PG_T) * batch.adv_PG_T * signal).sum() / signal.sum()
    echo = -(lp * batch.echo_PG_T).sum()
    (policy + echo).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return policy.detach(), echo.detach(), grads


def test_the_selective_head_equals_every_logit_in_value_and_gradient(monkeypatch):
    batch, loss = step(), PolicyLoss(0.0, 0.0, 0.0)
    heads = []
    real = logprobs_module.token_logprobs

    def counted(hidden, *args, **kwargs):
        heads.append(hidden.shape[0])
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr(logprobs_module, "token_logprobs", counted)
    b = backend()
    rows, _, sums, grads = gradients(b, batch, loss)
    # rows 0, 1, 2 train (1 for ECHO alone); scored: row 0's 3 sampled + 3 ECHO targets (its template token not),
    # row 1's 4 targets (its action has no advantage: not scored), row 2's 4 sampled + 2 targets = 16 of 19 real
    assert len(rows.prompts) == 3 and heads == [16]
    assert int(rows.scored.sum()) == 16 and int(batch.rollouts.mask_PG_T[:3].sum()) == 19
    policy, echo, want = dense(b, batch)
    assert sums["loss"] == pytest.approx(float(policy), abs=1e-6)
    assert sums["echo_loss"] == pytest.approx(float(echo), abs=1e-6) and sums["echo_loss"] > 0
    assert grads.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6)


def test_one_forward_and_one_backward_per_pass_for_both_losses(monkeypatch):
    b, batch = backend(), step()
    forwards, backwards = [], []
    logprobs_module.PLAIN_HEADS[b.policy] = True  # tiny's head is plain: no probe pass (its first pass's check)
    b.policy.register_forward_hook(lambda *_: forwards.append(1))
    real_backward = torch.Tensor.backward

    def counted(self, *args, **kwargs):
        backwards.append(1)
        return real_backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", counted)
    metrics = b.train_step(batch, PolicyLoss(0.0, 0.0, 0.0), lr=1e-3)
    assert len(forwards) == 1 and len(backwards) == 1
    assert metrics["echo/loss"] > 0 and metrics["echo/joint_optimizer_step"] == 1.0 and metrics["local_train_rows"] == 3


@pytest.mark.parametrize(("micro_batch_size", "packing", "budget"), [(1, False, 0), (2, False, 0), (0, True, 9),
                                                                     (0, True, 40)])
def test_micro_batches_and_packing_leave_the_echo_term_unchanged(micro_batch_size, packing, budget):
    batch, loss = step(), PolicyLoss(0.1, 0.1, 0.0, aggregation="seq_mean_token_mean")
    _, _, one_sums, one = gradients(backend(), batch, loss)
    _, batches, sums, grads = gradients(backend(micro_batch_size, packing, budget), batch, loss)
    assert len(batches) > 1 or budget == 40
    assert sums["echo_loss"] == pytest.approx(one_sums["echo_loss"], abs=1e-6)
    assert sums["loss"] == pytest.approx(one_sums["loss"], abs=1e-6)
    for name, grad in one.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6)


def test_without_echo_an_observation_is_not_scored_and_a_row_without_signal_is_dropped():
    batch = step()
    rows = backend().trainee.step_rows(TrainBatch(batch.rollouts, batch.adv_PG_T), PolicyLoss(0.0, 0.0, 0.0))
    assert len(rows.prompts) == 2 and rows.echo is None
    assert torch.equal(rows.scored, rows.sampled) and int(rows.scored.sum()) == 7  # 3 + 4 sampled tokens
