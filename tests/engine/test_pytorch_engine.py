import dataclasses

import pytest
import torch
from engine.contract import check_rollouts

from rlvr.backend.local import LocalBackend
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]  # different lengths: left padding at work


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    return TINY.load(0)


def engine_for(model, tok, max_batch_rows=64, merge_lora=True):
    return PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, max_batch_rows, merge_lora)


def full_forward_logprobs(model, prompt, completion, temperature):
    """Reference: one un-cached forward over prompt+completion, temperature-scaled log-softmax."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1), torch.tensor(completion)


def test_shapes_masks_and_eos(model_tok):
    model, tok = model_tok
    ro = engine_for(model, tok).sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 6),
                                       seeds=prompt_seeds(0, len(PROMPTS)), with_entropy=True)
    assert ro.entropy_PG_T is not None
    check_rollouts(ro, rows=12, max_tokens=6, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_and_entropy_match_a_full_forward(model_tok, temperature):
    model, tok = model_tok
    ro = engine_for(model, tok).sample(PROMPTS, 3, SamplingParams(temperature, 1.0, 6),
                                       seeds=prompt_seeds(1, len(PROMPTS)), with_entropy=True)
    for row in range(ro.tokens_PG_T.shape[0]):
        n = int(ro.mask_PG_T[row].sum())
        completion = ro.tokens_PG_T[row, :n].tolist()
        logp, completion = full_forward_logprobs(model, PROMPTS[row // 3], completion, temperature)
        expected = logp.gather(-1, completion[:, None]).squeeze(-1)
        assert torch.allclose(ro.logprobs_PG_T[row, :n], expected, atol=1e-5)
        entropy = -(logp.exp() * logp).sum(-1)
        assert torch.allclose(ro.entropy_PG_T[row, :n], entropy, atol=1e-5)


def test_greedy_is_argmax_and_independent_of_batching(model_tok):
    model, tok = model_tok
    greedy = SamplingParams(0.0, 1.0, 5)
    together = engine_for(model, tok).sample(PROMPTS, 1, greedy, seeds=prompt_seeds(0, len(PROMPTS)))
    for i, prompt in enumerate(PROMPTS):
        alone = engine_for(model, tok).sample([prompt], 1, greedy, seeds=prompt_seeds(0, len([prompt])))
        n = int(alone.mask_PG_T[0].sum())
        assert together.tokens_PG_T[i, :n].tolist() == alone.tokens_PG_T[0, :n].tolist()
        logp, completion = full_forward_logprobs(model, prompt, alone.tokens_PG_T[0, :n].tolist(), 1.0)
        assert completion.tolist() == logp.argmax(-1).tolist()


def test_tiny_top_p_keeps_only_the_most_likely_token(model_tok):
    model, tok = model_tok
    greedy = engine_for(model, tok).sample(PROMPTS, 1, SamplingParams(0.0, 1.0, 5), seeds=prompt_seeds(0, len(PROMPTS)))
    nucleus = engine_for(model, tok).sample(PROMPTS, 1, SamplingParams(1.0, 1e-6, 5),
                                            seeds=prompt_seeds(7, len(PROMPTS)))
    assert torch.equal(greedy.tokens_PG_T, nucleus.tokens_PG_T)


def test_seeds_decide_the_draws(model_tok):
    model, tok = model_tok
    params = SamplingParams(1.0, 1.0, 6)
    a = engine_for(model, tok).sample(PROMPTS, 8, params, seeds=prompt_seeds(3, len(PROMPTS)))
    b = engine_for(model, tok).sample(PROMPTS, 8, params, seeds=prompt_seeds(3, len(PROMPTS)))
    c = engine_for(model, tok).sample(PROMPTS, 8, params, seeds=prompt_seeds(4, len(PROMPTS)))
    assert torch.equal(a.tokens_PG_T, b.tokens_PG_T)
    assert not torch.equal(a.tokens_PG_T, c.tokens_PG_T)


def test_chunked_decoding_returns_the_same_shapes(model_tok):
    model, tok = model_tok
    ro = engine_for(model, tok, max_batch_rows=5).sample(PROMPTS, 4, SamplingParams(0.0, 1.0, 6),
                                                         seeds=prompt_seeds(0, len(PROMPTS)))
    ref = engine_for(model, tok).sample(PROMPTS, 4, SamplingParams(0.0, 1.0, 6), seeds=prompt_seeds(0, len(PROMPTS)))
    assert torch.equal(ro.tokens_PG_T, ref.tokens_PG_T) and torch.equal(ro.mask_PG_T, ref.mask_PG_T)


def lora_backend():
    model, tok = TINY.load(0)
    backend = LocalBackend(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj", "down_proj"]), 0, tok.pad_token_id,
                           "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    return backend, tok


def nudge_adapter(backend, amount):
    """Stands in for an optimizer step: moves every LoRA B matrix (zero at init)."""
    for name, p in backend.policy.named_parameters():
        if "lora_B" in name:
            p.data.add_(amount)


@pytest.mark.parametrize("merge_lora", [True, False])
def test_lora_updates_reach_the_sampler_after_sync(merge_lora):
    backend, tok = lora_backend()
    engine = engine_for(backend.policy, tok, merge_lora=merge_lora)
    before = engine.sample(PROMPTS, 1, SamplingParams(1.0, 1.0, 4), seeds=prompt_seeds(0, len(PROMPTS)))
    nudge_adapter(backend, 0.5)
    engine.sync(backend.policy)
    after = engine.sample(PROMPTS, 1, SamplingParams(1.0, 1.0, 4), seeds=prompt_seeds(0, len(PROMPTS)))
    assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T)


def test_merged_sampler_equals_sampling_through_peft():
    # same draws, log-probabilities equal to float precision: W0·x + s·B(A·x) vs (W0 + s·B·A)·x
    backend, tok = lora_backend()
    nudge_adapter(backend, 0.3)
    merged = engine_for(backend.policy, tok, merge_lora=True)
    peft = engine_for(backend.policy, tok, merge_lora=False)
    assert type(merged.module).__name__ == "LlamaForCausalLM"  # PEFT-free
    assert merged.activations == peft.activations is not None  # the config read through PEFT's wrapper too
    a = merged.sample(PROMPTS, 8, SamplingParams(1.0, 1.0, 6), seeds=prompt_seeds(5, len(PROMPTS)), with_entropy=True)
    b = peft.sample(PROMPTS, 8, SamplingParams(1.0, 1.0, 6), seeds=prompt_seeds(5, len(PROMPTS)), with_entropy=True)
    assert torch.equal(a.tokens_PG_T, b.tokens_PG_T)
    assert torch.allclose(a.logprobs_PG_T, b.logprobs_PG_T, atol=1e-5)
    assert torch.allclose(a.entropy_PG_T, b.entropy_PG_T, atol=1e-5)


def test_merged_copy_shares_every_weight_it_does_not_merge():
    backend, tok = lora_backend()
    plain = engine_for(backend.policy, tok).module
    live = {id(p) for p in backend.policy.parameters()}
    copied = [n for n, p in plain.named_parameters() if id(p) not in live]
    assert copied and all(n.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for n in copied)
    w0 = backend.policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.clone()
    nudge_adapter(backend, 1.0)
    engine_for(backend.policy, tok)  # a refresh must not touch the live W0
    assert torch.equal(w0, backend.policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)


LONG = [[4 + i % 10 for i in range(n)] for n in (20, 7, 25, 3, 12)]  # five prompts of mixed lengths


@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("seeded", ["int", "per_prompt"])
def test_chunking_never_changes_what_is_sampled(model_tok, top_p, seeded):
    """Whatever splits the rows into chunks (the row cap, the memory budget, or nothing), the same seeds sample
    the same tokens: each prompt's group draws from its own generator."""
    model, tok = model_tok
    params = SamplingParams(1.0, top_p, 6)
    seed = 11 if seeded == "int" else [101, 7, 55, 3, 9]
    whole = engine_for(model, tok).sample(LONG, 3, params, seeds=prompt_seeds(seed, len(LONG)), with_entropy=True)
    one_row = PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, 64, True, max_batch_mb=1e-6)
    assert one_row.chunks([[1]] * 15, 6, one_row.budget_bytes(torch.device("cpu"))) == [(i, i + 1) for i in range(15)]
    for engine in (engine_for(model, tok, max_batch_rows=4), engine_for(model, tok, max_batch_rows=1), one_row):
        chunked = engine.sample(LONG, 3, params, seeds=prompt_seeds(seed, len(LONG)), with_entropy=True)
        assert torch.equal(chunked.tokens_PG_T, whole.tokens_PG_T) and torch.equal(chunked.mask_PG_T, whole.mask_PG_T)
        assert torch.allclose(chunked.logprobs_PG_T, whole.logprobs_PG_T, atol=1e-5)
        assert torch.allclose(chunked.entropy_PG_T, whole.entropy_PG_T, atol=1e-5)
    assert whole.tokens_PG_T.unique().numel() > 3  # the draws are not all one token


