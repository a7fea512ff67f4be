"""The reference model of algorithm.kl on backend=local (rlvr/backend/local.py, rlvr/algorithm/kl.py): under LoRA the
policy with its adapter disabled (the base's log-probabilities, no copy; kl = 0 exactly at step 0, B being 0), under
full fine-tuning a frozen copy that no update moves and that a resumed run rebuilds from the base; the loss's kl and
entropy terms in the step row; micro-batches change memory, not the update, with both terms on."""

import copy

import pytest
import torch

from rlvr.algorithm.kl import ReferenceKL
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
PG = PolicyLoss(0.0, 0.0, 0.0)
KL_ENT = PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.5, "k3"), entropy_coef=0.05)


def make(lora=LORA, micro_batch_size=0, reference=True, model=None):
    base, tok = TINY.load(0)
    backend = LocalBackend(model or base, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0,
                           micro_batch_size, False, reference=reference)
    return backend, PyTorchEngine(backend.policy, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)


def rollouts(engine, seed=0):
    return engine.sample(PROMPTS, 4, SamplingParams(0.8, 1.0, 6), seeds=prompt_seeds(seed, len(PROMPTS)))


def advantages(ro):
    return torch.linspace(-1, 1, ro.tokens_PG_T.shape[0])[:, None] * ro.mask_PG_T


def reference_and_policy(backend, ro):
    t = backend.trainee
    rows = t.step_rows(TrainBatch(ro, advantages(ro)))
    batches = t.micro_batches(rows, range(len(rows.prompts)))
    return t.step_reference_logprobs(rows, batches), t.step_logprobs(rows, batches), rows.action


def test_lora_reference_is_the_base_with_the_adapter_disabled_and_kl_is_zero_at_step_0():
    backend, engine = make()
    ro = rollouts(engine)
    assert backend.trainee.reference is None  # no copy under LoRA
    base, _ = TINY.load(0)
    base_backend, _ = make(lora=None, reference=False, model=base)
    ref, policy, action = reference_and_policy(backend, ro)
    t = base_backend.trainee
    rows = t.step_rows(TrainBatch(ro, advantages(ro)))
    base_lp = t.step_logprobs(rows, t.micro_batches(rows, range(len(rows.prompts))))
    torch.testing.assert_close(ref, base_lp, rtol=0, atol=1e-6)  # the base model's own log-probabilities
    assert torch.equal(ref[action], policy[action])  # B = 0: the adapter adds exactly nothing
    stats = backend.train_step(TrainBatch(ro, advantages(ro)), KL_ENT, lr=1e-2)
    assert stats["policy/kl_ref"] == 0.0 and stats["policy/kl_coef"] == 0.5
    assert stats["policy/entropy"] > 0 and stats["policy/entropy_coef"] == 0.05
    ref_after, policy_after, _ = reference_and_policy(backend, ro)
    torch.testing.assert_close(ref_after, ref, rtol=0, atol=1e-6)  # the update moved the adapter, not the base
    assert not torch.allclose(policy_after[action], policy[action], atol=1e-4)
    assert backend.policy.training  # the reference pass left the policy in train mode


def test_full_fine_tuning_reference_is_a_frozen_copy_that_updates_leave_alone():
    backend, engine = make(lora=None)
    reference = backend.trainee.reference
    assert reference is not None and not any(p.requires_grad for p in reference.parameters())
    assert not reference.training
    before = {n: p.clone() for n, p in reference.named_parameters()}
    ro = rollouts(engine)
    for _ in range(2):
        stats = backend.train_step(TrainBatch(ro, advantages(ro)), KL_ENT, lr=1e-2)
    assert stats["policy/kl_ref"] > 0  # the second step's policy has moved off the reference
    assert all(torch.equal(p, before[n]) for n, p in reference.named_parameters())
    assert backend.trainee.params and all(p is not q for p in backend.trainee.params for q in reference.parameters())
    # without kl the backend makes no copy
    assert make(lora=None, reference=False)[0].trainee.reference is None


