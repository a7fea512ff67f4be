"""The Delight arms train end to end on the tiny model through rlvr.run.run: 4 steps with a finite loss, LoRA
weights that moved, the Delight metrics in metrics.jsonl, and the transform's state (η_prev, the SEPA
controller) in the checkpoint — a run stopped after 2 steps and resumed repeats the uninterrupted one exactly."""

import json
import math

import pytest
from safetensors.torch import load_file

from composing import FAST, MIXED, compose_config
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run

# λ = step/4 for the λ-scheduled arms (gate and delay opened: retrain's would keep λ = 0 for 50 steps);
# delight with the adaptive η and its EMA, so the carried η_prev matters on resume
ARMS = {
    "delight": ["transform.eta_mode=adaptive", "transform.eta_ema_decay=0.5", "transform.eta_target_ordering_gap=0.2"],
    "delight_sepa": ["transform.schedule.delay_steps=0", "transform.schedule.correct_rate_gate=0",
                     "transform.schedule.steps=4"],
    "hard_delight": ["transform.schedule.delay_steps=0", "transform.schedule.correct_rate_gate=0",
                     "transform.schedule.steps=4"],
}
METRIC = {"delight": "dg_eta", "delight_sepa": "dg_gate_mean", "hard_delight": "hard_dg_active_frac"}


def training_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows if "loss" in r]


@pytest.mark.parametrize("arm", list(ARMS))
def test_four_steps_train_and_resume_exactly(arm, tmp_path):
    overrides = FAST + MIXED + [f"transform={arm}", *ARMS[arm]]
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "whole")
    steps = training_rows(tmp_path / "whole")
    trained = [r for r in steps if not r["skipped"]]
    assert [r["step"] for r in steps] == [0, 1, 2, 3] and trained, "mixed rewards: steps train"
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in trained)
    assert all(METRIC[arm] in r for r in trained)
    if arm != "delight":
        assert [r["sepa_lambda"] for r in steps] == [0.0, 0.25, 0.5, 0.75]
    adapter = load_file(tmp_path / "whole" / "checkpoints" / "step_4" / "adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: it moved
    state = json.loads((tmp_path / "whole" / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["transform"]["transform"] == arm
    if arm == "delight":
        assert state["transform"]["eta_prev"] == steps[-1]["dg_eta"]  # carried to the next step
    else:
        assert state["transform"]["sepa"]["gate_open"] is True
    run(compose_config(overrides + ["trainer.max_steps=2"]), tmp_path / "resumed")
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "resumed")
    assert training_rows(tmp_path / "resumed") == steps
