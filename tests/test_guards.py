"""Bad steps, bad samples and a full disk do not corrupt a run."""

import errno
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from composing import FAST, MIXED, compose_config
from rlvr.backend.local import LocalBackend, Trainee
from rlvr.checkpoint import CheckpointError, Checkpoints
from rlvr.errors import RunFailed
from rlvr.run import run


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def nan_algorithm(calls):
    return ["algorithm._target_=faulty.NaNOnCalls", f"+algorithm.calls={calls}", "~algorithm.scale",
            "~algorithm.scale_eps", "~algorithm.kl", "~algorithm.entropy_coef"]  # GRPO's own knobs, which NaNOnCalls
    # does not take (its loss reads null and 0 instead: conf/algorithm/loss/policy.yaml)


def test_a_nonfinite_step_is_skipped_and_counted(tmp_path):
    run(compose_config(FAST + MIXED + nan_algorithm([1]) + ["trainer.max_steps=4"]), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    # NaN advantages are "non-zero", so step 1 trains, gets a NaN loss and is skipped by the backend
    assert steps[1]["train/nonfinite_skip"] == 1.0 and steps[1]["grad_norm"] == "nan"  # JSON has no NaN
    assert [r["train/nonfinite_skips"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(r.get("train/nonfinite_skip", 0.0) == 0.0 for r in steps[2:])


def test_consecutive_nonfinite_steps_stop_the_run_with_a_clear_message(tmp_path):
    with pytest.raises(FloatingPointError, match=r"3 consecutive steps .*\(trainer.max_nonfinite_skips=3\)"):
        run(compose_config(FAST + MIXED + nan_algorithm([0, 1, 2, 3, 4, 5]) + ["trainer.max_steps=6"]), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    assert [r["train/nonfinite_skips"] for r in steps] == [1.0, 2.0]  # the third raised before its row


def test_an_update_that_makes_the_weights_nonfinite_is_rolled_back_and_the_run_continues(tmp_path, monkeypatch):
    """Step 1's update gets a NaN learning rate (what a schedule dividing by zero would hand the optimizer): its loss
    and gradients are finite, the weights after it are not. The step is rolled back and counted, the next steps
    train, and the run ends on finite weights, evaluated (the engine samples from them) and checkpointed."""
    calls = []
    original = LocalBackend.train_step

    def train_step(self, batch, loss, lr):
        calls.append(lr)
        return original(self, batch, loss, math.nan if len(calls) == 2 else lr)

    monkeypatch.setattr(LocalBackend, "train_step", train_step)
    summary = run(compose_config(FAST + MIXED + ["trainer.max_steps=4"]), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    assert steps[1]["train/nonfinite_skip"] == 1.0 and steps[1]["train/nonfinite_weights"] == 1.0
    assert math.isfinite(steps[1]["loss"]) and math.isfinite(steps[1]["grad_norm"])
    assert [r["train/nonfinite_skips"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["train/nonfinite_skip"] == 0.0 and "train/nonfinite_weights" not in r for r in steps[2:])
    assert summary["steps"] == 4 and math.isfinite(rows(tmp_path)[-1]["eval/accuracy"])
    weights = load_file(Checkpoints(tmp_path / "checkpoints", 0).latest() / "adapter_model.safetensors")
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


@pytest.mark.parametrize("stepped", [False, True], ids=["first step", "later step"])
def test_a_rolled_back_update_leaves_the_weights_and_the_optimizer_exactly_as_they_were(stepped):
    """The rollback puts back every weight and every optimizer state tensor bit for bit; before the first step,
    that is no optimizer state at all (AdamW's first step then starts afresh)."""
    torch.manual_seed(0)
    trainee = Trainee(torch.nn.Linear(4, 3), torch.device("cpu"), 0, 0, (0.9, 0.95), 1e-8, 0.01, 0.0, 0)

    def update(lr: float):
        for p in trainee.params:
            p.grad = torch.randn_like(p)
        return trainee.update(lr, loss_sum=1.0)

    def state():
        """The weights, and each parameter's optimizer state (by index; none before its first step), copied."""
        return ([p.detach().clone() for p in trainee.params],
                {i: {k: v.clone() for k, v in trainee.optimizer.state[p].items()}
                 for i, p in enumerate(trainee.params) if p in trainee.optimizer.state})

    if stepped:
        assert update(1e-2).taken
    (weights, moments), result = state(), update(math.nan)
    assert not result.taken and result.rolled_back and math.isfinite(result.grad_norm)
    weights_now, moments_now = state()
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_now, strict=True))
    assert {i: m.keys() for i, m in moments.items()} == {i: m.keys() for i, m in moments_now.items()}
    assert all(torch.equal(m[k], moments_now[i][k]) for i, m in moments.items() for k in m)
    assert bool(moments) == stepped
    assert update(1e-2).taken and all(bool(torch.isfinite(p).all()) for p in trainee.params)


def test_float16_adamw_updates_are_rolled_back_and_stop_the_run_naming_the_weights(tmp_path):
    """Full fine-tuning in float16: AdamW's eps (1e-8) is 0 in float16, so where a gradient is tiny the update divides
    by 0. The loss and gradients were finite; the engine then sampled from NaN logits and died with a traceback.
    Now every such update is rolled back, and the run stops on the last good weights with a message that says so."""
    overrides = ["model.dtype=float16", "model.lora=null", "trainer.lr=1e-4", "trainer.max_steps=4",
                 "trainer.max_nonfinite_skips=2"]
    with pytest.raises(FloatingPointError, match=r"2 consecutive steps .* non-finite loss, gradient or updated "
                                                 r"weights .*AdamW in float16"):
        run(compose_config(FAST + MIXED + overrides), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    assert steps[0]["train/nonfinite_weights"] == 1.0 and math.isfinite(steps[0]["loss"])


def test_a_verifier_that_raises_on_one_sample_does_not_stop_the_run(tmp_path):
    # the untrained policy's "1…" answers (~1 in 13) make the verifier raise on the whole batch; they are then
    # graded one by one and the poisoned ones score 0, counted in reward/error_frac
    reward = ["reward._target_=faulty.FlakyReward", '+reward.poison="1"']
    summary = run(compose_config(FAST + reward + ["trainer.max_steps=3"]), tmp_path)
    assert summary["steps"] == 3
    assert sum(r["reward/error_frac"] for r in rows(tmp_path) if "loss" in r) > 0


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    calls = []
    original = LocalBackend.save

    def save(self, path):
        calls.append(path)
        if len(calls) == 2:
            (path / "adapter_model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, path)

    monkeypatch.setattr(LocalBackend, "save", save)
    with pytest.raises(RunFailed, match=f"^the disk holding the run folder {tmp_path} is full .*: CheckpointError: "
                                        "could not write checkpoint .*step_4: No space left on device; the previous "
                                        "checkpoint .*step_2 is intact") as err:
        run(compose_config(FAST + MIXED + ["trainer.max_steps=6", "trainer.save_every=2"]), tmp_path)
    assert isinstance(err.value.__cause__, CheckpointError)
    latest = Checkpoints(tmp_path / "checkpoints", 0).latest()
    assert latest.name == "step_2" and Checkpoints.read_state(latest)["step"] == 2
    assert not (tmp_path / "checkpoints" / "step_4").exists()
    assert not list((tmp_path / "checkpoints").glob(".step_4*"))
