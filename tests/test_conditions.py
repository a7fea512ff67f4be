"""Every condition in conf/condition/ is a config file holding only its choices (an algorithm + transform pair),
the same run as that pair, and trains on the tiny model; the campaigns' grids name existing conditions."""

import json
import math

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file

from composing import CONF_DIR, FAST, MIXED, compose_config, composer, option_defaults, options
from rlvr.run import run

CONDITIONS = [c for c in options("condition") if c != "none"]
"""Every arm in conf/condition/, so a new one is tested without editing a list (`none` names no arm: it lets
`algorithm=` and `transform=` stand, tests/test_labels.py)."""


def picks(condition: str) -> list[str]:
    """The condition's own defaults list as command-line choices, e.g. ["algorithm=maxrl", "transform=sepa"]."""
    return [f"{group}={option}" for group, option in option_defaults("condition", condition).items()]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_condition_is_the_same_run_as_its_pair(condition):
    assert {p.split("=")[0] for p in picks(condition)} == {"algorithm", "transform"}, "a condition is an arm: both"
    by_name = compose_config([f"condition={condition}"])
    by_pair = compose_config(picks(condition))
    assert OmegaConf.to_container(by_name) == OmegaConf.to_container(by_pair)


def test_command_line_overrides_beat_the_condition():
    cfg = compose_config(["condition=maxrl_gtpo_sepa", "transform.beta=0.3", "transform.schedule.delay_steps=0"])
    assert cfg.algorithm._target_.endswith("MaxRL") and cfg.transform.beta == 0.3
    assert cfg.transform.schedule.delay_steps == 0


@pytest.mark.parametrize("condition", CONDITIONS)
def test_condition_files_are_deltas_with_a_header(condition):
    path = CONF_DIR / "condition" / f"{condition}.yaml"
    lines = path.read_text().splitlines()
    assert lines[0] == "# @package _global_"
    usage = [line for line in lines if line.startswith("#") and f"condition={condition}" in line]
    assert usage, "the header says how to run it"
    assert all(pick in usage[0] for pick in picks(condition)), f"the header's equivalent pair is not {picks(condition)}"
    assert set(OmegaConf.load(path)) == {"defaults"}, f"{path.name} should only pick options (deltas)"


def test_campaign_grids_name_existing_conditions():
    with composer() as compose:
        for campaign in options("campaign"):
            params = compose([f"campaign={campaign}"], hydra=True).hydra.sweeper.params
            assert set(str(params.condition).split(",")) <= set(CONDITIONS), campaign


@pytest.mark.parametrize("condition", CONDITIONS)
def test_every_condition_trains(condition, tmp_path):
    transform = compose_config([f"condition={condition}"]).transform
    scheduled = "schedule" in transform  # SEPA's λ schedule
    # its gate and delay would keep λ = 0 for 50 steps: open them so that the pooling really runs here
    extra = ["transform.schedule.delay_steps=0", "transform.schedule.correct_rate_gate=0",
             "transform.schedule.steps=4"] if scheduled else []
    run(compose_config(FAST + MIXED + [f"condition={condition}", "trainer.max_steps=4"] + extra), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and not r["skipped"]]
    assert steps, "mixed rewards: steps train"
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in steps)
    adapter = load_file(tmp_path / "checkpoints/step_4/adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: it moved
    if scheduled:
        assert [r["sepa_lambda"] for r in rows if "loss" in r] == [0.0, 0.25, 0.5, 0.75]  # (step − 0)/4
    if "alpha" in transform:  # HICRA's planning credit
        sample = json.loads((tmp_path / "samples/step_000000.jsonl").read_text().splitlines()[0])
        assert len(sample["planning"]) == len(sample["tokens"]) == len(sample["completions"])
        assert "planning_token_fraction" in steps[0]


def test_entropy_signal_runs_end_to_end(tmp_path):
    cfg = compose_config(FAST + ["transform=gtpo", "transform.uncertainty=shannon_entropy", "trainer.max_steps=1"])
    run(cfg, tmp_path)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    assert row["uncertainty_kind"] == "shannon_entropy"
