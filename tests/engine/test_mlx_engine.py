"""engine=mlx against the trainer's own policy: a real in-process MLX (its CPU back end, `mlx[cpu]`), no mocks.

The same parity checks as engine=vllm (tests/engine/test_vllm_engine.py): the engine's sampled-token
log-probabilities equal a full forward of the policy module to TOL, at temperature 1 and below it (the engine
applies the temperature), under LoRA (adapter synced in memory) and full fine-tuning (weights in memory), before
and after an update, which must have reached the sampler; seeded draws are reproducible."""

import pytest
import torch
from engine.contract import check_rollouts
from engine.parity import max_logprob_gap, policy_logprobs, trained_looking_adapter, update
from hydra.utils import instantiate

from composing import compose_config
from rlvr.backend.local import LocalBackend
from rlvr.build import build_all
from rlvr.engine.sync_check import FLOAT32_TOLERANCE, StaleEngineError, check_sync
from rlvr.engine.vllm_weights import named_weights
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

pytest.importorskip("mlx_lm", reason="engine=mlx needs mlx and mlx-lm (pip install -e '.[mlx]')")

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
TOL = 1e-5
"""fp32 on both sides; measured gaps are ~5e-7 (MLX's CPU kernels vs PyTorch's)."""


def backend_for(lora: LoraSpec | None) -> tuple[LocalBackend, object]:
    model, tok = TINY.load(0)
    backend = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    return backend, tok


def engine_for(backend: LocalBackend, tok, *overrides: str):
    """As a run's start builds it (rlvr/start.py): conf/engine/mlx.yaml, then the runtime arguments."""
    make = instantiate(compose_config(["engine=mlx", *overrides]).engine, _partial_=True, _convert_="all")
    return make(policy=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


@pytest.fixture(scope="module")
def lora_setup():
    backend, tok = backend_for(LoraSpec(8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]))
    trained_looking_adapter(backend.policy)
    engine = engine_for(backend, tok)
    yield backend, tok, engine
    engine.close()


@pytest.fixture(scope="module")
def full_setup():
    backend, tok = backend_for(None)
    engine = engine_for(backend, tok)
    yield backend, tok, engine
    engine.close()


# full fine-tuning moves every parameter, the tied embedding / LM head included
@pytest.mark.parametrize("setup, names", [("lora_setup", "lora_B"), ("full_setup", "")])
def test_logprobs_match_the_policy_before_and_after_an_update(setup, names, request):
    backend, tok, engine = request.getfixturevalue(setup)
    params = SamplingParams(1.0, 1.0, 8)
    before = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, before) < TOL
    warm = engine.sample(PROMPTS, 4, SamplingParams(0.7, 1.0, 8), seeds=prompt_seeds(1, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, warm) < TOL  # the engine applies the temperature
    update(backend.policy, names)
    check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 3]
    with pytest.raises(StaleEngineError, match="serves other weights"):  # the update has not reached MLX yet
        check_sync(*check)
    assert engine.sync(backend.policy) == 0  # in memory: no file
    assert check_sync(*check)["engine/sync_check_delta"] < TOL
    after = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, after) < TOL
    n = int(before.mask_PG_T[0].sum())
    moved = policy_logprobs(backend.policy, PROMPTS[0], before.tokens_PG_T[0, :n].tolist(), 1.0)
    assert (moved - before.logprobs_PG_T[0, :n]).abs().max() > 1e-2
    assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T, atol=1e-3)


def test_top_p_logprobs_are_of_the_distribution_before_truncation(lora_setup):
    backend, _, engine = lora_setup
    ro = engine.sample(PROMPTS, 4, SamplingParams(0.7, 0.8, 8), seeds=prompt_seeds(2, len(PROMPTS)))
    assert max_logprob_gap(backend.policy, ro) < TOL
    # the draws came from the nucleus: each sampled token is among the top tokens holding 0.8 of the mass
    for row in range(ro.tokens_PG_T.shape[0]):
        n = int(ro.mask_PG_T[row].sum())
        prompt, completion = PROMPTS[row // 4], ro.tokens_PG_T[row, :n].tolist()
        with torch.no_grad():
            logits = backend.policy(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        probs = torch.softmax(logits / 0.7, -1)
        for pos, token in enumerate(completion):
            above = probs[pos][probs[pos] > probs[pos, token]].sum()
            assert above < 0.8 + 1e-5


def test_shapes_masks_and_eos(lora_setup):
    _, tok, engine = lora_setup
    ro = engine.sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 6), seeds=prompt_seeds(0, len(PROMPTS)))
    assert ro.entropy_PG_T is None
    check_rollouts(ro, rows=12, max_tokens=6, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    assert (ro.logprobs_PG_T[ro.mask_PG_T] < 0).all()
    assert ro.finished_PG.any() and not ro.finished_PG.all()  # both cases were exercised (random tiny model)
    with pytest.raises(ValueError, match="entropy"):
        engine.sample(PROMPTS, 1, SamplingParams(1.0, 1.0, 2), seeds=prompt_seeds(0, 3), with_entropy=True)


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
    # a group's draws depend on its own seed alone, not on the other prompts of the call
    alone = engine.sample(PROMPTS[1:2], 8, params, seeds=prompt_seeds(3, len(PROMPTS))[1:2])
    assert torch.equal(alone.tokens_PG_T, a.tokens_PG_T[8:16, : alone.tokens_PG_T.shape[1]])


def test_greedy_is_the_policy_argmax(lora_setup):
    backend, _, engine = lora_setup
    ro = engine.sample(PROMPTS, 1, SamplingParams(0.0, 1.0, 5), seeds=prompt_seeds(0, len(PROMPTS)))
    for i, prompt in enumerate(PROMPTS):
        n = int(ro.mask_PG_T[i].sum())
        completion = ro.tokens_PG_T[i, :n].tolist()
        with torch.no_grad():
            logits = backend.policy(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        assert completion == logits.argmax(-1).tolist()
    assert (ro.logprobs_PG_T == 0).all()


def test_a_lora_sync_is_in_memory_and_takes_milliseconds(lora_setup):
    backend, _, engine = lora_setup
    assert engine.sync(backend.policy) == 0
    assert len(engine.lora_layers) == 2 * 5  # 2 layers × 5 target modules
    assert engine.last_sync_s < 0.5  # ~1 ms measured; generous for a loaded shared CPU


def test_a_sync_that_leaves_a_parameter_out_is_refused(full_setup):
    """MLX's load_weights(strict=True): a partial update would serve old and new weights mixed."""
    backend, tok, engine = full_setup
    weights = [(n, engine._array(t)) for n, t in named_weights(backend.policy) if n != "model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.model.load_weights(weights, strict=True)
    update(backend.policy, "")
    engine.sync(backend.policy)
    check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 3]
    assert check_sync(*check)["engine/sync_check_delta"] < TOL


def test_the_yaml_knobs_match_the_constructor():
    build_all(compose_config(["engine=mlx"]))  # types of every YAML value checked, nothing loaded
    with pytest.raises(ConfigError, match=r"engine.dtype='fp8' must be one of"):
        backend, tok = backend_for(None)
        engine_for(backend, tok, "engine.dtype=fp8")
