"""backend.packing (rlvr/backend/local.py): a step's rows packed end to end, position ids restarting per row, change
memory and time, never the objective. On length mixes drawn by hypothesis the packed step's log-probabilities, loss,
statistics and gradients equal the padded step's to 1e-6 in float32, under LoRA and full fine-tuning, with every loss
mode and every mismatch correction, a reference KL and an entropy bonus, eager and sdpa attention; how rows are
placed into passes under the token budget; and the config check."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composing import compose_config
from rlvr.algorithm.correction import KINDS, Correction
from rlvr.algorithm.kl import ReferenceKL
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.fsdp import rank_rows
from rlvr.backend.local import LocalBackend
from rlvr.backend.logprobs import PLAIN_HEADS
from rlvr.config_check import config_problems
from rlvr.model.tiny import TinyLlama
from rlvr.types import LoraSpec, Rollouts, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
G = 2


def backend(packing: bool, lora: LoraSpec | None, attention: str, budget: int = 24) -> LocalBackend:
    model, tok = TINY.load(0)
    model.config._attn_implementation = attention
    return LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False, packing,
                        budget, reference=True)


def step(prompt_lengths: list[int], completion_lengths: list[int], seed: int) -> TrainBatch:
    """len(prompt_lengths) prompts × G rows; row i's completion has completion_lengths[i] real tokens; the engine's
    log-probabilities are off the trainer's by up to ±0.3 (a mismatch, so the corrections weigh and mask)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 15, (n,), generator=gen).tolist() for n in prompt_lengths]
    N, T = len(completion_lengths), max(completion_lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(completion_lengths)[:, None]
    tokens = torch.randint(1, 15, (N, T), generator=gen).masked_fill(~mask, 0)
    engine_lp = (-2.0 + 0.3 * (2 * torch.rand(N, T, generator=gen) - 1)) * mask
    adv = (torch.randn(N, 1, generator=gen) * mask).contiguous()
    adv[0] = 0.0  # a row without signal is dropped in both layouts
    ro = Rollouts(prompts, G, tokens, engine_lp, mask, torch.ones(N, dtype=torch.bool), 0.7)
    return TrainBatch(ro, adv)


def losses() -> list[PolicyLoss]:
    """Every loss mode (clipping on, so stale ratios clip), every correction (bands the mismatch crosses), every
    loss form and every aggregation (weights from the whole step, whatever the passes)."""
    modes = [PolicyLoss(0.1, 0.1, 0.0, mode=m, kl_cov_percent=20.0, clip_cov_ratio=0.3, clip_cov_min=-1e3,
                        clip_cov_max=1e3) for m in ("standard", "kl_cov", "clip_cov")]
    corrections = [PolicyLoss(0.0, 0.0, 0.0, correction=Correction(k, pi_old, cap=1.1, low=0.9, high=1.1))
                   for k in KINDS for pi_old in ("bypass", "decoupled")]
    forms = [PolicyLoss(0.1, 0.1, 0.0, form="gspo", aggregation="seq_mean_token_mean"),
             PolicyLoss(0.0, 0.0, 0.0, form="cispo", cispo_max=1.05, aggregation="prompt_mean")]
    aggregations = [PolicyLoss(0.1, 0.1, 0.0, aggregation=a, aggregation_norm=30)
                    for a in ("seq_mean_token_sum", "seq_mean_token_sum_norm")]
    regularized = [PolicyLoss(0.1, 0.1, 0.0, kl=ReferenceKL(0.3, "k3"), entropy_coef=0.02),  # the reference's pass
                   PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.3, "k1"), entropy_coef=-0.02, aggregation="prompt_mean",
                              correction=Correction("token_mask", "bypass", cap=1.1, low=0.9, high=1.1))]
    return modes + corrections + forms + aggregations + regularized


def trained(b: LocalBackend, batch: TrainBatch, loss: PolicyLoss) -> tuple[torch.Tensor, dict, dict]:
    """The step's new log-probabilities, the sums its loss and statistics are read from, and its gradients (what
    `train_step` hands the optimizer: AdamW's first step moves a near-zero gradient element by ~lr whatever its float
    noise, so the update is compared through its gradients)."""
    t = b.trainee
    rows = t.step_rows(batch, loss)
    batches = t.micro_batches(rows, range(len(rows.prompts)))
    lp = t.step_logprobs(rows, batches)
    selected = t.selection(loss, rows, batches)
    sums = t.accumulate(loss, rows, batches, selected, scale=1.0)
    scale = t.kept_scale(sums, rows)
    grads = {n: p.grad * scale for n, p in b.policy.named_parameters() if p.grad is not None}
    return lp, sums | {"selected": float(selected.sum()) if selected is not None else 0.0}, grads


