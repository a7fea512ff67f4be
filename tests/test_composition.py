"""Every option of every config group composes, names importable `_target_`s, and (where that is
CPU-safe and needs no file) instantiates; cross-field mistakes fail before any model loads."""

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from composing import CONF_DIR, compose_config
from rlvr.run import ConfigError, check, check_components, condition_label

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]
NEEDS_FILES = {("data", "math"), ("data", "jsonl"), ("data", "gsm8k")}  # read files at construction: see tests/data
NEEDS_USER_CODE = {("reward", "function")}  # names the user's function: see tests/reward
RUNTIME_ARGS = {"backend", "engine"}  # built by the trainer around the loaded model: tested in tests/{backend,engine}


def targets(node):
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield node._target_
        for v in node.values():
            yield from targets(v)
    elif isinstance(node, ListConfig):
        for v in node:
            yield from targets(v)


def test_groups_are_the_documented_ones():
    assert {"trainer", "algorithm", "transform", "engine", "backend", "reward", "model", "data"} <= set(GROUPS)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_builds(group, option):
    mandatory = {"jsonl": ["data.path=unused.jsonl"], "function": ["reward.function=examples_rewards.contains_answer"]}
    cfg = compose_config([f"{group}={option}"] + mandatory.get(option, []))
    for target in targets(cfg):
        try:
            get_class(target)
        except Exception:
            get_method(target)
    if group in cfg and (group, option) not in NEEDS_FILES | NEEDS_USER_CODE:
        built = instantiate(cfg[group], _convert_="all", _partial_=True)
        if group not in RUNTIME_ARGS:
            built(**({"seed": 0} if group == "data" else {}))


def test_first_key_of_every_option_is_target():
    for group, option in OPTIONS:
        text = (CONF_DIR / group / f"{option}.yaml").read_text()
        if text.startswith("# @package _global_"):
            continue  # conditions and campaigns are deltas to the whole config, not objects
        first = next(line for line in text.splitlines() if line and not line.startswith("#"))
        assert first.startswith(("_target_:", "defaults:", "# @package")), f"{group}/{option}.yaml starts with {first}"


def test_self_comes_first_in_train_yaml():
    defaults = OmegaConf.load(CONF_DIR / "train.yaml").defaults
    assert defaults[0] == "_self_"


def test_real_model_composition_is_valid():
    cfg = compose_config(["model=qwen3_4b", "data=math", "reward=math", "trainer=gpu"])
    check(cfg)
    preset = instantiate(cfg.model, _convert_="all")  # lazy: nothing is downloaded or loaded
    assert preset.name_or_path == "Qwen/Qwen3-4B-Instruct-2507" and preset.lora.rank == 32
    assert condition_label(cfg) == "grpo+none"


def test_unknown_option_and_unknown_key_fail_at_composition():
    with pytest.raises(ConfigCompositionException, match="algorithm"):
        compose_config(["algorithm=nope"])
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_config(["trainer.lrr=1"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["backend.micro_batch_size=5"], "backend.micro_batch_size=5 does not divide trainer.batch_size × "
                                         "trainer.group_size = 8 × 8 = 64"),
        (["trainer.group_size=1"], "trainer.group_size=1"),
        (["trainer.sampling.top_p=0"], "trainer.sampling.top_p=0"),
        (["trainer.lr=0"], "trainer.lr=0"),
        (["trainer.sampling.max_tokens=0"], "trainer.sampling.max_tokens=0"),
        (["trainer.save_every=-1"], "trainer.save_every=-1"),
    ],
)
def test_cross_field_mistakes_name_the_keys(overrides, message):
    with pytest.raises(ConfigError) as err:
        check(compose_config(overrides))
    assert message in str(err.value)


def test_all_mistakes_are_reported_together():
    with pytest.raises(ConfigError) as err:
        check(compose_config(["trainer.lr=0", "trainer.sampling.top_p=2"]))
    assert "trainer.lr=0" in str(err.value) and "trainer.sampling.top_p=2" in str(err.value)


class EntropyHungry:
    needs_entropy = True
    needs_planning = False


class NoEntropyEngine:
    provides_entropy = False


def test_entropy_transform_with_an_engine_that_cannot_give_it_fails_early():
    from types import SimpleNamespace

    cfg = compose_config([])
    cfg.engine._target_ = f"{__name__}.NoEntropyEngine"
    c = SimpleNamespace(transform=EntropyHungry(), data=SimpleNamespace(demonstrations=lambda: [1]),
                        preset=instantiate(cfg.model), reward=instantiate(cfg.reward))
    with pytest.raises(ConfigError, match="needs full-distribution entropy"):
        check_components(cfg, c)


def test_warmup_without_demonstrations_fails_early():
    from types import SimpleNamespace

    cfg = compose_config(["data=math"])  # trainer=cpu warms up; MATH has no demonstrations
    c = SimpleNamespace(transform=instantiate(cfg.transform), data=SimpleNamespace(demonstrations=lambda: []),
                        preset=instantiate(cfg.model), reward=instantiate(cfg.reward))
    with pytest.raises(ConfigError, match="trainer.warmup.steps=800"):
        check_components(cfg, c)