def test_a_groups_prompt_is_prefilled_once_and_each_row_samples_what_it_would_alone(model_tok):
    """The prefill feeds each distinct context of a chunk once and copies its cache and first logits to the rows that
    share it (rlvr/engine/pytorch.py `distinct_rows`): 4 prompts × G=3 (prompt 0 twice, as two groups with their own
    seeds) prefill 3 rows, not 12, and sample what one-row chunks (nothing shared) sample, to float order."""
    model, tok = model_tok
    prompts, params = [LONG[0], LONG[1], LONG[0], LONG[3]], SamplingParams(1.0, 1.0, 6)
    engine, fed = engine_for(model, tok), []
    hook = engine.module.register_forward_pre_hook(lambda _, args, kw: fed.append(tuple(kw["input_ids"].shape)),
                                                   with_kwargs=True)
    try:
        shared = engine.sample(prompts, 3, params, seeds=prompt_seeds(2, 4), with_entropy=True)
    finally:
        hook.remove()
    assert fed[0] == (3, 20) and fed[1] == (12, 1)  # the prefill: 3 distinct prompts (the longest 20 tokens); then 12
    alone = engine_for(model, tok, max_batch_rows=1).sample(prompts, 3, params, seeds=prompt_seeds(2, 4),
                                                            with_entropy=True)
    assert torch.equal(shared.tokens_PG_T, alone.tokens_PG_T) and torch.equal(shared.mask_PG_T, alone.mask_PG_T)
    assert torch.allclose(shared.logprobs_PG_T, alone.logprobs_PG_T, atol=1e-5)
    assert torch.allclose(shared.entropy_PG_T, alone.entropy_PG_T, atol=1e-5)
    assert not torch.equal(shared.tokens_PG_T[0:3], shared.tokens_PG_T[6:9])  # one prompt, two groups, two seeds
    assert len({tuple(r) for r in shared.tokens_PG_T[0:3].tolist()}) > 1  # a group's rows draw apart from one cache