def test_a_resumed_full_fine_tuning_run_rebuilds_the_reference_from_the_base(tmp_path):
    base, _ = TINY.load(0)
    backend, engine = make(lora=None, model=copy.deepcopy(base))
    ro = rollouts(engine)
    backend.train_step(TrainBatch(ro, advantages(ro)), KL_ENT, lr=1e-2)
    backend.save(tmp_path / "ckpt")
    resumed, _ = make(lora=None, model=copy.deepcopy(base))  # the run's base, as a run's start loads it
    resumed.load(tmp_path / "ckpt")
    for (name, ref), (_, b) in zip(resumed.trainee.reference.named_parameters(), base.named_parameters(), strict=True):
        assert torch.equal(ref, b), name  # the base, not the checkpoint
    trained = dict(backend.policy.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in resumed.policy.named_parameters())
    # and the resumed run's next step is the uninterrupted run's
    a = backend.train_step(TrainBatch(ro, advantages(ro)), KL_ENT, lr=1e-2)
    b = resumed.train_step(TrainBatch(ro, advantages(ro)), KL_ENT, lr=1e-2)
    assert a["policy/kl_ref"] == pytest.approx(b["policy/kl_ref"], abs=1e-7) and a["policy/kl_ref"] > 0


def perturbed(lora, micro_batch_size):
    """A backend whose trainable weights are moved off the base by the same seeded noise (so kl ≠ 0)."""
    backend, engine = make(lora=lora, micro_batch_size=micro_batch_size)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in backend.trainee.params:
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return backend, engine


def gradients(backend, batch, loss):
    """The step's sums (loss, kl_ref, entropy) and gradients, as `train_step` hands them to the optimizer."""
    t = backend.trainee
    rows = t.step_rows(batch, loss)
    sums = t.accumulate(loss, rows, t.micro_batches(rows, range(len(rows.prompts))), None, scale=1.0)
    return sums, {n: p.grad.clone() for n, p in backend.policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [LORA, None], ids=["lora", "full"])
def test_micro_batches_change_memory_not_the_update_with_kl_and_entropy(lora):
    whole, engine = perturbed(lora, 0)
    split, _ = perturbed(lora, 5)
    batch = TrainBatch(rollouts(engine), advantages(rollouts(engine)))
    loss = PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.5, "k2"), entropy_coef=0.05, aggregation="seq_mean_token_mean")
    (a, grads_a), (b, grads_b) = gradients(whole, batch, loss), gradients(split, batch, loss)
    assert a["kl_ref"] > 1e-4 and a["entropy"] > 0
    for key in ("loss", "kl_ref", "entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-6), key
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=0, atol=1e-6)


def test_the_reward_pass_scores_every_row_with_the_reference():
    backend, engine = make()
    ro = rollouts(engine)
    ref = backend.reference_logprobs(ro)
    assert ref.shape == ro.tokens_PG_T.shape and not ref[~ro.mask_PG_T].any()
    # at step 0 the reference is the sampler's policy: the engine's log-probabilities up to float noise
    torch.testing.assert_close(ref[ro.mask_PG_T], ro.logprobs_PG_T[ro.mask_PG_T], rtol=0, atol=1e-5)


def test_the_defaults_are_the_loss_bit_for_bit_with_no_reference_pass(monkeypatch):
    a, engine = make()
    b, _ = make()
    ro = rollouts(engine)
    adv = advantages(ro)
    calls = []
    monkeypatch.setattr(type(b.trainee), "reference_logprobs", lambda *args: calls.append(args))
    sa = a.train_step(TrainBatch(ro, adv), PG, lr=1e-2)
    off = PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.0, "k1"), entropy_coef=0.0)
    sb = b.train_step(TrainBatch(ro, adv), off, lr=1e-2)
    assert not calls and "policy/kl_ref" not in sb and "policy/entropy" not in sb
    assert sa["loss"] == sb["loss"] and sa["grad_norm"] == sb["grad_norm"]
    assert all(torch.equal(p, q) for p, q in zip(a.policy.parameters(), b.policy.parameters(), strict=True))
