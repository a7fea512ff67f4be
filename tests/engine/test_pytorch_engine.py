import pytest
import torch

from rlvr.backend.local import LocalBackend
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.lora import LoraSpec
from rlvr.model.tiny import TinyLlama
from rlvr.types import SamplingParams

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]  # different lengths: left padding at work


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    return TINY.load(0)


def engine_for(model, tok, max_batch_rows=64):
    return PyTorchEngine(model, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, max_batch_rows=max_batch_rows)


def full_forward_logprobs(model, prompt, completion, temperature):
    """Reference: one un-cached forward over prompt+completion, temperature-scaled log-softmax."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1), torch.tensor(completion)


def test_shapes_masks_and_eos(model_tok):
    model, tok = model_tok
    ro = engine_for(model, tok).sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 6), seed=0, with_entropy=True)
    assert ro.tokens_PG_T.shape == ro.logprobs_PG_T.shape == ro.mask_PG_T.shape == ro.entropy_PG_T.shape
    assert ro.tokens_PG_T.shape[0] == 12 and ro.tokens_PG_T.shape[1] <= 6
    for tokens, mask, finished in zip(ro.tokens_PG_T.tolist(), ro.mask_PG_T.tolist(), ro.finished_PG.tolist()):
        n = sum(mask)
        assert mask == [True] * n + [False] * (len(mask) - n)  # a prefix, then padding
        assert all(t == tok.pad_token_id for t in tokens[n:])
        assert (tokens[n - 1] == tok.eos_token_id) == finished  # EOS is the last real token iff finished
        assert tok.eos_token_id not in tokens[: n - 1]
    assert (ro.logprobs_PG_T[~ro.mask_PG_T] == 0).all() and (ro.entropy_PG_T[~ro.mask_PG_T] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_and_entropy_match_a_full_forward(model_tok, temperature):
    model, tok = model_tok
    ro = engine_for(model, tok).sample(PROMPTS, 3, SamplingParams(temperature, 1.0, 6), seed=1, with_entropy=True)
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
    together = engine_for(model, tok).sample(PROMPTS, 1, greedy, seed=0)
    for i, prompt in enumerate(PROMPTS):
        alone = engine_for(model, tok).sample([prompt], 1, greedy, seed=0)
        n = int(alone.mask_PG_T[0].sum())
        assert together.tokens_PG_T[i, :n].tolist() == alone.tokens_PG_T[0, :n].tolist()
        logp, completion = full_forward_logprobs(model, prompt, alone.tokens_PG_T[0, :n].tolist(), 1.0)
        assert completion.tolist() == logp.argmax(-1).tolist()


def test_tiny_top_p_keeps_only_the_most_likely_token(model_tok):
    model, tok = model_tok
    greedy = engine_for(model, tok).sample(PROMPTS, 1, SamplingParams(0.0, 1.0, 5), seed=0)
    nucleus = engine_for(model, tok).sample(PROMPTS, 1, SamplingParams(1.0, 1e-6, 5), seed=7)
    assert torch.equal(greedy.tokens_PG_T, nucleus.tokens_PG_T)


def test_seeds_decide_the_draws(model_tok):
    model, tok = model_tok
    params = SamplingParams(1.0, 1.0, 6)
    a = engine_for(model, tok).sample(PROMPTS, 8, params, seed=3)
    b = engine_for(model, tok).sample(PROMPTS, 8, params, seed=3)
    c = engine_for(model, tok).sample(PROMPTS, 8, params, seed=4)
    assert torch.equal(a.tokens_PG_T, b.tokens_PG_T)
    assert not torch.equal(a.tokens_PG_T, c.tokens_PG_T)


def test_chunked_decoding_returns_the_same_shapes(model_tok):
    model, tok = model_tok
    ro = engine_for(model, tok, max_batch_rows=5).sample(PROMPTS, 4, SamplingParams(0.0, 1.0, 6), seed=0)
    ref = engine_for(model, tok).sample(PROMPTS, 4, SamplingParams(0.0, 1.0, 6), seed=0)
    assert torch.equal(ro.tokens_PG_T, ref.tokens_PG_T) and torch.equal(ro.mask_PG_T, ref.mask_PG_T)


def test_lora_updates_reach_the_sampler_without_a_copy():
    model, tok = TINY.load(0)
    backend = LocalBackend(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu",
                           (0.9, 0.95), 1e-8, 0.0, 0.0, 0)
    engine = engine_for(backend.policy, tok)
    before = engine.sample(PROMPTS, 1, SamplingParams(1.0, 1.0, 4), seed=0)
    for name, p in backend.policy.named_parameters():
        if "lora_B" in name:
            p.data.add_(0.5)  # stands in for an optimizer step
    engine.sync(backend.policy)
    after = engine.sample(PROMPTS, 1, SamplingParams(1.0, 1.0, 4), seed=0)
    assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T)
