"""The trainer's side of the in-memory weight sync (rlvr/engine/vllm_weights.py) and of the NCCL weight transfer's
source (rlvr/engine/weight_transfer.py): the tensors sent are exactly the ones save_full / save_base write, each once,
in the engine's dtype, in chunks within the byte budget; a packed chunk comes back bit for bit."""

import pytest
import torch
from safetensors.torch import load_file

from rlvr.backend.local import LocalBackend
from rlvr.engine.policy_files import save_base, save_full
from rlvr.engine.vllm_weights import chunk_bytes, named_weights, pack, unpack, weight_chunks
from rlvr.model.tiny import TinyLlama
from rlvr.types import LoraSpec

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)


def written(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_the_names_and_tensors_are_those_save_full_writes(tmp_path):
    model, _ = TINY.load(0)
    sent = dict(named_weights(model))
    files = written(save_full(model, tmp_path / "full"))
    assert model.config.tie_word_embeddings and "lm_head.weight" not in sent  # tied: sent once, as on disk
    assert sent.keys() == files.keys()
    assert all(torch.equal(sent[name], files[name]) for name in files)


def test_w0_of_a_lora_policy_is_what_save_base_writes(tmp_path):
    model, tok = TINY.load(0)
    backend = LocalBackend(model, LoraSpec(8, 16, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu",
                           (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    sent = dict(named_weights(backend.policy, base=True))
    files = written(save_base(backend.policy, tmp_path / "base"))
    assert sent.keys() == files.keys() and not any("lora" in name for name in sent)
    assert all(torch.equal(sent[name], files[name]) for name in files)
    with pytest.raises(TypeError, match="W0 plus its adapter"):
        next(named_weights(backend.policy))


@pytest.mark.parametrize("budget", [1, 20_000, 40_000, 10**9])
def test_chunks_keep_the_order_and_the_budget_and_cast_to_the_engine_dtype(budget):
    model, _ = TINY.load(0)
    names = [name for name, _ in named_weights(model)]
    chunks = list(weight_chunks(model, torch.bfloat16, budget))
    assert [name for chunk in chunks for name, _ in chunk] == names
    assert all(t.dtype == torch.bfloat16 for chunk in chunks for _, t in chunk)
    for chunk in chunks:  # within the budget, or a single tensor that alone exceeds it
        assert chunk_bytes(chunk) <= budget or len(chunk) == 1
    assert len(chunks) == (len(names) if budget == 1 else 1 if budget == 10**9 else len(chunks))
    if 1 < budget < 10**9:  # greedy: a chunk closes only when the next tensor would not fit
        sizes = [chunk_bytes(c) for c in chunks]
        firsts = [c[0][1].numel() * 2 for c in chunks[1:]]
        assert all(size + nxt > budget for size, nxt in zip(sizes, firsts))
    same = next(weight_chunks(model, torch.float32, 10**9))
    assert all(t.data_ptr() == p.data_ptr() for (_, t), (_, p) in zip(same, named_weights(model)))  # no copy


def test_a_packed_chunk_comes_back_bit_for_bit():
    model, _ = TINY.load(0)
    chunk = [(name, t.to(torch.bfloat16) if i % 2 else t) for i, (name, t) in enumerate(named_weights(model))]
    packed = pack(chunk)
    assert isinstance(packed["data"], bytes) and len(packed["data"]) == chunk_bytes(chunk)
    back = unpack(packed)
    assert [n for n, _ in back] == [n for n, _ in chunk]
    assert all(a.dtype == b.dtype and torch.equal(a, b) for (_, a), (_, b) in zip(back, chunk))
    assert unpack(pack([])) == []
    with pytest.raises(ValueError, match="describe"):
        unpack({**packed, "data": packed["data"][:-2]})


def test_the_nccl_source_declares_what_it_yields():
    """vLLM's NCCL transfer sizes the server's receive buffers from `metadata()` and broadcasts what iteration
    yields: the two must agree, name for name (the policy's own dtypes: the server's loaders cast)."""
    pytest.importorskip("vllm", reason="the weight-transfer API is vLLM's")
    from rlvr.engine.weight_transfer import policy_source

    model, _ = TINY.load(0)
    source = policy_source(model, base=False)
    meta = source.metadata()
    pairs = list(source)
    assert [(m.name, m.dtype, m.shape) for m in meta] == [(n, t.dtype, tuple(t.shape)) for n, t in pairs]
    assert [n for n, _ in pairs] == [n for n, _ in named_weights(model)]
    assert list(source) and len(list(source)) == len(pairs)  # a fresh pass each round
