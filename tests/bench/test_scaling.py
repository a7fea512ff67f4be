"""bench/scaling.py's memory counting and its synthetic batch. The counting must read a DTensor's local shard
(its numel() is the global size): here on a one-process fake group of 2 ranks (torch's FakeStore, no
communication), as rank 0 of an FSDP2-sharded module with uneven shards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scaling", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def rank0_of_2():
    """This process as rank 0 of a world of 2 whose collectives do nothing."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_plain_tensors_and_adamw_state(bench):
    assert bench.tensor_bytes(torch.zeros(3, 4)) == 48
    assert bench.tensor_bytes(torch.zeros(3, 4, dtype=torch.bfloat16)) == 24
    assert bench.tensor_bytes(None) == 0
    model = torch.nn.Linear(8, 6)  # 48 + 6 floats
    params = list(model.parameters())
    assert bench.gradient_bytes(params) == 0  # no gradient yet
    model(torch.ones(2, 8)).sum().backward()
    optimizer = torch.optim.AdamW(params)
    optimizer.step()
    assert bench.parameter_bytes(model) == bench.gradient_bytes(params) == 54 * 4
    assert bench.optimizer_bytes(optimizer) == 2 * 54 * 4 + 2 * 4  # exp_avg, exp_avg_sq, a float32 step each


def test_fsdp_shards_are_counted_locally(bench, rank0_of_2):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    shard = DTensor.from_local(torch.zeros(3, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
    assert shard.numel() == 24 and bench.tensor_bytes(shard) == 48

    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 5))  # 89 floats in all
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)  # a DTensor sharded as p
    optimizer = torch.optim.AdamW(params)
    optimizer.step()
    mine = 3 * 8 + 3 + 3 * 6 + 3  # rank 0 holds ⌈rows / 2⌉ of each: 6 → 3, 5 → 3
    assert sum(p.numel() for p in params) == 89
    assert bench.parameter_bytes(model) == bench.gradient_bytes(params) == mine * 4
    assert bench.optimizer_bytes(optimizer) == 2 * mine * 4 + 4 * 4


def test_the_batch_is_a_function_of_its_arguments(bench):
    a, b = (bench.synthetic_batch(6, 10, 4, 15, 0, seed=3) for _ in range(2))
    ro = a.rollouts
    assert torch.equal(a.adv_PG_T, b.adv_PG_T) and torch.equal(ro.tokens_PG_T, b.rollouts.tokens_PG_T)
    assert ro.prompt_ids_P == b.rollouts.prompt_ids_P and all(1 <= len(p) <= 4 for p in ro.prompt_ids_P)
    assert int(ro.mask_PG_T.sum(-1).max()) == 10 and bool((ro.tokens_PG_T[~ro.mask_PG_T] == 0).all())
    assert bool(((a.adv_PG_T != 0) == ro.mask_PG_T).all())  # every real token has signal, padding none
    assert not torch.equal(a.adv_PG_T, bench.synthetic_batch(6, 10, 4, 15, 0, seed=4).adv_PG_T)


def test_one_and_two_processes_train_and_the_table_compares_them(run_bench, figure):
    """Its smallest run: torchrun launches of 1 and 2 processes (gloo) on a one-layer model, one step each."""
    out = run_bench("-m", "bench.scaling", "--world-sizes", "1,2", "--modes", "lora", "--hidden", "32", "--layers", "1",
                    "--heads", "2", "--rows", "2", "--tokens", "4", "--prompt", "2", "--steps", "1", "--warmup", "0")
    assert figure(r"2 vs 1 processes: step time ([0-9.]+)×", out) > 0
    assert figure(r"state per rank ([0-9.]+)× \(fell\)", out) < 1  # the shards halve it, whatever the load
    assert figure(r"1st grad norm agrees \(relative difference ([0-9.e+-]+)\)", out) < 1e-5