def test_an_int_seed_is_one_seed_per_prompt(model_tok):
    """seed=s samples what seeds sub_seed(s, "prompt/<p>") do, so a prompt's completions do not depend on the
    prompts beside it."""
    from rlvr.seeds import sub_seed

    model, tok = model_tok
    params = SamplingParams(1.0, 1.0, 6)
    by_int = engine_for(model, tok).sample(LONG, 2, params, seeds=prompt_seeds(5, len(LONG)))
    by_list = engine_for(model, tok).sample(LONG, 2, params, seeds=[sub_seed(5, f"prompt/{p}") for p in range(5)])
    assert torch.equal(by_int.tokens_PG_T, by_list.tokens_PG_T)
    first_two = engine_for(model, tok).sample(LONG[:2], 2, params, seeds=prompt_seeds(5, len(LONG[:2])))
    assert torch.equal(first_two.tokens_PG_T, by_int.tokens_PG_T[:4, : first_two.tokens_PG_T.shape[1]])


def test_chunks_are_the_most_rows_whose_estimate_fits_the_budget(model_tok):
    model, tok = model_tok
    engine = engine_for(model, tok, max_batch_rows=6)
    act = engine.activations
    assert (act.layers, act.heads, act.kv_heads, act.head_dim, act.vocab, act.attention, act.itemsize) == (
        2, 2, 2, 32, 15, "eager", 4)
    per_row = act.bytes(1, 10, 4)
    assert act.bytes(3, 10, 4) == 3 * per_row and act.bytes(1, 20, 4) > per_row  # linear in rows, grows with length
    assert engine.chunks([[1] * 10] * 10, 4, 3 * per_row) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert engine.chunks([[1] * 10] * 10, 4, 100 * per_row) == [(0, 6), (6, 10)]  # max_batch_rows still caps
    # a chunk is sized at its longest row: the long row starts its own chunk, and alone exceeds the budget
    assert engine.chunks([[1] * 10] * 2 + [[1] * 30] + [[1] * 10], 4, 2 * per_row) == [(0, 2), (2, 3), (3, 4)]
    assert engine.chunks([], 4, per_row) == []
    assert engine.budget_bytes(torch.device("cpu")) == 1024 * 2**20  # auto on a CPU
    assert PyTorchEngine(model, [1], 0, 8, False, max_batch_mb=3).budget_bytes(torch.device("cpu")) == 3 * 2**20


