"""Every condition in conf/condition/ is a config file holding its choices (an algorithm + transform pair) and, for a
published recipe (dapo, dr_grpo, …), the values of the objective it sets (under `algorithm`, and the trainer's
dynamic sampling and overlong handling); it is the same run as that pair with those values, composes to exactly its
paper's choices, and trains on the tiny model; the campaigns' grids name existing conditions."""

import json
import math

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file

from composing import CONF_DIR, FAST, MIXED, compose_config, composer, option_defaults, options
from rlvr.cli.runs import CONDITION_GROUPS
from rlvr.run import run

CONDITIONS = [c for c in options("condition") if c != "none"]
"""Every arm in conf/condition/, so a new one is tested without editing a list (`none` names no arm: it lets
`algorithm=` and `transform=` stand, tests/test_labels.py)."""


RECIPE_KEYS = CONDITION_GROUPS
"""What a recipe condition may set besides its pair: the keys rlvr/labels.py shows, which `rlvr compare` lets differ
between conditions, so that two recipes are two labels."""

# Published choices, from the papers (docs/conditions.md cites each), of the recipes that follow one:
# key → value. A recipe of your own needs no entry here.
PUBLISHED = {
    "dapo": {  # DAPO, arXiv 2503.14476: §3.1 Clip-Higher, §3.2 dynamic sampling, §3.3 token-level loss, §3.4
        # overlong reward shaping (L_max 20480, L_cache 4096); eq. 1's group-normalised advantage; no KL (§2.3)
        "algorithm.scale": "std", "algorithm.loss.clip_eps": 0.2, "algorithm.loss.clip_eps_high": 0.28,
        "algorithm.loss.aggregation": "token_mean", "algorithm.kl.coef": 0.0, "trainer.dynamic_sampling": "refill",
        "trainer.max_sample_batches": 10, "trainer.overlong.buffer_frac": 4096 / 20480,
        "trainer.overlong.penalty": 1.0, "trainer.overlong.filter": False, "algorithm.loss.form": "ppo"},
    "dr_grpo": {  # Dr. GRPO, arXiv 2503.20783 §3.2: no std, no 1/|o_i|: a constant (the generation budget); PPO clip
        "algorithm.scale": "none", "algorithm.loss.aggregation": "seq_mean_token_sum_norm",
        "algorithm.loss.aggregation_norm": 8, "algorithm.loss.clip_eps": 0.2, "algorithm.loss.clip_eps_high": 0.0,
        "algorithm.kl.coef": 0.0, "trainer.dynamic_sampling": "off", "algorithm.loss.form": "ppo"},
    "gspo": {  # GSPO, arXiv 2507.18071 §4.1 and §5.1: sequence ratio, clip (3e-4, 4e-4), 1/G Σ_i
        "algorithm.loss.form": "gspo", "algorithm.scale": "std", "algorithm.loss.clip_eps": 3e-4,
        "algorithm.loss.clip_eps_high": 4e-4, "algorithm.loss.aggregation": "seq_mean_token_mean",
        "algorithm.kl.coef": 0.0},
    "cispo": {  # MiniMax-M1, arXiv 2506.13585 §3.1: sg(clip(r, ·, ε_high^IS))·Â·log π, Σ_i Σ_t / Σ_i |o_i|
        "algorithm.loss.form": "cispo", "algorithm.loss.cispo_max": 5.0, "algorithm.loss.clip_eps": 0.0,
        "algorithm.scale": "std", "algorithm.loss.aggregation": "token_mean", "algorithm.kl.coef": 0.0},
    "grpo_std": {  # DeepSeekMath, arXiv 2402.03300 §4.1: (r − mean)/std, 1/G Σ_i 1/|o_i| Σ_t, clip, β = 0.04 (k3)
        "algorithm.scale": "std", "algorithm.loss.aggregation": "seq_mean_token_mean", "algorithm.loss.clip_eps": 0.2,
        "algorithm.kl.coef": 0.04, "algorithm.kl.estimator": "k3", "algorithm.kl.where": "loss",
        "algorithm.loss.form": "ppo"},
    "scalerl": {  # ScaleRL, arXiv 2510.13786 §3.2: CISPO, prompt-level aggregation, batch-level advantage
        # normalisation, zero-variance filtering (synchronous here: no PipelineRL-8)
        "algorithm.loss.form": "cispo", "algorithm.loss.cispo_max": 5.0, "algorithm.loss.aggregation": "prompt_mean",
        "algorithm.scale": "batch_std", "trainer.dynamic_sampling": "filter", "algorithm.kl.coef": 0.0,
        "trainer.off_policy_steps": 0},
    "grpo_entropy": {  # MaxRL, arXiv 2602.02710, maze and GSM8K tables: GRPO (with entropy bonus), its appendix's
        # (r − mean)/(std + 1e-6); coefficient not printed: verl's former default entropy_coeff 0.001
        "algorithm.scale": "std", "algorithm.scale_eps": 1e-6, "algorithm.entropy_coef": 0.001,
        "algorithm.kl.coef": 0.0},
    "grpo_scaled": {  # the same paper's "GRPO" row: (r − mean)/(std + 1e-6), nothing more (no KL, no entropy)
        "algorithm.scale": "std", "algorithm.scale_eps": 1e-6, "algorithm.entropy_coef": 0.0,
        "algorithm.kl.coef": 0.0},
    "pkpo_t16": {  # the same paper's "PKPO (T = 16)" row
        "algorithm.k": 16, "algorithm.kl.coef": 0.0},
}


