"""The five arms of the predecessor's ablation are config files, each the same run as its
algorithm + transform pair, and each trains on the tiny model."""

import json
import math

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file

from composing import CONF_DIR, FAST, compose_config
from rlvr.run import condition_label, run

ARMS = {
    "grpo": ("grpo", "none"),
    "maxrl": ("maxrl", "none"),
    "maxrl_gtpo": ("maxrl", "gtpo"),
    "maxrl_gtpo_hicra": ("maxrl", "hicra"),
    "maxrl_gtpo_sepa": ("maxrl", "sepa"),
}


def test_the_five_arms_are_there():
    assert sorted(p.stem for p in (CONF_DIR / "condition").glob("*.yaml")) == sorted(ARMS)


@pytest.mark.parametrize("condition", ARMS)
def test_condition_is_the_same_run_as_its_pair(condition):
    algorithm, transform = ARMS[condition]
    by_name = compose_config([f"condition={condition}"])
    by_pair = compose_config([f"algorithm={algorithm}", f"transform={transform}"])
    assert OmegaConf.to_container(by_name) == OmegaConf.to_container(by_pair)
    assert condition_label(by_name) == f"{algorithm}+{transform}"


def test_command_line_overrides_beat_the_condition():
    cfg = compose_config(["condition=maxrl_gtpo_sepa", "transform.beta=0.3", "transform.delay_steps=0"])
    assert cfg.algorithm._target_.endswith("MaxRL") and cfg.transform.beta == 0.3 and cfg.transform.delay_steps == 0


def test_condition_files_are_deltas_with_a_header():
    for path in (CONF_DIR / "condition").glob("*.yaml"):
        lines = path.read_text().splitlines()
        assert lines[0] == "# @package _global_"
        assert any(f"condition={path.stem}" in line for line in lines if line.startswith("#"))  # how to run it
        body = OmegaConf.load(path)
        assert set(body) == {"defaults"}, f"{path.name} should only pick options (deltas)"



@pytest.mark.parametrize("condition", ARMS)
def test_every_condition_trains(condition, warm, tmp_path):
    # SEPA's gate and delay would keep λ = 0 for 50 steps: open them so its pooling really runs here
    sepa = ["transform.delay_steps=0", "transform.correct_rate_gate=0", "transform.steps=4"]
    extra = sepa if condition == "maxrl_gtpo_sepa" else []
    run(compose_config(FAST + warm + [f"condition={condition}", "trainer.max_steps=4"] + extra), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and not r["skipped"]]
    assert steps, "the warmed-up policy gives mixed groups, so steps train"
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in steps)
    adapter = load_file(tmp_path / "checkpoints/step_4/adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: it moved
    if condition == "maxrl_gtpo_sepa":
        assert [r["sepa_lambda"] for r in rows if "loss" in r] == [0.0, 0.25, 0.5, 0.75]  # (step − 0)/4
    if condition == "maxrl_gtpo_hicra":
        sample = json.loads((tmp_path / "samples/step_000000.jsonl").read_text().splitlines()[0])
        assert len(sample["planning"]) == len(sample["tokens"]) == len(sample["completions"])
        assert "planning_token_fraction" in steps[0]


def test_entropy_signal_runs_end_to_end(tmp_path):
    cfg = compose_config(FAST + ["transform=gtpo", "transform.uncertainty=shannon_entropy", "trainer.max_steps=1"])
    run(cfg, tmp_path)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    assert row["uncertainty_kind"] == "shannon_entropy"