def test_the_estimate_counts_eager_scores_only_under_eager_attention(model_tok):
    model, tok = model_tok
    eager = engine_for(model, tok).activations
    sdpa = dataclasses.replace(eager, attention="sdpa")
    flash = dataclasses.replace(eager, attention="flash_attention_2")
    L = 600
    assert eager.bytes(1, L, 8) - sdpa.bytes(1, L, 8) == eager.heads * L * L * 8 + L * L * 4 - L * L
    assert sdpa.bytes(1, L, 8) - flash.bytes(1, L, 8) == L * L


@pytest.mark.parametrize("bad", [{"max_batch_rows": 0}, {"max_batch_mb": 0}, {"max_batch_mb": -1}])
def test_a_chunk_bound_must_be_positive(model_tok, bad):
    model, tok = model_tok
    settings = {"max_batch_rows": 8, "merge_lora": False, "max_batch_mb": None} | bad
    with pytest.raises(ValueError, match="engine.max_batch_rows"):
        PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, **settings)


@pytest.mark.parametrize("vocab", [15, 3000])
def test_the_exponential_race_draws_what_torch_multinomial_draws(vocab):
    """The engine's one-draw rule is torch.multinomial's, draw for draw: seeded groups sample what they did when
    the engine called torch.multinomial, one step at a time, also where the noise is drawn a window of steps at once
    (vocab 15: windows of 20 steps; 3,000: one step a window) and where a chunk holds only some of a group's rows."""
    from rlvr.engine.pytorch import NOISE_WINDOW, Noise, multinomial

    assert NOISE_WINDOW // 15 >= 20 and NOISE_WINDOW // 3000 == 1
    probs = torch.rand(6, vocab).softmax(-1)
    probs[3, 4:] = 0.0  # a top-p truncated row
    ours, some = Noise([(torch.Generator().manual_seed(9), 6, slice(0, 6))], 20), \
        Noise([(torch.Generator().manual_seed(9), 6, slice(2, 5))], 20)
    theirs = torch.Generator().manual_seed(9)
    for t in range(20):
        expected = torch.multinomial(probs, 1, generator=theirs)
        assert torch.equal(multinomial(probs, ours, t), expected)
        assert torch.equal(multinomial(probs[2:5], some, t), expected[2:5])
    with pytest.raises(RuntimeError, match="not finite"):
        multinomial(torch.full((2, 3), float("nan")), ours, 0)
