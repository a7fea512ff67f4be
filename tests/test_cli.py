"""`python train.py` as a user runs it: help, config printing without heavy imports, and a run folder."""

import subprocess
import sys
from pathlib import Path

import yaml

from composing import groups, options

ROOT = Path(__file__).resolve().parents[1]


def train_py(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_help_lists_every_group_and_option():
    out = train_py("train.py", "--help").stdout
    listed = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    lines = [line for line in listed.splitlines() if ": " in line]
    assert lines == [f"{group}: {', '.join(options(group))}" for group in groups()]  # conf/'s folders, nothing else


def test_cfg_job_prints_the_config_without_importing_torch():
    # -X importtime lists every module imported; composing must not pull in torch or transformers
    proc = train_py("-X", "importtime", "train.py", "--cfg", "job", "algorithm=maxrl")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["algorithm"]["_target_"] == "rlvr.algorithm.maxrl.MaxRL" and cfg["seed"] == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "peft", "vllm", "wandb"}


def test_a_run_leaves_a_readable_folder(tmp_path):
    run_dir = tmp_path / "run"
    proc = train_py(
        "train.py", "trainer.max_steps=2", "trainer.warmup.steps=0", "trainer.eval_every=0", "data.eval_size=32",
        "threads=1", f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.jsonl", "summary.json", "train.log"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "step_2" / "adapter_model.safetensors").is_file()
    assert "seed sampler" in (run_dir / "train.log").read_text()
    assert yaml.safe_load((run_dir / ".hydra/config.yaml").read_text())["trainer"]["max_steps"] == 2
    assert yaml.safe_load((run_dir / "status.json").read_text())["state"] == "finished"


def test_a_bad_config_fails_before_loading_and_names_the_key(tmp_path):
    proc = train_py("train.py", "backend.micro_batch_size=7", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "backend.micro_batch_size=7 does not divide" in proc.stderr
    assert "building model" not in proc.stderr + proc.stdout
