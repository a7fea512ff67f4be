"""Exact step capture and replay (rlvr/capture.py, `rlvr replay`): a tiny LoRA run and a tiny full fine-tuning run
capture a step; the capture holds what the run trained (its result is the run's next checkpoint, its start the one
before), `rlvr replay` reproduces the update bit for bit on one thread, a changed update is reported with its
differences (exit 1), and a tampered file or pin is refused (exit 2) before anything is built."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from composing import FAST, MIXED, compose_config
from rlvr.capture import MANIFEST, PAYLOAD, RESULT, file_sha256
from rlvr.cli.main import main
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.resume import changed_keys
from rlvr.run import run

TRAIN = FAST + MIXED + ["trainer.evaluate=false", "trainer.batch_size=4", "trainer.group_size=4",
                        "trainer.save_every=1"]


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """Two LoRA steps, the second captured."""
    path = tmp_path_factory.mktemp("lora") / "run"
    run(compose_config(TRAIN + ["trainer.max_steps=2", "trainer.capture_steps=[1]"]), path)
    return SimpleNamespace(path=path, capture=path / "captures" / "step_1")


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One full fine-tuning step, captured."""
    path = tmp_path_factory.mktemp("full") / "run"
    run(compose_config(TRAIN + ["model.lora=null", "trainer.lr=1e-4", "trainer.max_steps=1",
                                "trainer.capture_steps=[0]"]), path)
    return SimpleNamespace(path=path, capture=path / "captures" / "step_0")


