"""Multi-turn runs through `rlvr.run.run`: env=none is the single-turn path of before (metrics.jsonl as stored
from the commit before multi-turn existed), env=guess plays episodes end to end, turn credit is wired."""

import json
from pathlib import Path

import pytest

from composing import FAST, MIXED, compose_config
from rlvr.build import build_all
from rlvr.errors import ConfigError
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run

FIXTURE = Path(__file__).parent / "fixtures" / "single_turn_metrics.jsonl"
ADDED_SINCE = {"mismatch/kl", "mismatch/ratio_mean", "mismatch/ratio_max", "mismatch/ratio_min",
               "mismatch/seq_ratio_max", "mismatch/masked_frac", "mismatch/abs_log_ratio", "engine/sync_bytes_written"}
"""Step-row metrics the fixture predates (and `engine/sync_*` on the steps the sync check reads)."""
CHECKED = {"engine/sync_delta", "engine/sync_allowed"}


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))
    return a == b


def test_env_none_keeps_the_single_turn_metrics_of_before(tmp_path):
    """The fixture: `python train.py <FAST + MIXED> trainer.max_steps=4`'s deterministic fields, as stored at
    commit 609b665 (before episodes, action masks and the env group) and regenerated once when single-turn sampling
    moved to one seed per group (issue 22: the rollout seam; the same seed samples other completions since).
    Floats within 1e-5 relative (another CPU's kernels may round differently); everything else equal. Metrics
    added since (the `mismatch/*` telemetry and `engine/sync_bytes_written` of issue 23) are the only keys the
    fixture lacks."""
    run(compose_config(FAST + MIXED + ["trainer.max_steps=4"]), tmp_path)
    added = [{k: v for k, v in r.items() if k in ADDED_SINCE} for r in rows(tmp_path)]
    now = [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS | ADDED_SINCE | CHECKED}
           for r in rows(tmp_path)]
    before = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert [sorted(r) for r in now] == [sorted(r) for r in before]
    assert all(set(a) == ADDED_SINCE for a, r in zip(added, now, strict=True) if "loss" in r)
    checked = [r["engine/sync_delta"] for r in rows(tmp_path) if "engine/sync_delta" in r]
    assert checked and max(checked) < 1e-5  # every step that trained: the engine serves the policy
    for a, b in zip(now, before, strict=True):
        assert all(close(a[k], b[k]) for k in a), {k: (a[k], b[k]) for k in a if not close(a[k], b[k])}
    assert any(not r.get("skipped", True) for r in now), "the comparison must cover steps that trained"


GUESS = FAST + ["env=guess", "trainer.max_steps=3", "trainer.eval_every=2", "data.eval_size=20",
                "trainer.sampling.max_tokens=2", "trainer.eval_max_tokens=2"]


@pytest.mark.parametrize(("turn_credit", "transform"), [("episode", "none"), ("reward_to_go", "sepa")])
def test_guess_plays_episodes_end_to_end(tmp_path, turn_credit, transform):
    """A per-turn credit and a token transform combine (SEPA weights each turn's advantage, planning marks
    and entropies read on action tokens only)."""
    summary = run(compose_config(GUESS + [f"turn_credit={turn_credit}", f"transform={transform}"]), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    evals = [r for r in rows(tmp_path) if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [0, 1, 2] and [r["step"] for r in evals] == [0, 2, 3]
    assert all(("sepa_lambda" in r) == (transform == "sepa") for r in steps)
    for r in steps:
        assert 1.0 <= r["env/turns_mean"] <= 3.0 and r["env/action_tokens"] > 0
        assert {"env/truncated_frac", "env/error_frac", "env/timeout_frac", "env/turn_0_reward_mean",
                "env/step_time_s", "env/observation_tokens"} <= r.keys()
    assert {"eval/turns_mean", "eval/truncated_frac"} <= evals[0].keys() and evals[0]["eval/examples"] == 20
    group = json.loads((tmp_path / "samples" / "step_000000.jsonl").read_text().splitlines()[0])
    assert group["prompt"] == "=" and [t[0] for t in group["transcripts"]] == [{"role": "env", "text": "="}] * 8
    assert all(t["role"] in ("env", "policy") for episode in group["transcripts"] for t in episode)
    for episode, advantages in zip(group["transcripts"], group["token_advantages"], strict=True):  # turn by turn
        assert sum((t["advantages"] for t in episode if t["role"] == "policy"), []) == advantages
    state = json.loads((tmp_path / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["turn_credit"] == {} and summary["steps"] == 3


def test_guess_warms_up_on_its_own_games(tmp_path):
    run(compose_config(GUESS + ["trainer.warmup.steps=3", "trainer.warmup.batch_size=4", "trainer.max_steps=1"]),
        tmp_path)
    warm = [json.loads(line) for line in (tmp_path / "warmup.jsonl").read_text().splitlines()]
    assert [r["step"] for r in warm] == [0, 1, 2] and all(r["loss"] > 0 for r in warm)


@pytest.mark.parametrize("branch_mode", ["action_space", "llm"])
def test_tl_grpo_probes_branches_and_keeps_its_baseline_in_the_checkpoint(tmp_path, branch_mode):
    run(compose_config(GUESS + ["turn_credit=tl_grpo", f"turn_credit.branch_mode={branch_mode}", "transform=gtpo"]),
        tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    for r in steps:
        assert r["env/probe_time_s"] > 0 and 0.0 < r["turn_credit/tl_grpo_covered_fraction"] <= 1.0
        assert r["turn_credit/tl_grpo_branched_turn_fraction"] > 0
    # EMA from 0.5 with decay 0.9, once per episode: it moves every step and is what the checkpoint holds
    emas = [r["train/tl_grpo_ema_baseline"] for r in steps]
    assert len(set(emas)) == 3
    state = json.loads((tmp_path / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["turn_credit"] == {"ema": emas[-1]}


def test_tl_grpo_action_space_needs_an_environment_that_lists_its_actions():
    with pytest.raises(ConfigError, match="branch_mode=llm"):
        build_all(compose_config(FAST + ["env=retry", "turn_credit=tl_grpo"]))
    build_all(compose_config(FAST + ["env=retry", "turn_credit=tl_grpo", "turn_credit.branch_mode=llm"]))
