"""How `hydra/launcher=packed` groups a sweep's jobs into packs (rlvr/launcher/packed.py): the runs of one model,
engine and backend together, at most `pack_size` a pack (null: as many as fit in memory, rlvr/pack/fit.py), in the
sweep's order; a run that shares nothing alone."""

import pytest
import transformers
from hub_models import saved_model

from composing import compose_config
from rlvr.build import build_all
from rlvr.launcher.packed import exit_status, group_key, packs, why_alone
from rlvr.model.pretrained import Pretrained
from rlvr.model.tiny import TinyLlama
from rlvr.pack.fit import CELL_OVERHEAD_MIB, Budget, base_of, budget, filling, host_available
from rlvr.start import base_key


def test_jobs_of_one_key_share_packs_of_at_most_pack_size():
    keys = ["a", "b", "a", None, "a", "b"]
    assert packs(keys, None) == [[0, 2, 4], [1, 5], [3]]  # null: a group's runs all in one pack
    assert packs(keys, 2) == [[0, 2], [1, 5], [3], [4]]
    assert packs(keys, 1) == [[0], [1], [2], [3], [4], [5]]
    with pytest.raises(ValueError, match="hydra.launcher.pack_size=0: expected a positive number"):
        packs(keys, 0)


def test_pack_size_null_fills_packs_as_memory_allows():
    # A budget of 1000 bytes, of which a pack may fill 80 % = 800: a base copy 100, a cell 200.
    #   3 cells of 2 seeds' bases: 2 × 100 + 3 × 200 = 800 ≤ 800 fits; 3 cells of 3 bases: 900 does not.
    room = Budget(free=1000, base=100, cell=200, where="this host")
    assert room.fits(3, 2) and not room.fits(3, 3)
    keys = ["a", "a", "a", "a", "b"]
    bases = [base_of(seed, warmup_steps=100, seeded=False) for seed in (0, 1, 2, 0, 5)]  # a warm-up: a base a seed
    assert bases == ["0", "1", "2", "0", "5"] and base_of(7, warmup_steps=0, seeded=False) == ""
    assert base_of(7, warmup_steps=0, seeded=True) == "7"  # the built-in models draw their weights from the seed
    # jobs 0, 1, 2 of seeds 0, 1, 2 would hold 3 bases: job 2 opens a second pack, which job 3 (seed 0) joins
    assert packs(keys, None, filling(bases, room)) == [[0, 1], [2, 3], [4]]
    assert packs(keys, 3, filling(bases, room)) == [[0, 1, 2], [3], [4]]  # a pack_size given wins
    tight = Budget(free=100, base=100, cell=200, where="this host")
    assert packs(keys, None, filling(bases, tight)) == [[0], [1], [2], [3], [4]]  # never less than a run a pack


def test_a_cells_memory_is_its_adapter_and_optimizer_beside_one_base():
    # model=tiny: 2 layers, hidden 128, intermediate 512, 4 heads of 32, float32; LoRA rank 8 on all 7 projections:
    #   a layer: q, k, v, o 4 × 8 × (128 + 128) = 8192, gate, up, down 3 × 8 × (128 + 512) = 15360 → 23552
    #   2 layers: 47104 adapter weights, each with its gradient (4 + 4 bytes) and Adam's 2 moments (8 bytes)
    found = budget(compose_config([]))
    assert found is not None
    assert found.cell == 47104 * (2 * 4 + 8) + CELL_OVERHEAD_MIB * 2**20
    module, _ = TinyLlama(**{k: v for k, v in compose_config([]).model.items() if k not in {"_target_", "lora"}},
                          lora=None).load(seed=0)
    assert found.base == sum(p.numel() * 4 for p in module.parameters())  # the real module's bytes, tied once
    assert found.where == "this host" and found.free > 0


def test_a_pretrained_models_shape_is_read_from_its_config_alone(tmp_path):
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    config.save_pretrained(tmp_path)  # no weights: the skeleton reads config.json only
    skeleton = Pretrained(str(tmp_path), None, "bfloat16", None, None).skeleton()
    real = transformers.LlamaForCausalLM(config)
    assert skeleton.device.type == "meta" and next(skeleton.parameters()).dtype.itemsize == 2
    assert sum(p.numel() for p in skeleton.parameters()) == sum(p.numel() for p in real.parameters())


