"""`model.loader: unsloth` (rlvr/model/unsloth.py): refused at start without CUDA, unsloth, or a transformers inside
unsloth's pin, each named by `rlvr doctor`; the calls it makes bound against the installed unsloth's own signatures.

rlvr's environment cannot hold unsloth (2026.10.9 pins transformers <=5.17.0; this one has a newer release), so the
signature test skips here. It runs in an environment with unsloth installed: e.g. a venv with `pip install
unsloth==2026.10.9 hydra-core pytest` and `PYTHONPATH=<repo> python -m pytest -o addopts="" -p no:cacheprovider
tests/model/test_unsloth.py`. Unsloth imports on a CPU (it falls back to CPU training with a warning)."""

import importlib.metadata
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from composing import compose_config
from rlvr.model import unsloth
from rlvr.model.lora import TextOnlyLora, text_only_pattern
from rlvr.model.pretrained import Pretrained
from rlvr.types import LoraSpec

ROOT = Path(__file__).resolve().parents[2]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_unsloth_loader_holds_the_adapter_the_backend_would_otherwise_attach():
    model = instantiate(compose_config(["model=qwen3_5_0_8b", "model.loader=unsloth"]).model)
    assert model.loader == "unsloth" and model.lora is None  # the backend attaches nothing: Unsloth has
    assert type(model.unsloth_lora) is TextOnlyLora and model.unsloth_lora.rank == 32
    plain = instantiate(compose_config(["model=qwen3_5_0_8b"]).model)
    assert plain.loader == "transformers" and plain.lora == model.unsloth_lora and plain.unsloth_lora is None
    with pytest.raises(ValueError, match="model.loader=unsloth trains a LoRA adapter on a 4-bit base, and "
                                         "model.lora is null"):
        Pretrained("org/name", None, "bfloat16", None, None, loader="unsloth")
    with pytest.raises(ValueError, match=r"model.loader='mlx': expected one of transformers, unsloth"):
        Pretrained("org/name", None, "bfloat16", None, None, loader="mlx")


def test_the_calls_carry_the_lora_spec_and_unsloths_checkpointing():
    lora = TextOnlyLora(8, 16.0, 0.05, ["q_proj", "down_proj"])
    assert unsloth.peft_kwargs(lora, 7) == {
        "r": 8, "target_modules": text_only_pattern(["q_proj", "down_proj"]), "lora_alpha": 16.0,
        "lora_dropout": 0.05, "bias": "none", "use_gradient_checkpointing": "unsloth", "random_state": 7}
    assert unsloth.peft_kwargs(LoraSpec(8, 16.0, 0.0, ["q_proj"]), 7)["target_modules"] == ["q_proj"]
    import torch

    assert unsloth.from_pretrained_kwargs("Qwen/Qwen3.5-0.8B", "main", "bfloat16", False, 7) == {
        "model_name": "Qwen/Qwen3.5-0.8B", "max_seq_length": 2048, "dtype": torch.bfloat16, "load_in_4bit": True,
        "revision": "main", "trust_remote_code": False, "use_gradient_checkpointing": "unsloth", "random_state": 7}


def test_the_calls_bind_to_the_installed_unsloths_signatures():
    """Every keyword the loader passes is a named parameter of the installed unsloth's CUDA loader
    (`unsloth.models.loader.FastLanguageModel`, the one `from unsloth import FastLanguageModel` gives on a GPU),
    none swallowed by its **kwargs; bound, not called. Without a GPU, unsloth exports its CPU fallback instead
    (unsloth_zoo/cpu/loader.py, which takes random_state through **kwargs): the calls bind there too."""
    pytest.importorskip("unsloth", reason="unsloth is not installed here (it pins transformers <=5.17.0)")
    import unsloth as package
    from unsloth.models.loader import FastLanguageModel

    load_kwargs = unsloth.from_pretrained_kwargs("org/name", None, "bfloat16", False, 0)
    lora_kwargs = unsloth.peft_kwargs(TextOnlyLora(8, 16, 0.0, ["q_proj"]), 0)
    bound = inspect.signature(FastLanguageModel.from_pretrained).bind(**load_kwargs)
    assert "kwargs" not in bound.arguments, bound.arguments.get("kwargs")
    peft_signature = inspect.signature(FastLanguageModel.get_peft_model)  # functools.wraps: FastLlamaModel's
    bound = peft_signature.bind(object(), **lora_kwargs)
    assert "kwargs" not in bound.arguments, bound.arguments.get("kwargs")
    assert peft_signature.parameters["use_gradient_checkpointing"].default == "unsloth"
    exported = package.FastLanguageModel  # the CPU fallback's where there is no GPU
    inspect.signature(exported.from_pretrained).bind(**load_kwargs)
    inspect.signature(exported.get_peft_model).bind(object(), **lora_kwargs)


def test_the_transformers_pin_is_read_from_unsloths_metadata():
    finding = unsloth.UnslothTransformersPin().check()
    installed = importlib.metadata.version("transformers")
    pin = unsloth.transformers_pin()
    if pin is None:
        assert finding.status == "missing"
        assert finding.detail.startswith(f"transformers {installed}; unsloth is not installed, so the transformers "
                                         "releases it accepts are unknown: pip install \"unsloth==2026.10.9\"")
        return
    version, specifier = pin
    assert "<=" in specifier or "<" in specifier
    from packaging.specifiers import SpecifierSet

    inside = SpecifierSet(specifier).contains(installed, prereleases=True)
    assert finding.status == ("ok" if inside else "missing")
    assert f"unsloth {version}'s pin" in finding.detail and specifier in finding.detail


def test_without_cuda_a_run_is_refused_at_start_naming_why(tmp_path):
    """`python train.py … model.loader=unsloth` on this machine: a config error (exit 2) before any model loads,
    naming CUDA (and unsloth and the transformers pin where those are missing too)."""
    if has_cuda():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    folder = tmp_path / "model"
    from tests.hub_models import saved_model

    saved_model(folder)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "model=pretrained", f"model.name_or_path={folder}",
                           "model.loader=unsloth", "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert ("model <rlvr.model.pretrained.Pretrained>: model.loader=unsloth needs a CUDA GPU (torch "
            in proc.stderr), proc.stderr[-3000:]
    assert ("Unsloth's 4-bit base (bitsandbytes), its LoRA kernels (Triton) and its gradient checkpointing run on "
            "CUDA; use model.loader=transformers here") in proc.stderr
    if unsloth.transformers_pin() is None:
        assert "unsloth is not installed: pip install \"unsloth==2026.10.9\"" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_doctor_names_the_loaders_three_requirements():
    from rlvr.cli import doctor

    report, code = doctor.run(["model=qwen3_5_0_8b", "model.loader=unsloth"], ROOT / "conf")
    rows = [row.split(maxsplit=3) for row in report.partition("` needs")[2].splitlines()]
    found = {row[2].rstrip(":"): (row[0], row[3]) for row in rows if row[1:2] == ["model=qwen3_5_0_8b"]}
    assert code == 1
    assert found["cuda"][0] == ("ok" if has_cuda() else "missing")
    assert found["unsloth"][0] == ("missing" if unsloth.transformers_pin() is None else "ok")
    assert found["transformers"][0] == unsloth.UnslothTransformersPin().check().status
    assert "unsloth" in found["transformers"][1]
    report, _ = doctor.run(["model=qwen3_5_0_8b"], ROOT / "conf")  # the transformers loader needs none of them
    assert not any(f"model=qwen3_5_0_8b     {item}:" in report for item in ("cuda", "unsloth", "transformers"))
