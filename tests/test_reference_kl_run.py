"""One short real run with the reference KL in the reward and an entropy bonus, under full fine-tuning
(rlvr/algorithm/kl.py; the trainer's reference pass before credit assignment, the backend's frozen copy)."""

import json

import pytest

from composing import FAST, MIXED, compose_config
from rlvr.run import run


def test_a_run_with_kl_in_the_reward_and_an_entropy_bonus(tmp_path):
    overrides = FAST + MIXED + ["trainer.max_steps=2", "trainer.evaluate=false", "model.lora=null",
                                "algorithm.kl.coef=0.05", "algorithm.kl.where=reward", "algorithm.entropy_coef=0.01"]
    run(compose_config(overrides), tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [0, 1]
    assert {r["condition"] for r in steps} == {"grpo+none,kl=0.05/reward,ent=0.01"}
    for r in steps:  # the reward pass runs on every step; k1 of the sampler against the reference
        assert r["policy/kl_coef"] == 0.05 and "policy/kl_reward_penalty" in r
    # step 0 samples from the base itself: the reference's log-probabilities are the sampler's up to float noise
    assert steps[0]["policy/kl_ref"] == pytest.approx(0.0, abs=1e-4)
    trained = [r for r in steps if not r["skipped"]]
    assert trained and all(r["policy/entropy"] > 0 and r["policy/entropy_coef"] == 0.01 for r in trained)
