import errno
import json

import pytest
import torch

from rlvr.checkpoint import CheckpointError, Checkpoints


def weights(value):
    def write(path):
        torch.save({"w": torch.tensor([value])}, path / "weights.pt")

    return write


def test_save_is_complete_and_latest_points_at_it(tmp_path):
    ckpts = Checkpoints(tmp_path, keep_last=0)
    path = ckpts.save(3, weights(3.0), {"step": 3}, final=False)
    assert path == tmp_path / "step_3" and ckpts.latest() == path
    assert {p.name for p in path.iterdir()} == {"weights.pt", "rng.pt", "trainer_state.json"}
    assert (tmp_path / "latest").read_text().strip() == "step_3"
    assert Checkpoints.read_state(path) == {"step": 3, "final": False}


def test_retention_keeps_the_last_k_and_the_final(tmp_path):
    ckpts = Checkpoints(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        ckpts.save(step, weights(step), {"step": step}, final=False)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_3", "step_4"]
    ckpts.save(5, weights(5), {"step": 5}, final=True)
    ckpts.save(6, weights(6), {"step": 6}, final=False)  # e.g. max_steps was raised and the run went on
    ckpts.save(7, weights(7), {"step": 7}, final=False)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_5", "step_6", "step_7"]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    ckpts = Checkpoints(tmp_path, keep_last=0)
    ckpts.save(1, weights(1.0), {"step": 1}, final=False)

    def disk_full(path):
        (path / "half.bin").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError) as err:
        ckpts.save(2, disk_full, {"step": 2}, final=False)
    assert "No space left on device" in str(err.value) and "step_1 is intact" in str(err.value)
    assert ckpts.latest() == tmp_path / "step_1"
    assert not list(tmp_path.glob(".step_2*")) and not (tmp_path / "step_2").exists()
    assert torch.load(tmp_path / "step_1" / "weights.pt")["w"].item() == 1.0


def test_a_librarys_own_error_for_a_full_disk_is_a_checkpoint_error_too(tmp_path):
    """safetensors raises its own SafetensorError, not an OSError, for a full disk; before, it escaped the checkpoint
    with a traceback and left the temporary folder behind."""
    ckpts = Checkpoints(tmp_path, keep_last=0)
    ckpts.save(1, weights(1.0), {"step": 1}, final=False)

    def disk_full(path):
        (path / "half.bin").write_bytes(b"x" * 10)
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(CheckpointError, match=r"step_2: No space left on device; the previous checkpoint .*step_1 is "
                                              "intact"):
        ckpts.save(2, disk_full, {"step": 2}, final=False)
    assert not list(tmp_path.glob(".step_2*")) and ckpts.latest() == tmp_path / "step_1"


def test_latest_falls_back_to_the_newest_complete_folder(tmp_path):
    ckpts = Checkpoints(tmp_path, keep_last=0)
    ckpts.save(1, weights(1.0), {"step": 1}, final=False)
    ckpts.save(2, weights(2.0), {"step": 2}, final=False)
    (tmp_path / "latest").write_text("step_9\n")  # names a folder that is not there
    (tmp_path / "step_5").mkdir()  # a folder without trainer_state.json is not a checkpoint
    assert ckpts.latest() == tmp_path / "step_2"
    (tmp_path / "latest").unlink()
    assert ckpts.latest() == tmp_path / "step_2"


def test_no_checkpoint_yet(tmp_path):
    assert Checkpoints(tmp_path / "none", keep_last=0).latest() is None


def test_stale_temporary_folders_are_cleaned(tmp_path):
    (tmp_path / ".step_4.tmp").mkdir(parents=True)
    Checkpoints(tmp_path, keep_last=0).save(5, weights(5.0), {"step": 5}, final=False)
    assert not (tmp_path / ".step_4.tmp").exists()
    assert json.loads((tmp_path / "step_5" / "trainer_state.json").read_text())["step"] == 5