def test_free_host_memory_is_the_lower_of_meminfo_and_the_cgroups_room(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:  4000 kB\nMemAvailable:    3000 kB\n")
    assert host_available(tmp_path) == 3000 * 1024  # no cgroup files
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("999\n")
    assert host_available(tmp_path) == 3000 * 1024
    (cgroup / "memory.max").write_text("2000000\n")
    assert host_available(tmp_path) == 2000000 - 999


@pytest.mark.parametrize("overrides, why", [
    (["model.lora=null"], "it trains every weight"),
    (["engine=sglang"], "engine=SGLangEngine, backend=LocalBackend: a pack shares engine=pytorch or vllm, and "
                        "backend=local, only"),
    (["backend=fsdp"], "a pack shares engine=pytorch or vllm, and backend=local, only"),
    (["engine=vllm", "trainer.off_policy_steps=1"], "its vLLM cannot serve other cells in step"),
])
def test_a_run_that_shares_nothing_is_a_pack_of_its_own(overrides, why):
    cfg = compose_config(overrides)
    assert group_key(cfg) is None and why in why_alone(cfg)


def test_the_log_says_why_a_pack_has_one_run_locally_and_over_slurm(caplog):
    """Each launcher's line for a pack: its jobs, and for a pack of one the reason (a SLURM pack is a task)."""
    from rlvr.launcher.packed import log_pack

    configs = [compose_config([]), compose_config(["seed=1"]), compose_config(["model.lora=null"])]
    with caplog.at_level("INFO", logger="rlvr"):
        log_pack(0, [[0, 1], [2]], configs, 4)
        log_pack(1, [[0, 1], [2]], configs, 4, " (a task)")
    assert caplog.messages == ["pack 1 of 2: jobs 4, 5",
                               "pack 2 of 2 (a task): jobs 6 (it trains every weight: no base to share)"]


@pytest.mark.parametrize("engine", [[], ["engine=vllm"]])
def test_conditions_and_seeds_share_a_key_a_model_does_not(engine):
    keys = {group_key(compose_config([*engine, *o])) for o in (["condition=grpo"], ["condition=maxrl", "seed=3"])}
    assert len(keys) == 1 and None not in keys
    assert group_key(compose_config([*engine, "model.lora.rank=4"])) not in keys  # another LoRA shape


def test_the_pack_exits_with_its_worst_cell():
    assert exit_status([None, None]) == 0
    assert exit_status([None, SystemExit(1), SystemExit(2)]) == 2
    assert exit_status([SystemExit(2), SystemExit(75), RuntimeError("x")]) == 75  # checkpointed: requeue the pack
    assert exit_status([RuntimeError("x")]) == 1


def test_cells_share_a_base_unless_their_seed_draws_or_trains_its_weights(tmp_path):
    def key(*overrides: str) -> str:
        return base_key(build_all(compose_config(list(overrides)))[0])

    assert key("seed=0") != key("seed=1")  # the built-in model draws its weights from the seed
    pretrained = ["model=pretrained", f"model.name_or_path={saved_model(tmp_path)}"]
    no_warmup = [*pretrained, "trainer.warmup.steps=0"]
    assert key(*no_warmup, "seed=0") == key(*no_warmup, "seed=1")  # loaded weights, whatever the seed
    assert key(*pretrained, "trainer.warmup.steps=5", "seed=0") != key(*pretrained, "trainer.warmup.steps=5",
                                                                         "seed=1")  # a warm-up for each seed


def test_a_vllm_pack_counts_a_copy_and_a_kv_cache_for_each_base():
    # 80 % of 1000 = 800: bases × (base 100 + vLLM 100) + cells × 200; 2 cells of 2 bases 800 fit, of 3 bases 1000 not.
    room = Budget(free=1000, base=100, cell=200, where="this host", engine=100)
    assert room.fits(2, 2) and not room.fits(2, 3)
    found = budget(compose_config(["engine=vllm", "engine.kv_cache_memory_bytes=1000000"]))
    assert found is not None and found.engine == found.base + 1_000_000  # vLLM's copy of the weights and its cache
    assert "its vLLM" in found.describe() and budget(compose_config([])).engine == 0  # engine=pytorch: none