def replay(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["replay", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_lora_capture_holds_the_runs_update_and_replays_bit_for_bit(lora, capsys):
    manifest = json.loads((lora.capture / MANIFEST).read_text())
    assert manifest["step"] == 1 and manifest["lora"] and manifest["threads"] == 1 and manifest["rows"] == 16
    # the start is the checkpoint after step 0, the result the run's weights after step 1 (PEFT saves without the
    # adapter's name)
    before, after = lora.path / "checkpoints" / "step_1", lora.path / "checkpoints" / "step_2"
    assert file_sha256(lora.capture / "start" / "adapter_model.safetensors") == \
        file_sha256(before / "adapter_model.safetensors")
    result = {k.replace(".default", ""): v for k, v in load_file(lora.capture / RESULT).items()}
    saved = load_file(after / "adapter_model.safetensors")
    assert result.keys() == saved.keys() and all(result[k].equal(saved[k]) for k in saved)
    # the payload keeps the floats as float64 and says what they trained as
    payload = load_file(lora.capture / PAYLOAD)
    assert payload["adv_PG_T"].dtype == payload["rollouts.logprobs_PG_T"].dtype == torch.float64
    with safe_open(str(lora.capture / PAYLOAD), framework="pt") as f:
        assert json.loads(f.metadata()["dtypes"])["adv_PG_T"] == "float32"
    code, out, _ = replay(capsys, lora.capture)
    assert code == 0, out
    assert "IDENTICAL: all 28 trainable tensors" in out
    losses = [line.split() for line in out.splitlines() if line.strip().startswith("loss")]
    assert losses and losses[0][2] == losses[0][4]  # captured == replayed


def test_full_fine_tuning_capture_replays_bit_for_bit(full, capsys):
    manifest = json.loads((full.capture / MANIFEST).read_text())
    assert not manifest["lora"] and manifest["step"] == 0
    result = load_file(full.capture / RESULT)
    saved = load_file(full.path / "checkpoints" / "step_1" / "model.safetensors")
    tied = {"model.embed_tokens.weight": "lm_head.weight"}  # the tiny model ties them; the file keeps one name
    assert all(result[k].equal(saved[k if k in saved else tied[k]]) for k in result) and len(result) == len(saved)
    code, out, _ = replay(capsys, full.capture)
    assert code == 0 and "IDENTICAL" in out, out


def test_a_changed_update_is_reported_tensor_by_tensor(lora, capsys):
    """Clipping the gradient to almost nothing changes the update (AdamW's ε then dominates): exit 1, each tensor
    with its largest |Δ|."""
    code, out, _ = replay(capsys, lora.capture, "backend.grad_clip_norm=1e-9")
    assert code == 1, out
    assert "DIFFERENT:" in out and "overrides: backend.grad_clip_norm=1e-9" in out
    deltas = [float(line.split("max |Δ| ")[1].split()[0]) for line in out.splitlines() if "max |Δ| " in line]
    assert deltas and all(d > 0 for d in deltas)


def copy_run(lora, tmp_path):
    """The run's base/ and the capture, as a run folder of their own (what replay reads)."""
    run_copy = tmp_path / "run"
    shutil.copytree(lora.path / "base", run_copy / "base")
    shutil.copytree(lora.capture, run_copy / "captures" / "step_1")
    return run_copy / "captures" / "step_1"


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("tamper", ["payload", "pin", "start", "base", "unpinned_base", "extra", "expect"])
def test_a_tampered_capture_is_refused(lora, tmp_path, capsys, tamper):
    capture = copy_run(lora, tmp_path)
    manifest_path = capture / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    args = []
    if tamper == "payload":
        flip_last_byte(capture / PAYLOAD)
        named = PAYLOAD
    elif tamper == "pin":  # the file intact, its pin rewritten
        manifest["files"]["start/optimizer.pt"] = "0" * 64
        manifest_path.write_text(json.dumps(manifest))
        named = "optimizer.pt"
    elif tamper == "start":
        flip_last_byte(capture / "start" / "adapter_model.safetensors")
        named = "adapter_model.safetensors"
    elif tamper == "base":
        record = capture.parent.parent / "base" / "base.json"
        record.write_text(record.read_text().replace('"dtype"', '"dtype" ', 1))
        named = "base.json"
    elif tamper == "unpinned_base":  # a pin taken out rather than changed
        manifest["base"] = {"base/base.json": None}
        manifest_path.write_text(json.dumps(manifest))
        named = MANIFEST
    elif tamper == "extra":
        (capture / "start" / "extra.pt").write_bytes(b"x")
        named = "extra.pt"
    else:  # the manifest and a file rewritten together: only the sha256 logged at capture tells
        args = ["--expect-manifest", file_sha256(lora.capture / MANIFEST)]
        manifest["lr"] = 1.0
        manifest_path.write_text(json.dumps(manifest))
        named = MANIFEST
    code, out, err = replay(capsys, capture, *args)
    assert code == 2, out + err
    assert named in err and "refusing to replay" in err and "IDENTICAL" not in out
    if tamper in ("payload", "start", "base", "pin"):
        assert "sha256" in err and "pins" in err


def test_capture_steps_are_checked_at_start():
    with pytest.raises(ConfigError, match=r"trainer.capture_steps=\[2\]: expected a list of step indices in 0 .. 1"):
        check(compose_config(TRAIN + ["trainer.max_steps=2", "trainer.capture_steps=[2]"]))
    with pytest.raises(ConfigError, match=r"trainer <rlvr.trainer.Trainer> needs an update written down exactly .*"
                                          r"\(trainer.capture_steps=\[0\] writes down the updates of those steps\), "
                                          r"which no chosen component gives: choose backend=local"):
        check(compose_config(TRAIN + ["backend=fsdp", "trainer.capture_steps=[0]"]))


def test_a_resumed_run_may_capture_other_steps():
    """Capture steps are bookkeeping, as `threads` is: a run continues with other ones (to capture a later step)."""
    assert changed_keys({"trainer": {"capture_steps": []}}, {"trainer": {"capture_steps": [3]}}, []) == []


def test_a_key_added_since_a_run_was_stored_resumes_at_the_value_it_had():
    from rlvr.resume import ADDED

    before = {"trainer": {"lr": 1e-3}}  # stored before trainer.partial_rollouts existed
    assert ADDED["trainer.partial_rollouts"] is False
    assert changed_keys(before, {"trainer": {"lr": 1e-3, "partial_rollouts": False}}, []) == []
    assert changed_keys(before, {"trainer": {"lr": 1e-3, "partial_rollouts": True}}, []) == ["trainer.partial_rollouts"]