def picks(condition: str) -> list[str]:
    """The condition's own defaults list as command-line choices, e.g. ["algorithm=maxrl", "transform=sepa"]."""
    return [f"{group}={option}" for group, option in option_defaults("condition", condition).items()]


def values(condition: str) -> dict[str, object]:
    """The values a condition file sets besides its defaults list, as dotted keys."""
    data = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "condition" / f"{condition}.yaml"))
    data.pop("defaults")

    def flat(node, prefix):
        for key, value in node.items():
            yield from flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]

    return dict(flat(data, ""))


@pytest.mark.parametrize("condition", CONDITIONS)
def test_condition_is_the_same_run_as_its_pair_with_its_values(condition):
    groups = {p.split("=")[0] for p in picks(condition)}
    assert {"algorithm", "transform"} <= groups <= {"algorithm", "transform", "distill"}, "a condition is an arm: both"
    by_name = compose_config([f"condition={condition}"])
    by_pair = compose_config(picks(condition) + [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                                 for k, v in values(condition).items()])
    assert OmegaConf.to_container(by_name) == OmegaConf.to_container(by_pair)


def test_every_published_recipe_composes_to_its_papers_choices():
    assert set(PUBLISHED) <= {c for c in CONDITIONS if values(c)}, "a published recipe is a condition setting values"
    for recipe, published in PUBLISHED.items():
        cfg = compose_config([f"condition={recipe}"])
        composed = {key: OmegaConf.select(cfg, key) for key in published}
        assert composed == published, recipe


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
    assert all(any(k == p or k.startswith(p + ".") for p in RECIPE_KEYS) for k in values(condition)), \
        f"{path.name} should pick options and set only the objective's values (deltas)"
    pair, header = compose_config(picks(condition)), " ".join(lines)
    changed = [k for k, v in values(condition).items() if OmegaConf.select(pair, k) != v]
    assert all(f"{k}=" in header for k in changed), "the header's equivalent command names each value it changes"


def test_campaign_grids_name_existing_conditions():
    with composer() as compose:
        for campaign in options("campaign"):
            params = compose([f"campaign={campaign}"], hydra=True).hydra.sweeper.params
            assert set(str(params.condition).split(",")) <= set(CONDITIONS), campaign


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """condition=opd's teacher: a run of 0 steps (its policy is the students' start)."""
    folder = tmp_path_factory.mktemp("teacher")
    run(compose_config(FAST + ["trainer.max_steps=0", "trainer.evaluate=false"]), folder)
    return folder


@pytest.mark.parametrize("condition", CONDITIONS)
def test_every_condition_trains(condition, tmp_path, request):
    transform = compose_config([f"condition={condition}"]).transform
    scheduled = "schedule" in transform  # SEPA's λ schedule
    # its gate and delay would keep λ = 0 for 50 steps: open them so that the pooling really runs here
    extra = ["transform.schedule.delay_steps=0", "transform.schedule.correct_rate_gate=0",
             "transform.schedule.steps=4"] if scheduled else []
    # pkpo_t16: k = 16 needs G ≥ 16; at G = k only groups with exactly one correct completion train, so G = 2k
    k = compose_config([f"condition={condition}"]).algorithm.get("k", 1)
    extra += [f"trainer.group_size={2 * k}"] if k > compose_config(FAST).trainer.group_size else []
    distill = compose_config([f"condition={condition}"]).get("distill")
    extra += [f"distill.teacher.path={request.getfixturevalue('teacher')}"] if distill else []
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
