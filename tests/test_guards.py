"""Bad steps, bad samples and a full disk do not corrupt a run."""

import errno
import json

import pytest

from composing import FAST, MIXED, compose_config
from rlvr.backend.local import LocalBackend
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
