"""What backend=fsdp and a run of several processes refuse before anything loads, naming the keys."""

import pytest

from composing import compose_config
from rlvr.config_check import check
from rlvr.errors import ConfigError

TORCHRUN_RANK_0_OF_2 = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}


def test_what_backend_fsdp_cannot_do_yet_is_refused():
    with pytest.raises(ConfigError, match="its own seeded generator"):
        check(compose_config(["backend=fsdp", "engine=openai"]))


def test_multi_turn_episodes_train_over_several_processes(monkeypatch):
    for key, value in TORCHRUN_RANK_0_OF_2.items():
        monkeypatch.setenv(key, value)
    check(compose_config(["backend=fsdp", "env=guess"]))


def test_several_processes_need_backend_fsdp(monkeypatch):
    for key, value in TORCHRUN_RANK_0_OF_2.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"this run is 2 processes .* choose backend=fsdp"):
        check(compose_config([]))
    check(compose_config(["backend=fsdp"]))  # and with it, nothing to refuse


def test_one_process_with_backend_fsdp_is_a_world_of_one():
    check(compose_config(["backend=fsdp"]))
