"""Every conf/transform option builds its transform, states every constructor knob, and aliases match."""

import inspect
from pathlib import Path

import pytest
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf" / "transform"
OURS = ["gtpo", "hicra", "gtpo_hicra", "sepa", "gtpo_sepa", "sepa_amp", "sepa_amp_c", "entropy_mask"]


@pytest.mark.parametrize("name", OURS)
def test_option_builds_and_states_every_knob(name):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert next(iter(cfg)) == "_target_"
    params = set(inspect.signature(get_class(cfg._target_).__init__).parameters) - {"self"}
    assert set(cfg) - {"_target_"} == params  # nothing left to a Python default, nothing unknown
    transform = instantiate(cfg)
    assert transform.needs_entropy is False  # uncertainty: surprisal everywhere by default
    assert transform.needs_planning is (name not in ("gtpo", "entropy_mask"))
    assert transform.state_dict() is not None


@pytest.mark.parametrize("alias, original", [("gtpo_hicra", "hicra"), ("gtpo_sepa", "sepa")])
def test_predecessor_names_are_exact_aliases(alias, original):
    assert OmegaConf.load(CONF / f"{alias}.yaml") == OmegaConf.load(CONF / f"{original}.yaml")


def test_sepa_defaults_are_the_spec_defaults():
    # spec §16: [sepa] steps 500, schedule linear, delay_steps 50, correct_rate_gate 0.1; [gtpo] beta 0.1
    cfg = OmegaConf.load(CONF / "sepa.yaml")
    assert (cfg.steps, cfg.schedule, cfg.delay_steps, cfg.correct_rate_gate, cfg.beta) == (
        500,
        "linear",
        50,
        0.1,
        0.1,
    )
    assert OmegaConf.load(CONF / "hicra.yaml").alpha == 0.2


@pytest.mark.parametrize("name", OURS)
def test_shannon_entropy_override_asks_for_entropy(name):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    cfg.uncertainty = "shannon_entropy"
    assert instantiate(cfg).needs_entropy is True
