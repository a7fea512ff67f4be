"""engine=max: the parts that need no MAX server (refusals, token ids recovered from MAX's top-logprobs texts) in the
default suite; against a real MAX server only when RLVR_MAX_COMMAND names its `max` (opt-in: its first start compiles
the model, minutes on 2 CPU cores, and MAX's pins want a venv of its own). There, on MAX 26.6 on this CPU, the server
starts (14 s once its graphs are cached) and samples, but the random tiny model samples <pad>/<unk>, which MAX decodes
to "" as it does <eos>, so their ids cannot be recovered and the probe stops the run: that outcome is an xfail.

    RLVR_MAX_COMMAND=~/maxvenv/bin/max python -m pytest tests/engine/test_max_engine.py -m max_server -p no:xdist
"""

import os

import pytest
import torch
from engine.contract import check_rollouts
from engine.parity import max_logprob_gap
from hydra.utils import instantiate

from composing import compose_config
from rlvr.backend.local import LocalBackend
from rlvr.build import build_all
from rlvr.engine.max import MaxCommand
from rlvr.engine.sync_check import StaleEngineError, check_sync
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.openai_api import ServerError
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams

TINY = TinyLlama("0123456789+=", 128, 512, 2, 4, 32, "float32", None)  # conf/model/tiny.yaml's architecture
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
MAX_COMMAND = os.environ.get("RLVR_MAX_COMMAND")


def setup(lora: bool, tmp_path, *overrides: str):
    model, tok = TINY.load(0)
    tok.save_pretrained(str(tmp_path / "tokenizer"))
    spec = LoraSpec(8, 16, 0.0, ["q_proj", "v_proj"]) if lora else None
    backend = LocalBackend(model, spec, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    make = instantiate(compose_config(["engine=max", f"engine.tokenizer={tmp_path / 'tokenizer'}",
                                       f"engine.workdir={tmp_path}", *overrides]).engine, _partial_=True,
                       _convert_="all")
    return backend, tok, make(policy=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)


def test_lora_on_a_cpu_is_refused_before_any_server_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"engine.devices='cpu' with a LoRA policy: .*SGMV only supported on GPUs"):
        setup(True, tmp_path)


def test_the_max_command_is_checked_at_start():
    with pytest.raises(ConfigError, match=r"engine.command='no-such-max' is not a command here: install MAX"):
        build_all(compose_config(["engine=max", "engine.command=no-such-max"]))
    assert MaxCommand("python3").check().status == "ok"


def test_ids_come_back_from_the_top_logprobs_texts(tmp_path):
    """MAX's reply shape (max/serve/router/openai_routes.py): no ids; per position a {decoded text: logprob} dict
    holding the sampled token, decoded with special tokens skipped (the EOS is "")."""
    _, tok, engine = setup(False, tmp_path)
    eos = tok.eos_token_id
    reply = {"choices": [{"index": 0, "text": "12", "finish_reason": "stop", "logprobs": {
        "token_logprobs": [-0.5, -1.25, -2.0], "top_logprobs": [{"1": -0.5}, {"2": -1.25, "3": -0.75}, {"": -2.0}]}}]}
    assert engine._read_choices(reply, 1, True) == [(tok.convert_tokens_to_ids(["1", "2"]) + [eos],
                                                    [-0.5, -1.25, -2.0])]
    reply["choices"][0]["finish_reason"] = "length"  # "" not at a stop: pad, eos and unk all decode to it
    with pytest.raises(Exception, match=r"the sampled token's text '' is the decoding of 3 token ids"):
        engine._read_choices(reply, 1, True)
    with pytest.raises(ValueError, match="MAX returns log-probabilities at temperature 1"):
        engine.sample(PROMPTS, 1, SamplingParams(0.7, 1.0, 4), seeds=prompt_seeds(0, 3))


@pytest.mark.max_server
@pytest.mark.skipif(not MAX_COMMAND, reason="opt-in: RLVR_MAX_COMMAND=<MAX's max> (a compile of ~100 s)")
def test_full_weights_parity_and_sync_by_reload_against_a_real_max_server(tmp_path):
    backend, tok, engine = setup(False, tmp_path, f"engine.command={MAX_COMMAND}",
                                 f"engine.cache_dir={os.environ.get('RLVR_MAX_CACHE', tmp_path / 'cache')}")
    try:
        try:
            engine.connect()  # starts MAX (graphs from the cache after the first run), then the probe samples
        except ServerError as err:  # measured on MAX 26.6: the random tiny model samples <pad>/<unk>, which MAX
            print(f"MAX starts (s): {[round(s, 1) for s in engine.start_s]}")  # decodes to "" like <eos>
            assert "is the decoding of 3 token ids" in str(err)
            pytest.xfail("MAX decodes the tiny tokenizer's special tokens to '' and returns no ids: not told apart")
        params = SamplingParams(1.0, 1.0, 6)
        before = engine.sample(PROMPTS, 2, params, seeds=prompt_seeds(0, 3))
        check_rollouts(before, rows=6, max_tokens=6, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
        gap_before = max_logprob_gap(backend.policy, before)
        with torch.no_grad():
            for p in backend.policy.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        check = [engine, backend.policy, [tok.eos_token_id], 4, 1e-3, 3]
        with pytest.raises(StaleEngineError):
            check_sync(*check)
        assert engine.sync(backend.policy) > 0  # the server restarted on the new weights' folder
        after = engine.sample(PROMPTS, 2, params, seeds=prompt_seeds(0, 3))
        gap_after = max_logprob_gap(backend.policy, after)
        print(f"MAX starts (s): {[round(s, 1) for s in engine.start_s]}; gaps {gap_before:.2g} {gap_after:.2g}")
        assert gap_before < 1e-3 and gap_after < 1e-3
    finally:
        engine.close()
