"""A run's condition label and task come from its composed config (rlvr/labels.py), never from the name of a
Hydra choice; a `condition=` contradicted by `algorithm=`/`transform=` is refused (issue 21, requirement 1)."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from composing import CONF_DIR, compose_config, compose_options, options
from rlvr import config_check
from rlvr.labels import condition_label, name, register_resolvers, task_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("group", ["algorithm", "transform", "turn_credit", "env", "data", "reward", "backend"])
def test_every_option_is_named_as_its_file(group):
    """An option's label name is its own file name (an alias file, transform=gtpo_sepa, names the option it
    extends): the NAMES table cannot fall behind conf/."""
    for option, node in compose_options(group).items():
        if node is None:
            continue  # env=none
        node = node.get("env", node) if group == "env" else node  # env options are _global_: the node is `env`
        assert name(node) == config_check.canonical_option([CONF_DIR], group, option), (group, option)


def test_models_are_named_by_their_weights():
    models = compose_options("model")
    assert task_name({"data": {"_target_": "rlvr.data.arithmetic.Arithmetic"},
                      "reward": {"_target_": "rlvr.reward.exact.ExactMatch"}, "model": models["tiny"]}) == (
        "arithmetic-exact-tiny")
    math = {"data": {"_target_": "rlvr.data.math.MATH"}, "reward": {"_target_": "rlvr.reward.math.MathVerify"}}
    assert task_name({**math, "model": models["qwen3_0_6b"]}) == "math-math-qwen3-0.6b"


@pytest.mark.parametrize("overrides,label,task", [
    ([], "grpo+none", "arithmetic-exact-tiny"),
    (["condition=maxrl_gtpo_sepa"], "maxrl+sepa", "arithmetic-exact-tiny"),
    (["algorithm=maxrl", "transform=sepa"], "maxrl+sepa", "arithmetic-exact-tiny"),
    (["algorithm=maxrl", "transform=gtpo_sepa"], "maxrl+sepa", "arithmetic-exact-tiny"),  # an alias: the same config
    (["transform=sepa_amp_c"], "grpo+sepa_amp_c", "arithmetic-exact-tiny"),
    (["algorithm.scale=batch_std", "algorithm.loss.mode=kl_cov", "algorithm.loss.aggregation=prompt_mean"],
     "grpo+none,scale=batch_std,loss=kl_cov,agg=prompt_mean", "arithmetic-exact-tiny"),
    (["algorithm.loss.form=gspo", "algorithm.loss.aggregation=seq_mean_token_mean"],
     "grpo+none,form=gspo,agg=seq_mean_token_mean",
     "arithmetic-exact-tiny"),
    (["algorithm=reinforce_pp", "algorithm.loss.mode=kl_cov"], "reinforce_pp+none,loss=kl_cov",
     "arithmetic-exact-tiny"),
    (["condition=dapo"], "grpo+none,scale=std,clip=0.2/0.28,ds=refill,overlong=0.2", "arithmetic-exact-tiny"),
    (["condition=dr_grpo"], "grpo+none,agg=seq_mean_token_sum_norm,clip=0.2", "arithmetic-exact-tiny"),
    (["condition=scalerl"], "grpo+none,scale=batch_std,form=cispo,agg=prompt_mean,ds=filter", "arithmetic-exact-tiny"),
    (["algorithm.loss.clip_eps=0.2", "algorithm.loss.clip_eps_high=0.2", "trainer.overlong.buffer_frac=0.25",
      "trainer.overlong.penalty=0.5", "trainer.overlong.filter=true"],
     "grpo+none,clip=0.2,overlong=0.25x0.5,overlong_filter", "arithmetic-exact-tiny"),
    (["algorithm.loss.form=cispo", "algorithm.loss.cispo_max=2"], "grpo+none,form=cispo,cap=2",
     "arithmetic-exact-tiny"),
    (["trainer.off_policy_steps=2", "correction=token_tis", "algorithm.loss.correction.pi_old=decoupled"],
     "grpo+none,ahead=2,corr=token_tis/decoupled", "arithmetic-exact-tiny"),
    (["trainer.off_policy_steps=1", "trainer.off_policy_mode=bounded", "data=repeat"],
     "grpo+none,ahead=1/bounded", "repeat-exact-tiny"),
    (["trainer.off_policy_steps=4", "trainer.partial_rollouts=true"], "grpo+none,ahead=4/partial",
     "arithmetic-exact-tiny"),
    (["env=guess"], "grpo+none,turn=reward_to_go", "guess-arithmetic-tiny"),
    (["env=guess", "turn_credit=tl_grpo"], "grpo+none,turn=tl_grpo", "guess-arithmetic-tiny"),
    (["env=textarena"], "grpo+none,turn=episode", "textarena.GuessTheNumber-v0-arithmetic-tiny"),
    (["backend=tinker"], "grpo+none,backend=tinker", "arithmetic-exact-tiny"),
    (["backend=fsdp"], "grpo+none", "arithmetic-exact-tiny"),  # the same rollouts and update as one process
    (["correction=token_tis"], "grpo+none,corr=token_tis", "arithmetic-exact-tiny"),
    (["algorithm.loss.correction.pi_old=decoupled"], "grpo+none,corr=none/decoupled", "arithmetic-exact-tiny"),
    (["trainer=gpu"], "grpo+none,corr=token_tis", "arithmetic-exact-tiny"),
    (["data=jsonl", "data.path=/data/easy_sums.jsonl"], "grpo+none", "jsonl.easy_sums-exact-tiny"),
    (["reward=function", "reward.function=my_rewards.contains_answer"], "grpo+none",
     "arithmetic-function.contains_answer-tiny"),
])
def test_labels_and_tasks(overrides, label, task):
    config = OmegaConf.to_container(compose_config(overrides))
    assert (condition_label(config), task_name(config)) == (label, task)


def test_the_default_folder_is_named_from_the_config():
    register_resolvers()
    cfg = compose_config_with_hydra(["algorithm=maxrl", "algorithm.loss.mode=clip_cov"])
    folder = Path(OmegaConf.select(cfg, "hydra.run.dir"))
    assert folder.parent == Path("outputs/arithmetic-exact-tiny/maxrl+none,loss=clip_cov")


def compose_config_with_hydra(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("condition", [c for c in options("condition") if c != "none"])
def test_a_condition_agrees_with_its_own_choices_and_refuses_others(condition, monkeypatch):
    named = config_check.condition_choices(CONF_DIR / "condition" / f"{condition}.yaml")
    choices = {"condition": condition, **named}
    monkeypatch.setattr(config_check, "hydra_choice", choices.get)
    assert config_check.condition_errors(None) == []
    choices["algorithm"] = "discover_entropic"
    assert config_check.condition_errors(None) == [
        f"condition={condition} trains algorithm={named['algorithm']}, but algorithm=discover_entropic was chosen too: "
        "drop one of them, or say condition=none to train algorithm=discover_entropic"]
    choices["condition"] = "none"
    assert config_check.condition_errors(None) == []


def test_a_sweep_that_contradicts_its_conditions_is_refused_naming_both(tmp_path):
    """The issue's case: `--multirun condition=grpo,maxrl algorithm=reinforce_pp` trained REINFORCE++ twice under
    two names. Now the first job is refused (exit 2) before anything loads."""
    proc = subprocess.run([sys.executable, "train.py", "--multirun", "condition=grpo,maxrl", "algorithm=reinforce_pp",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("condition=grpo trains algorithm=grpo, but algorithm=reinforce_pp was chosen too: drop one of them, or say "
            "condition=none to train algorithm=reinforce_pp") in proc.stderr
    assert "Traceback" not in proc.stderr
