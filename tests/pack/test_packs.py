"""How `hydra/launcher=packed` groups a sweep's jobs into packs (rlvr/launcher/packed.py): the runs of one model,
engine and backend together, at most `pack_size` a pack, in the sweep's order; a run that shares nothing alone."""

import pytest

from composing import compose_config
from rlvr.launcher.packed import exit_status, group_key, packs, why_alone


def test_jobs_of_one_key_share_packs_of_at_most_pack_size():
    keys = ["a", "b", "a", None, "a", "b"]
    assert packs(keys, None) == [[0, 2, 4], [1, 5], [3]]  # null: a group's runs all in one pack
    assert packs(keys, 2) == [[0, 2], [1, 5], [3], [4]]
    assert packs(keys, 1) == [[0], [1], [2], [3], [4], [5]]
    with pytest.raises(ValueError, match="hydra.launcher.pack_size=0: expected a positive number"):
        packs(keys, 0)


@pytest.mark.parametrize("overrides, why", [
    (["model.lora=null"], "it trains every weight"),
    (["engine=vllm"], "a pack shares engine=pytorch and backend=local only"),
    (["backend=fsdp"], "a pack shares engine=pytorch and backend=local only"),
])
def test_a_run_that_shares_nothing_is_a_pack_of_its_own(overrides, why):
    cfg = compose_config(overrides)
    assert group_key(cfg) is None and why in why_alone(cfg)


def test_conditions_and_seeds_share_a_key_a_model_does_not():
    keys = {group_key(compose_config(o)) for o in (["condition=grpo"], ["condition=maxrl", "seed=3"])}
    assert len(keys) == 1 and None not in keys
    assert group_key(compose_config(["model.lora.rank=4"])) not in keys  # another LoRA shape


def test_the_pack_exits_with_its_worst_cell():
    assert exit_status([None, None]) == 0
    assert exit_status([None, SystemExit(1), SystemExit(2)]) == 2
    assert exit_status([SystemExit(2), SystemExit(75), RuntimeError("x")]) == 75  # checkpointed: requeue the pack
    assert exit_status([RuntimeError("x")]) == 1
