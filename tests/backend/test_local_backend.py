import pytest
import torch

from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.backend.logprobs import PLAIN_HEADS
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
PG = PolicyLoss(0.0, 0.0, 0.0)


def make(lora=LORA, micro_batch_size=0, grad_clip_norm=0.0, gradient_checkpointing=False):
    model, tok = TINY.load(0)
    backend = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, grad_clip_norm,
                           micro_batch_size, gradient_checkpointing)
    engine = PyTorchEngine(backend.policy, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)
    return backend, engine


def rollouts(engine, temperature=0.8, seed=0):
    return engine.sample(PROMPTS, 4, SamplingParams(temperature, 1.0, 6), seeds=prompt_seeds(seed, len(PROMPTS)))


def params(backend, trainable: bool):
    return {n: p.detach().clone() for n, p in backend.policy.named_parameters() if p.requires_grad == trainable}


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_training_logprobs_equal_sampling_logprobs(temperature):
    # the importance ratio of an on-policy step is exactly the sampler's distribution against itself
    backend, engine = make()
    ro = rollouts(engine, temperature)
    prompts = [p for p in ro.prompt_ids_P for _ in range(ro.group_size)]
    ids, attn, Lp = backend.trainee.rows(prompts, ro.tokens_PG_T, ro.mask_PG_T)
    with torch.no_grad():
        new = backend.completion_logprobs(ids, attn, Lp, ro.tokens_PG_T, ro.temperature)
    assert torch.allclose(new[ro.mask_PG_T], ro.logprobs_PG_T[ro.mask_PG_T], atol=1e-5)


def test_lora_step_moves_only_the_adapter_and_ratio_is_one():
    backend, engine = make()
    ro = rollouts(engine)
    frozen, trained = params(backend, False), params(backend, True)
    assert trained and all("lora_" in n for n in trained)
    adv = torch.linspace(-1, 1, ro.tokens_PG_T.shape[0])[:, None] * ro.mask_PG_T
    stats = backend.train_step(TrainBatch(ro, adv), PG, lr=1e-2)
    assert all(torch.equal(p, params(backend, False)[n]) for n, p in frozen.items())
    assert any(not torch.equal(p, params(backend, True)[n]) for n, p in trained.items())
    assert stats["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["clip_fraction"] == 0.0 and stats["grad_norm"] > 0
    assert stats["rl/optimizer_nonzero_advantage_action_tokens"] == int(((adv != 0) & ro.mask_PG_T).sum())


def test_full_fine_tuning_trains_every_weight():
    backend, engine = make(lora=None)
    assert backend.trainable_parameters == sum(p.numel() for p in backend.policy.parameters())
    before = params(backend, True)
    ro = rollouts(engine)
    backend.train_step(TrainBatch(ro, ro.mask_PG_T.float()), PG, lr=1e-3)
    assert not torch.equal(before["model.embed_tokens.weight"], params(backend, True)["model.embed_tokens.weight"])


def test_loss_is_a_token_mean_over_nonzero_advantages():
    # on-policy: ℓ = −A per token; loss = Σ(−A)/#(A≠0). Rows 0..5 get A = 2, rows 6..11 get A = 0:
    # loss = −2·n/n = −2 whatever the completion lengths, and the zero rows do not dilute it.
    backend, engine = make()
    ro = rollouts(engine)
    adv = torch.zeros(ro.tokens_PG_T.shape)
    adv[:6] = 2.0
    stats = backend.train_step(TrainBatch(ro, adv * ro.mask_PG_T), PG, lr=0.0)
    assert stats["loss"] == pytest.approx(-2.0, abs=1e-4)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
                                         "prompt_mean"])
def test_each_aggregation_is_its_formula_on_policy(aggregation):
    # on-policy ℓ = −A per token. Row i (of 12: 3 prompts × 4) gets A_i = (i + 1)/10 on its n_i completion tokens,
    # but rows 4..7 (prompt 1) get 0: S = 8 rows, P = 2 prompts count. Then, by the formulas:
    #   seq_mean_token_mean      −(1/S) Σ_i A_i                 (each row's token mean is A_i)
    #   seq_mean_token_sum       −(1/S) Σ_i A_i·n_i
    #   seq_mean_token_sum_norm  −(1/S) Σ_i A_i·n_i / 6        (aggregation_norm = 6, the sampler's max_tokens)
    #   prompt_mean              −(1/P) Σ_p Σ_{i∈p} A_i·n_i / Σ_{i∈p} n_i
    backend, engine = make()
    ro = rollouts(engine)
    A = torch.tensor([(i + 1) / 10 if not 4 <= i < 8 else 0.0 for i in range(12)])
    n = ro.mask_PG_T.sum(-1).float()
    signal = A != 0
    expected = {
        "seq_mean_token_mean": -A[signal].mean(),
        "seq_mean_token_sum": -(A * n)[signal].mean(),
        "seq_mean_token_sum_norm": -(A * n)[signal].mean() / 6,
        "prompt_mean": -sum((A * n)[p * 4:(p + 1) * 4].sum() / n[p * 4:(p + 1) * 4].sum() for p in (0, 2)) / 2,
    }[aggregation]
    loss = PolicyLoss(0.0, 0.0, 0.0, aggregation=aggregation, aggregation_norm=6)
    stats = backend.train_step(TrainBatch(ro, A[:, None] * ro.mask_PG_T), loss, lr=0.0)
    assert stats["loss"] == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize("settings", [{}, {"aggregation": "seq_mean_token_mean"}, {"aggregation": "prompt_mean"},
                                      {"form": "gspo", "aggregation": "seq_mean_token_mean"}, {"form": "cispo"}])