lengths = st.integers(1, 6).flatmap(lambda P: st.tuples(
    st.lists(st.integers(1, 7), min_size=P, max_size=P),
    st.lists(st.sampled_from([1, 2, 3, 5, 9, 17, 30]), min_size=P * G, max_size=P * G)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=lengths, seed=st.integers(0, 2**16), lora=st.booleans(), attention=st.sampled_from(["eager", "sdpa"]),
       loss=st.sampled_from(losses()), budget=st.sampled_from([8, 24, 200]))
def test_packed_rows_train_exactly_what_padded_rows_train(lengths, seed, lora, attention, loss, budget):
    batch = step(*lengths, seed)
    padded = trained(backend(False, LORA if lora else None, attention), batch, loss)
    packed = trained(backend(True, LORA if lora else None, attention, budget), batch, loss)
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-6)
    assert packed[1].keys() == padded[1].keys()
    for key, value in padded[1].items():
        assert packed[1][key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    assert packed[2].keys() == padded[2].keys() and padded[2]
    for name, grad in padded[2].items():
        torch.testing.assert_close(packed[2][name], grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_packed_rows_train_what_padded_rows_train_with_kl_and_entropy(lora):
    # the draw above may miss them: the reference's pass and the entropy's gradient, packed against padded, once each,
    # with the weights moved off the reference so that kl ≠ 0
    batch = step([3, 5, 2], [1, 9, 5, 17, 2, 3], seed=3)
    gen = torch.Generator().manual_seed(1)
    layouts = [backend(False, LORA if lora else None, "sdpa"), backend(True, LORA if lora else None, "sdpa", 12)]
    noise = {n: 0.05 * torch.randn(p.shape, generator=gen) for n, p in layouts[0].policy.named_parameters()
             if p.requires_grad}
    for b in layouts:
        with torch.no_grad():
            for n, p in b.policy.named_parameters():
                if p.requires_grad:
                    p.add_(noise[n])
    for loss in losses()[-2:]:
        padded, packed = (trained(b, batch, loss) for b in layouts)
        assert padded[1]["kl_ref"] != 0 and padded[1]["entropy"] > 0
        for key, value in padded[1].items():
            assert packed[1][key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
        for name, grad in padded[2].items():
            torch.testing.assert_close(packed[2][name], grad, rtol=0, atol=1e-6)
        for b in layouts:
            b.policy.zero_grad(set_to_none=True)


def test_rows_are_packed_longest_first_into_the_first_pass_with_room():
    # sizes (prompt + completion): row 0: 2+3=5, row 1: 1+9=10, row 2: 3+2=5, row 3: 1+30=31 (over the budget of 12)
    # longest first: 3 → pass A alone (31 > 12); 1 → pass B (room 2); 0 → no room in B, pass C (room 7); 2 → C (2)
    b = backend(True, None, "eager", budget=12)
    batch = TrainBatch(Rollouts([[5, 6], [7], [8, 9, 10], [11]], 1, torch.ones(4, 30, dtype=torch.long),
                                torch.zeros(4, 30), torch.arange(30)[None, :] < torch.tensor([3, 9, 2, 30])[:, None],
                                torch.ones(4, dtype=torch.bool), 1.0), torch.ones(4, 30))
    rows = b.trainee.step_rows(batch)
    assert rows.sizes == [5, 10, 5, 31]
    assert b.trainee.micro_batches(rows, range(4)) == [[3], [1], [0, 2]]
    assert b.trainee.micro_batches(rows, [0, 1]) == [[1], [0]]


def test_ranks_are_balanced_by_tokens_when_packed_and_by_rows_when_padded():
    sizes = [31, 5, 10, 5, 4, 3]
    # longest first to the lightest rank: 31 → r0; 10 → r1; 5 → r1 (15); 5 → r1 (20); 4 → r1 (24); 3 → r1 (27)
    assert rank_rows(sizes, 2, packing=True) == [[0], [1, 2, 3, 4, 5]]
    assert rank_rows(sizes, 2, packing=False) == [[0, 1, 2], [3, 4, 5]]
    assert rank_rows(sizes[:1], 2, packing=True) == [[0], []]


def test_packing_needs_a_token_budget():
    cfg = compose_config(["backend.packing=true", "backend.max_tokens_per_micro_batch=0"])
    assert any("backend.max_tokens_per_micro_batch=0" in p for p in config_problems(cfg)[1])
    assert not config_problems(compose_config(["backend.packing=true"]))[1]


@pytest.mark.parametrize("softcap", [None, 0.5], ids=["plain", "soft-capped"])
def test_the_head_is_applied_to_the_sampled_positions_alone_or_read_from_the_logits_when_not_plain(softcap):
    """Gemma 2's logits are soft-capped (cap·tanh(z/cap)) after its head: the chunked head would drop the cap, so the
    backend finds the head not plain on its first pass and reads the model's logits; without the cap the head is
    plain. Either way the log-probabilities are log_softmax(model logits / T) at the positions before the tokens."""
    import transformers

    config = transformers.Gemma2Config(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       max_position_embeddings=64, final_logit_softcapping=softcap, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    b = LocalBackend(model, None, 0, 0, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    tokens = torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask = tokens != 0
    ids, attn, Lp = b.trainee.rows([[3, 4], [2]], tokens, mask)
    with torch.no_grad():
        got = b.completion_logprobs(ids, attn, Lp, tokens, 0.7)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    want = torch.log_softmax(logits[:, Lp - 1 : -1].float() / 0.7, -1).gather(-1, tokens[..., None]).squeeze(-1)
    assert PLAIN_HEADS[model] is (softcap is None)
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-6)
    assert bool((got[~mask] == 0).all())


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_the_backend_gives_the_entropies_the_engine_gives(packing):
    """backend=local's no-grad entropies (the chunked head's, for an engine that cannot give them) are the ones
    engine=pytorch computes while sampling: −Σ p log p of softmax(logits / T) at every completion position."""
    from rlvr.engine.pytorch import PyTorchEngine
    from rlvr.seeds import prompt_seeds
    from rlvr.types import SamplingParams

    b = backend(packing, LORA, "eager", budget=20)
    engine = PyTorchEngine(b.policy, [1], 0, 256, merge_lora=False)
    ro = engine.sample([[4, 5, 13], [3], [12, 12, 13, 4]], 3, SamplingParams(0.7, 1.0, 9),
                       seeds=prompt_seeds(3, 3), with_entropy=True)
    got = b.entropies(ro)
    assert got.shape == ro.entropy_PG_T.shape and b.policy.training
    torch.testing.assert_close(got[ro.mask_PG_T], ro.entropy_PG_T[ro.mask_PG_T], rtol=0, atol=1e-5)
    assert bool((got[~ro.mask_PG_T] == 0).all())
