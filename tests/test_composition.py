"""Every option of every config group composes, names importable `_target_`s, and (where that is
CPU-safe and needs no file) instantiates; cross-field mistakes fail before any model loads."""

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from composing import CONF_DIR, compose_config, groups, options
from rlvr.build import build_all, build_env, check_components
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.labels import condition_label
from rlvr.protocols import Needs
from rlvr.requirements import EnvVar
from tests.hub_models import answering_hub

GROUPS = groups()  # read from conf/ (nested groups as algorithm/loss), so a new option file is tested here
OPTIONS = [(g, o) for g in GROUPS for o in options(g)]
# A value for every mandatory (???) key an option leaves to the command line; an option with a new one fails
# below until it gets a stand-in here.
MANDATORY = {
    "data.path": "unused.jsonl",
    "reward.function": "examples_rewards.contains_answer",
    "model.name_or_path": "Qwen/Qwen3-0.6B",  # Pretrained is lazy: nothing is downloaded or loaded
    "env.environment": "tests.env.verifiers_game",  # env=verifiers: no verifiers package installs offline
    "distill.teacher.path": "outputs/teacher",  # LocalTeacher loads at start, not when built
    "distill.teacher.base_url": "http://127.0.0.1:8000/v1",  # ServerTeacher asks nothing when built
    "distill.teacher.model": "teacher",
}
RUNTIME_ARGS = {"backend", "engine"}  # built by the trainer around the loaded model: tested in tests/{backend,engine}


def reads_at_construction(node: DictConfig) -> bool:
    """A data source with a `path` reads its file (or, path null, the hub) when built: see tests/data."""
    return "path" in node


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
    cfg = compose_config([f"{group}={option}"])
    missing = OmegaConf.missing_keys(cfg)
    assert missing <= set(MANDATORY), f"{group}={option} leaves {missing - set(MANDATORY)} mandatory: add to MANDATORY"
    for key in missing:
        OmegaConf.update(cfg, key, MANDATORY[key])
    for target in targets(cfg):
        try:
            get_class(target)
        except Exception:
            get_method(target)
    node = OmegaConf.select(cfg, group.replace("/", "."))  # the option's package (campaigns, conditions: global)
    if group in ("campaign", "condition") or node is None:
        return  # deltas to the whole config, not objects; or no object at all (env=none composes `env: null`)
    assert next(iter(node)) == "_target_", f"{group}={option} composes with {next(iter(node))} first"
    if group == "data" and reads_at_construction(node):
        return
    if group == "env":  # as a run builds it: its tool keys (env.max_tool_calls, …) go to the tool harness
        build_env(cfg)
        return
    built = instantiate(node, _convert_="all", _partial_=True)
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


def test_real_model_composition_is_valid(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online, weights not cached: downloaded at start, not an error
    cfg = compose_config(["model=qwen3_4b", "data=math", "reward=math", "trainer=gpu"])
    with answering_hub() as hub:  # the hub answers (a loopback stand-in: this machine has no network)
        monkeypatch.setenv("HF_ENDPOINT", hub)
        check(cfg)
    preset = instantiate(cfg.model, _convert_="all")  # lazy: nothing is downloaded or loaded
    assert preset.name_or_path == "Qwen/Qwen3-4B-Instruct-2507" and preset.lora.rank == 32
    assert condition_label(cfg) == "grpo+none,corr=token_tis"  # trainer=gpu corrects for a bf16 engine


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
    """A new transform with a new requirement: it declares it in its own `needs`, nothing else changes."""

    @classmethod
    def needs(cls, settings):
        return Needs(requires={"entropy": "it reads the whole distribution"}, machine=(
            EnvVar("RLVR_TEST_NO_SUCH_KEY", "transform.key_env"),))


class SamplesAlone:
    """A new engine that gives nothing but what it declares (no entropies, no per-group seeded sampling), as
    engine=vllm would, without needing vLLM installed: this test runs wherever the README's test command does."""

    @classmethod
    def needs(cls, settings):
        return Needs(requires={"local_policy": "it samples from the trained module"})


def test_what_a_component_declares_is_checked_before_anything_is_built(monkeypatch):
    monkeypatch.delenv("RLVR_TEST_NO_SUCH_KEY", raising=False)
    cfg = compose_config(["backend=fsdp"])  # neither it nor the engine gives entropies (backend=local would)
    cfg.engine = OmegaConf.create({"_target_": f"{__name__}.SamplesAlone"})
    cfg.transform = OmegaConf.create({"_target_": f"{__name__}.EntropyHungry"})
    with pytest.raises(ConfigError) as err:
        build_all(cfg)
    assert str(err.value).splitlines()[1:] == [
        f"  transform <{__name__}.EntropyHungry> needs full-distribution entropy at each sampled position (it reads "
        "the whole distribution), which no chosen component gives: choose engine=pytorch, or backend=local (the "
        "backend computes them in a no-grad pass)",
        "  backend <rlvr.backend.fsdp.FSDPBackend> needs sampling that draws each prompt group from its own seeded "
        "generator (backend=fsdp: each rank samples its own share of the groups), which no chosen component gives: "
        "choose engine=pytorch",
        f"  transform <{__name__}.EntropyHungry>: needs an API key in $RLVR_TEST_NO_SUCH_KEY: $RLVR_TEST_NO_SUCH_KEY "
        "is not set (transform.key_env names it)",
    ]


def test_warmup_without_demonstrations_fails_early():
    from types import SimpleNamespace

    cfg = compose_config(["data=math"])  # trainer=cpu warms up; MATH has no demonstrations
    c = SimpleNamespace(data=SimpleNamespace(demonstrations=lambda: []), env=None)
    with pytest.raises(ConfigError, match="trainer.warmup.steps=800"):
        check_components(cfg, c)