def test_micro_batches_change_memory_not_the_update(settings):
    whole, engine = make(micro_batch_size=0)
    split, _ = make(micro_batch_size=3)
    ro = rollouts(engine)
    adv = torch.randn(ro.tokens_PG_T.shape[0], 1) * ro.mask_PG_T
    loss = PolicyLoss(0.0, 0.0, 0.0, **settings)
    a = whole.train_step(TrainBatch(ro, adv), loss, lr=1e-3)
    b = split.train_step(TrainBatch(ro, adv), loss, lr=1e-3)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for n, p in params(whole, True).items():
        assert torch.allclose(p, params(split, True)[n], atol=1e-6)


def test_grad_clip_acts_before_the_optimizer():
    # Adam's first step is ≈ lr·g/(|g| + eps): scale-free, unless the clipped gradient is far below eps = 1e-8.
    # Clipping the global norm to 1e-12 makes every coordinate ≪ eps, so the update all but vanishes.
    def delta(clip):
        backend, engine = make(grad_clip_norm=clip)
        ro = rollouts(engine)
        before = params(backend, True)
        stats = backend.train_step(TrainBatch(ro, ro.mask_PG_T.float()), PG, lr=1e-2)
        after = params(backend, True)
        return max((after[n] - before[n]).abs().max().item() for n in before), stats["grad_norm"]

    free, norm_free = delta(0.0)
    clipped, norm_clipped = delta(1e-12)
    assert clipped < 1e-3 * free
    assert norm_clipped == pytest.approx(norm_free)  # the reported norm is the pre-clip one


def test_save_writes_safetensors_and_optimizer(tmp_path):
    backend, _ = make()
    backend.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").exists()
    assert (tmp_path / "ckpt" / "optimizer.pt").exists()
    full, _ = make(lora=None)
    full.save(tmp_path / "full")
    assert (tmp_path / "full" / "model.safetensors").exists()


def test_rows_without_signal_are_dropped_with_a_bit_identical_gradient():
    # rows 4..11 have advantage 0 everywhere: the loss and its token count ignore them, so the update
    # must be the same whether they are in the forward pass or not (here: with vs without them)
    a, engine = make()
    b, _ = make()
    ro = rollouts(engine)
    adv = torch.zeros(ro.tokens_PG_T.shape)
    adv[:4] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None]
    adv = adv * ro.mask_PG_T
    stats = a.train_step(TrainBatch(ro, adv), PG, lr=1e-3)
    assert stats["local_train_rows"] == 4
    from dataclasses import replace

    sub = replace(ro, prompt_ids_P=ro.prompt_ids_P[:1], tokens_PG_T=ro.tokens_PG_T[:4],
                  logprobs_PG_T=ro.logprobs_PG_T[:4], mask_PG_T=ro.mask_PG_T[:4], finished_PG=ro.finished_PG[:4])
    b.train_step(TrainBatch(sub, adv[:4]), PG, lr=1e-3)
    for n, p in params(a, True).items():
        assert torch.equal(p, params(b, True)[n]), n


def test_logprobs_computed_a_chunk_at_a_time_are_the_same(monkeypatch):
    import rlvr.backend.lm_head as lm_head

    backend, engine = make()
    ro = rollouts(engine)
    prompts = [p for p in ro.prompt_ids_P for _ in range(ro.group_size)]
    ids, attn, Lp = backend.trainee.rows(prompts, ro.tokens_PG_T, ro.mask_PG_T)
    with torch.no_grad():
        whole = backend.completion_logprobs(ids, attn, Lp, ro.tokens_PG_T, ro.temperature)
        monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 16)  # one position per chunk (vocabulary 16)
        chunked = backend.completion_logprobs(ids, attn, Lp, ro.tokens_PG_T, ro.temperature)
    assert PLAIN_HEADS[backend.policy]
    assert torch.allclose(whole, chunked, atol=1e-6)


@pytest.mark.parametrize("lora", [LORA, None], ids=["lora", "full"])
def test_gradient_checkpointing_changes_memory_not_the_update(lora):
    plain, engine = make(lora=lora)
    checkpointed, _ = make(lora=lora, gradient_checkpointing=True)
    ro = rollouts(engine)
    adv = torch.randn(ro.tokens_PG_T.shape[0], 1) * ro.mask_PG_T
    a = plain.train_step(TrainBatch(ro, adv), PG, lr=1e-3)
    b = checkpointed.train_step(TrainBatch(ro, adv), PG, lr=1e-3)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for n, p in params(plain, True).items():
        assert torch.allclose(p, params(checkpointed, True)[n], atol=1e-6), n
