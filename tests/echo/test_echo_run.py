"""A short `env=guess echo=on` run (model=tiny): the echo/* metrics are in every step row and the losses finite."""

import json
import math

from composing import FAST, compose_config
from rlvr.run import run


def test_guess_with_echo_trains_and_logs_echo_metrics(tmp_path):
    # guess's observations are one token ("+" or "=") and its actions 2 (a digit, EOS): int(sampled × 0.5) ≥ the
    # candidates, so bounded keeps every one unless the floor bites
    config = FAST + ["env=guess", "echo=on", "trainer.max_steps=2", "trainer.evaluate=false",
                     "trainer.sampling.max_tokens=2", "trainer.warmup.steps=0"]
    run(compose_config(config), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "echo/enabled" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["echo/target_retention"] == "bounded" and r["echo/weight"] == 0.05
        assert r["echo/candidate_tokens"] > 0 and r["echo/kept_tokens"] > 0 and not r["skipped"]
        assert r["echo/loss"] > 0 and math.isfinite(r["echo/loss"]) and math.isfinite(r["loss"])
        assert r["echo/joint_optimizer_step"] == 1.0
