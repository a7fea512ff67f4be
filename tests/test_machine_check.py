"""What this machine must have, checked by the run as `rlvr doctor` checks it, from one list (issue 37 req 4):
a CUDA device asked of a CPU-only torch, more threads than cores, a disk too small for a checkpoint are refused
before the model loads (exit 2, naming the fix), and the doctor reports the very same findings."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.cli import doctor
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.machine_check import machine_requirements
from rlvr.requirements import FreeDisk, Threads
from rlvr.run import run
from rlvr.threads import usable_cores
from rlvr.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["trainer.warmup.steps=0", "trainer.max_steps=1", "data.eval_size=8", "threads=1"]


def model_loaded(*args, **kwargs):
    raise AssertionError("the run started (a model would load now): the machine was not checked first")


def test_a_cuda_device_on_a_cpu_only_torch_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    monkeypatch.setattr(Trainer, "fit", model_loaded)
    with pytest.raises(ConfigError) as err:
        run(compose_config([*QUICK, "backend.device=cuda"]), tmp_path / "run")
    assert "backend <rlvr.backend.local.LocalBackend>: device: backend.device=cuda needs CUDA: torch " in str(err.value)
    assert "`rlvr doctor` reports every requirement" in str(err.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_more_threads_than_cores_are_refused_at_start_naming_the_most():
    cores = usable_cores()
    with pytest.raises(ConfigError) as err:
        check(compose_config([f"threads={cores + 1}"]))
    assert f"threads={cores + 1} is more than the {cores} cores this process may run on: set threads={cores} at " \
           "most" in str(err.value)
    check(compose_config([f"threads={cores}"]))  # as many as the cores: fine


def test_a_disk_too_small_for_a_full_fine_tuning_checkpoint_is_refused(tmp_path):
    """A local model whose weight file is 8 TiB (sparse: it takes no room), fully fine-tuned: its checkpoint would
    need ~24 TiB in the run folder's file system."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(2**43)
    if shutil.disk_usage(tmp_path).free > 3 * 2**43:
        pytest.skip("this file system has more than 24 TiB free")
    full = FreeDisk(str(tmp_path / "outputs" / "run"), str(model), None, full_fine_tuning=True).check()
    assert full.status == "missing" and f"free under {tmp_path}" in full.detail
    assert "a checkpoint of this run needs about 24576.2 GiB" in full.detail and "another hydra.run.dir" in full.detail
    lora = FreeDisk(str(tmp_path / "outputs" / "run"), None, None, full_fine_tuning=False).check()
    assert lora.status == "ok", lora.detail


def test_the_run_and_the_doctor_check_one_list():
    cfg = compose_config(["backend.device=cuda", "threads=1"])
    needs = check(cfg)
    items = [(who, requirement) for who, requirement in machine_requirements(cfg, needs, Path("outputs"))]
    assert ("threads", Threads(1)) in items and any(isinstance(r, FreeDisk) for _, r in items)
    assert any(who == "backend" and r.item == "device" for who, r in items)
    report, code = doctor.run([f"threads={usable_cores() + 1}"], ROOT / "conf")
    assert code == 1 and f"threads={usable_cores() + 1} is more than the {usable_cores()} cores" in report
    assert "disk: " in report  # the run's free disk, as the run checks it


def test_as_typed_threads_1000_exits_2_before_torch_is_imported(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "threads=1000", f"hydra.run.dir={tmp_path / 'r'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "threads=1000 is more than the" in proc.stderr and "torch threads" not in proc.stdout
    assert not (tmp_path / "r").exists()
