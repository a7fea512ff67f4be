"""A run folder's trained weights as a module: its base (`<run>/base/`) with a checkpoint's LoRA adapter merged in
or its full weights loaded, as `rlvr export` writes them and as a distillation teacher (rlvr/distill/local.py) loads
them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.checkpoint import STATE_FILE, STEP_DIR, Checkpoints
from rlvr.errors import CliError

if TYPE_CHECKING:
    from torch.nn.modules.module import _IncompatibleKeys

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"


def find_checkpoint(path: Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) for a run folder or a `checkpoints/step_N` folder."""
    path = Path(path)
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    if (path / STATE_FILE).is_file():
        if path.parent.name != "checkpoints":
            raise CliError(f"{path} is a checkpoint outside a run folder's checkpoints/: its run folder (with base/) "
                           "cannot be found")
        return path.parent.parent, path
    root = path / "checkpoints"
    complete = sorted((int(m.group(1)), p) for p in root.glob("step_*")
                      if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()) if root.is_dir() else []
    if not complete:
        raise CliError(f"{path} holds no complete checkpoint (checkpoints/step_N/ with {STATE_FILE}): give a run "
                       "folder that has saved one, or a checkpoints/step_N folder")
    finals = [p for _, p in complete if Checkpoints.read_state(p).get("final")]
    return path, finals[-1] if finals else (Checkpoints(root, 0).latest() or complete[-1][1])


def load_run_base(run: Path):
    """(module, tokenizer) from `<run>/base/`, a BaseFolderError turned into a CliError."""
    from rlvr.model.base_folder import BaseFolderError, load_base

    try:
        return load_base(run / "base")
    except BaseFolderError as err:
        raise CliError(str(err)) from None


def quiet_progress_bars() -> None:
    """No 'Loading weights' / 'Writing model shards' bars from transformers on the command's output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def merged(module, checkpoint: Path):
    """The base with the checkpoint's adapter merged in, attached as the trainer's backend attaches it."""
    import peft
    from safetensors.torch import load_file

    config = peft.LoraConfig.from_pretrained(str(checkpoint))
    model = peft.get_peft_model(module, config)
    # what torch's load_state_dict returns (PEFT annotates it as `namedtuple`, which is no type)
    result: _IncompatibleKeys = peft.set_peft_model_state_dict(model, load_file(checkpoint / ADAPTER_WEIGHTS))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise CliError(f"{checkpoint}: the adapter does not fit the run's base model (unexpected "
                       f"{result.unexpected_keys[:3]}, missing {missing[:3]})")
    modules = config.target_modules  # a list of suffixes, or one pattern (rlvr.model.lora.TextOnlyLora)
    targets = modules if isinstance(modules, str) else ", ".join(sorted(modules))
    return model.merge_and_unload(safe_merge=True), f"LoRA r={config.r}, alpha={config.lora_alpha} ({targets}) merged"


def full(module, checkpoint: Path):
    from safetensors.torch import load_model

    try:
        load_model(module, checkpoint / FULL_WEIGHTS)
    except RuntimeError as err:
        raise CliError(f"{checkpoint / FULL_WEIGHTS} does not fit the run's base model: {err}") from None
    return module
