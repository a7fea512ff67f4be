"""A pack's sampling (rlvr/pack/sampling.py): the requests of cells with different weights, decoded in one loop, give
each cell the very rollouts its engine alone gives, bit for bit; requests that would pad differently are not
batched."""

import pytest
import torch

from rlvr.backend.local import prepare
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.pack.sampling import Request, batches, sample_together
from rlvr.types import LoraSpec, SamplingParams

LORA = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"])
PRESET = TinyLlama(alphabet="0123456789+=", hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4,
                   max_positions=32, dtype="float32", lora=LORA)


def engine(base_seed: int, adapter_seed: int, merge: bool) -> PyTorchEngine:
    """A cell's engine: the tiny model from `base_seed`, its LoRA B drawn from `adapter_seed` (so cells differ)."""
    model = prepare(PRESET.load(base_seed)[0], LORA, 1, gradient_checkpointing=False)
    gen = torch.Generator().manual_seed(adapter_seed)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05, generator=gen)
    return PyTorchEngine(policy=model, eos_ids=[1], pad_id=0, max_batch_rows=1024, merge_lora=merge)


def prompts(tokenizer, texts):
    return [tokenizer.encode(t) for t in texts]


@pytest.mark.parametrize("merge", [True, False])
def test_cells_decoded_together_get_what_each_engine_alone_gives(merge):
    tokenizer = PRESET.load_tokenizer()[0]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8)
    cells = [engine(0, 1, merge), engine(0, 2, merge), engine(5, 3, merge)]  # two share a base, one has its own
    texts = [["1+2=", "13+4=", "7+8="], ["12+3=", "5+5=", "9+9="], ["3+31=", "1+1=", "2+2="]]  # longest: 5 each
    requests = [Request(e, prompts(tokenizer, t), 4, params, [10 * c + i for i in range(3)], True)
                for c, (e, t) in enumerate(zip(cells, texts, strict=True))]
    assert batches(requests) == [[0, 1, 2]]
    together = sample_together(requests)
    for r, got in zip(requests, together, strict=True):
        alone = r.alone()
        for field in ("tokens_PG_T", "logprobs_PG_T", "mask_PG_T", "finished_PG", "entropy_PG_T"):
            assert torch.equal(getattr(got, field), getattr(alone, field)), field
        assert got.prompt_ids_P == alone.prompt_ids_P and got.group_size == alone.group_size


def test_requests_that_would_pad_differently_or_sample_otherwise_are_not_batched():
    tokenizer = PRESET.load_tokenizer()[0]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8)
    a, b = engine(0, 1, True), engine(0, 2, True)
    short = Request(a, prompts(tokenizer, ["1+2="]), 4, params, [1], False)
    longer = Request(b, prompts(tokenizer, ["12+34="]), 4, params, [2], False)
    greedy = Request(b, prompts(tokenizer, ["3+4="]), 4, SamplingParams(0.0, 1.0, 8), [3], False)
    same = Request(b, prompts(tokenizer, ["3+4="]), 4, params, [4], False)
    assert batches([short, longer, greedy, same]) == [[0, 3], [1], [2]]
