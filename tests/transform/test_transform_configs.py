"""Every conf/transform option builds its transform, states every constructor knob, and aliases match."""

import dataclasses
import inspect
import json

import pytest
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from composing import CONF_DIR, compose_options, options
from tests.transform.transform_cases import SCHEDULE, StepCase

NAMES = options("transform")  # every file in conf/transform/, so a new option is tested without editing a list
STEP = StepCase(group_size=2, length=3, adv_PG=[0.5, -0.5, 0.0, 0.0],
                logprobs_PG=[[-0.1, -0.2, -0.3], [-0.4, -0.5], [-0.1], [-0.2, -0.3]],
                entropies_PG=[[0.1, 0.2, 0.3], [0.4, 0.5], [0.1], [0.2, 0.3]],
                planning_PG=[[1, 0, 0], [0, 1], [0], [1, 0]])
"""One small step: two groups of two ragged completions, one group tied, planning tokens in three."""


@pytest.fixture(scope="module")
def composed() -> dict[str, DictConfig]:
    """Each option as `python train.py transform=<name>` composes it (options extend each other)."""
    return compose_options("transform")


def requires(cfg: DictConfig) -> set[str]:
    return set(get_class(cfg._target_).needs(OmegaConf.to_container(cfg, resolve=True)).requires)


@pytest.mark.parametrize("name", NAMES)
def test_option_builds_and_states_every_knob(name, composed):
    cfg = composed[name]
    assert next(iter(cfg)) == "_target_"
    for node in [cfg] + [v for v in cfg.values() if isinstance(v, DictConfig)]:  # the node, and transform.schedule
        params = set(inspect.signature(get_class(node._target_).__init__).parameters) - {"self", "args", "kwargs"}
        assert set(node) - {"_target_"} == params  # nothing left to a Python default, nothing unknown
    transform = instantiate(cfg)
    assert "entropy" not in requires(cfg)  # uncertainty: surprisal everywhere by default
    assert ("planning_mask" in requires(cfg)) == reads_planning(transform), "declares planning_mask iff it reads it"
    state = transform.state_dict()  # what a checkpoint stores (JSON) and a resume gives back
    assert json.loads(json.dumps(state)) == state
    transform.load_state_dict(state)
    assert transform.state_dict() == state


def reads_planning(transform) -> bool:
    """Whether the transform reads the planning mask: a step without one is refused (rlvr/transform/signals.py)."""
    try:
        transform(STEP.adv(), dataclasses.replace(STEP.signals(correct_rate=1.0), planning_PG_T=None))
    except ValueError as err:
        return "planning_PG_T" in str(err)
    return False


def aliases() -> list[tuple[str, str]]:
    """Options whose file only extends another option, unchanged: (alias, original)."""
    found = []
    for name in NAMES:
        raw = OmegaConf.load(CONF_DIR / "transform" / f"{name}.yaml")
        if set(raw) == {"defaults"} and len(raw.defaults) == 1 and isinstance(raw.defaults[0], str):
            found.append((name, raw.defaults[0]))
    return found


def test_the_predecessors_names_are_aliases():
    assert {("gtpo_hicra", "hicra"), ("gtpo_sepa", "sepa")} <= set(aliases())  # retrain's names for them


@pytest.mark.parametrize("alias, original", aliases())
def test_aliases_compose_to_their_original(alias, original, composed):
    assert composed[alias] == composed[original]


def test_sepa_defaults_are_the_predecessors(composed):
    # retrain: [sepa] steps 500, schedule linear, delay_steps 50, correct_rate_gate 0.1; [gtpo] beta 0.1; hicra α 0.2
    cfg = composed["sepa"]
    s = cfg.schedule
    assert (s.steps, s.kind, s.delay_steps, s.correct_rate_gate, cfg.beta) == (500, "linear", 50, 0.1, 0.1)
    assert composed["hicra"].alpha == 0.2


@pytest.mark.parametrize("name", NAMES)
def test_shannon_entropy_override_asks_for_entropy(name, composed):
    cfg = composed[name].copy()
    if "uncertainty" not in cfg:
        pytest.skip(f"transform={name} reads no token uncertainty")
    cfg.uncertainty = "shannon_entropy"
    assert "entropy" in requires(cfg)
    instantiate(cfg)


def test_delight_defaults_are_the_predecessors(composed):
    # retrain §3.9: delight_eta 1.0 (fixed), eta_min 0.05, eta_max 5.0, target_neutral_frac 0.5, ordering gap and
    # EMA off; normalisation none for delight, scale for delight_sepa; hard_delight k_frac 0.2; no λ override
    eta = ("eta", "eta_mode", "eta_min", "eta_max", "eta_target_neutral_frac", "eta_target_ordering_gap",
           "eta_ema_decay")
    for name in ("delight", "delight_sepa"):
        assert tuple(composed[name][k] for k in eta) == (1.0, "fixed", 0.05, 5.0, 0.5, 0.0, 0.0)
    assert (composed["delight"].norm, composed["delight_sepa"].norm) == ("none", "scale")
    assert composed["hard_delight"].k_frac == 0.2
    assert composed["delight_sepa"].schedule.fixed_lambda is None
    assert composed["hard_delight"].schedule.fixed_lambda is None


@pytest.mark.parametrize("name", NAMES)
def test_the_lambda_schedule_is_one_node_stated_once(name, composed):
    """An option whose class takes a λ schedule has transform.schedule, conf/lambda_schedule.yaml, included (or
    extended from sepa.yaml), never restated: an option file names none of its knobs, and the schedule is the same
    node, with the tests' defaults, everywhere. An option whose class takes none has none."""
    takes = "schedule" in inspect.signature(get_class(composed[name]._target_)).parameters
    assert ("schedule" in composed[name]) == takes
    if not takes:
        return
    schedule = composed[name].schedule
    assert schedule._target_ == "rlvr.transform.sepa_controller.LambdaSchedule"
    assert {k: schedule[k] for k in SCHEDULE} == SCHEDULE == {
        k: v for k, v in OmegaConf.load(CONF_DIR / "lambda_schedule.yaml").items() if k != "_target_"}
    raw = OmegaConf.load(CONF_DIR / "transform" / f"{name}.yaml")
    assert not set(raw) & (set(SCHEDULE) | {"schedule"}), f"{name}.yaml restates the λ schedule's knobs"
    assert schedule == composed["sepa"].schedule
