"""conf/env/: `env=none` (the default) composes `env: null`; every other option composes with `_target_` first and
every knob commented, declares its needs, and builds; the rest of the config's checks are unchanged by it."""

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from composing import CONF_DIR, compose_config, options
from rlvr.build import build_env
from rlvr.config_check import check, config_problems, declared_needs
from rlvr.errors import ConfigError
from rlvr.types import Example

ENVS = [o for o in options("env") if o != "none"]


def test_none_is_the_default_and_composes_env_null():
    assert "none" in options("env")
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml").defaults)
    assert {"env": "none"} in defaults
    for overrides in ([], ["env=none"]):
        cfg = compose_config(overrides)
        assert "env" in cfg and cfg.env is None
        check(cfg)  # the single-turn path's checks as before


@pytest.mark.parametrize("option", ENVS)
def test_every_environment_composes_declares_its_needs_and_builds(option):
    mandatory = {"verifiers": ["env.environment=tests.env.verifiers_game"]}  # no verifiers package installs offline
    cfg = compose_config([f"env={option}", *mandatory.get(option, [])])
    assert next(iter(cfg.env)) == "_target_"
    needs = declared_needs(cfg, "env")
    assert all(r.at_start for r in needs.machine if type(r).__name__ == "Package")
    context, positions = cfg.env.max_context_tokens, cfg.model.max_positions
    if context > positions:  # an English-text environment's context does not fit model=tiny: refused at start
        [problem] = config_problems(cfg, at_start=False)[1]
        assert problem.startswith(
            f"env.max_context_tokens={context} does not fit: model <rlvr.model.tiny.TinyLlama> has {positions} "
            f"positions (model.max_positions); at most {positions}. To fit, give the model the positions "
            f"(model.max_positions={context})")
        cfg.model.max_positions = context  # a model that fits
    assert config_problems(cfg, at_start=False)[1] == []  # nothing else in the config minds it
    if option == "openenv":  # its server is checked at start, and none answers here
        with pytest.raises(ConfigError, match="env.url=ws://127.0.0.1:8000 is not answering"):
            check(cfg)
    else:
        check(cfg)
    missing = [r.item for r in needs.machine if type(r).__name__ == "Package" and r.check().status == "missing"]
    if missing:
        pytest.skip(f"env={option} needs {', '.join(missing)}")
    env = build_env(cfg)  # as a run builds it (its tool keys to the tool harness); openenv's url is not contacted
    assert ("fork" in needs.provides) == forks(env), "an environment declares `fork` when its episodes fork"
    env = env.env if "tools" in cfg.env else env  # env=calculator's: the tool harness around the environment
    assert isinstance(env, get_class(cfg.env._target_))
    assert (env.max_turns, env.max_context_tokens, env.step_timeout_s) == (cfg.env.max_turns,
                                                                          cfg.env.max_context_tokens,
                                                                          cfg.env.step_timeout_s)


def forks(env) -> bool:
    """Whether an episode of `env` copies itself (one that cannot raises NotImplementedError, or has no fork)."""
    try:
        env.episode(Example("1+1=", "2"), seed=0).fork()
    except (NotImplementedError, AttributeError):
        return False
    return True


@pytest.mark.parametrize("option", ENVS)
def test_every_knob_is_commented(option):
    text = (CONF_DIR / "env" / f"{option}.yaml").read_text()
    assert text.startswith("# ")  # a header: what the option is
    keys = [line for line in text.splitlines() if line and not line.startswith((" ", "#", "_target_"))]
    assert keys and all("#" in line for line in keys), [line for line in keys if "#" not in line]


def own_eval_size(option: str) -> int | None:
    """data.eval_size an environment's file sets (its `_global_` option's `data:`), or None: env=retry plays the
    data's own held-out problems, as many as the data option evaluates."""
    raw = OmegaConf.load(CONF_DIR / "env" / f"{option}.yaml")
    return OmegaConf.select(raw, "data.eval_size")


@pytest.mark.parametrize("option", ENVS)
def test_an_environment_sets_how_many_episodes_evaluation_plays(option):
    """A held-out episode is up to max_turns model calls: a game evaluates fewer episodes than data=arithmetic's
    1,000 examples; the command line still decides."""
    mandatory = ["env.environment=tests.env.verifiers_game"] if option == "verifiers" else []
    arithmetic, own = compose_config(["env=none"]).data.eval_size, own_eval_size(option)
    for data in ("arithmetic", "gsm8k"):
        cfg = compose_config([f"env={option}", f"data={data}", *mandatory])
        plain = compose_config([f"data={data}"]).data.eval_size
        assert cfg.data.eval_size == (plain if own is None else own)
        assert cfg.data.eval_size <= arithmetic
    assert compose_config([f"env={option}", "data.eval_size=7", *mandatory]).data.eval_size == 7
    text = (CONF_DIR / "env" / f"{option}.yaml").read_text()
    assert text.startswith("# @package _global_") == (own is not None), "a game's option says how many it plays"
