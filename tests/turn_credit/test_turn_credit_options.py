"""Every conf/turn_credit option: composes, states every constructor knob, declares its needs, keeps a JSON
state; and what holds for all of them: non-action tokens are 0, one-turn rows without per-turn data are the
single-turn path."""

import inspect
import json

import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from composing import compose_config, compose_options, options
from rlvr.config_check import declared_needs
from rlvr.turn_credit.episode import EpisodeCredit
from tests.turn_credit.rows import NAN, off_action, turn_signals

NAMES = options("turn_credit")  # every file in conf/turn_credit/, so a new option is tested without editing a list

# 2 prompts × 3 episodes with every per-turn tensor filled, observations between actions
ROWS = ["00o1o2o", "0oo11..", "000o...", "0o1....", "00o11o.", "0o1o2.."]
TURN_REWARDS = [[0.0, 0.0, 1.0], [0.0, 1.0, NAN], [0.5, NAN, NAN], [1.0, 0.0, NAN], [0.0, 0.0, NAN],
                [0.0, 0.5, 0.5]]
ENV_ADV = [[0.3, -0.1, 0.2], [0.2, NAN, NAN], [NAN, NAN, NAN], [0.1, 0.2, NAN], [NAN, NAN, NAN], [0.4, 0.1, 0.0]]
BRANCHES = [[[1.0, 0.0, 0.5, 0.25]] * 3, [[0.0, 1.0, NAN, NAN]] * 3, [[NAN] * 4] * 3,
            [[0.5, 0.5, 0.5, 0.5]] * 3, [[1.0, NAN, NAN, NAN]] * 3, [[0.0, 1.0, 1.0, 1.0]] * 3]
REWARDS = torch.tensor([[1.0, 1.0, 0.5], [1.0, 0.0, 1.0]])
ADV_P_G = torch.tensor([[0.1666, 0.1666, -0.3333], [0.3333, -0.6666, 0.3333]])


@pytest.fixture(scope="module")
def composed() -> dict[str, DictConfig]:
    return compose_options("turn_credit")


@pytest.fixture(scope="module")
def provided_by_envs() -> set[str]:
    """Every capability some conf/env option's environment declares it provides."""
    configs = [compose_config([f"env={option}"]) for option in options("env") if option != "none"]
    return set().union(*(declared_needs(cfg, "env").provides for cfg in configs))


@pytest.mark.parametrize("name", NAMES)
def test_option_builds_states_every_knob_and_declares_its_needs(name, composed, provided_by_envs):
    cfg = composed[name]
    assert next(iter(cfg)) == "_target_"
    cls = get_class(cfg._target_)
    params = set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    assert set(cfg) - {"_target_"} == params  # nothing left to a Python default, nothing unknown
    requires = set(cls.needs(OmegaConf.to_container(cfg, resolve=True)).requires)
    assert requires <= provided_by_envs, f"turn_credit={name} requires what no environment provides"
    state = instantiate(cfg).state_dict()
    assert json.loads(json.dumps(state)) == state


@pytest.mark.parametrize("name", NAMES)
def test_option_composes_into_the_real_config(name):
    cfg = compose_config([f"turn_credit={name}"])
    assert cfg.turn_credit._target_.startswith(f"rlvr.turn_credit.{name}.")


@pytest.mark.parametrize("name", NAMES)
def test_only_action_tokens_get_credit(name, composed):
    turns = turn_signals(ROWS, 3, turn_rewards_PG_K=TURN_REWARDS, env_adv_PG_K=ENV_ADV,
                         branch_rewards_PG_K_B=BRANCHES)
    out, metrics = instantiate(composed[name])(ADV_P_G, REWARDS, turns)
    assert out.shape == (6, 7) and out.dtype == ADV_P_G.dtype and torch.isfinite(out).all()
    assert not out[off_action(ROWS)].any()  # prompt, observation and padding tokens: exactly 0
    assert out[~off_action(ROWS)].any()
    assert all(k.startswith(("turn_credit/", "train/tl_grpo_")) and isinstance(v, float) for k, v in metrics.items())


@pytest.mark.parametrize("name", NAMES)
def test_one_turn_rows_without_per_turn_data_are_the_episode_path(name, composed):
    rows = ["000", "0..", "00."] * 2
    turns = turn_signals(rows, 3, env_adv_PG_K=[[NAN]] * 6, branch_rewards_PG_K_B=[[[NAN, NAN]]] * 6)
    try:
        out, _ = instantiate(composed[name])(ADV_P_G, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5]]), turns)
    except ValueError as err:  # credit from per-turn rewards needs them (reward_to_go on one-turn rows is GRPO's
        assert f"turn_credit={name} needs turns.turn_rewards_PG_K" in str(err)  # path: test_reward_to_go.py)
        return
    assert torch.equal(out, ADV_P_G.reshape(-1)[:, None] * turns.actions_PG_T)
    assert torch.equal(out, EpisodeCredit()(ADV_P_G, REWARDS, turns)[0])
