"""`rlvr export RUN_OR_CHECKPOINT --out DIR [--force]`: a checkpoint as one plain Hugging Face model folder.

    base (<run>/base/, sha256-checked) + the checkpoint's LoRA adapter  →  merge_and_unload(safe_merge=True)
    base + the checkpoint's full weights (model.lora=null)               →  those weights

DIR gets config.json, generation_config.json, model.safetensors, the tokenizer's files and `rlvr_export.json`
(where it came from: run, checkpoint, step, the base's sha256 or pointer). It loads with
`AutoModelForCausalLM.from_pretrained(DIR)` + `AutoTokenizer.from_pretrained(DIR)` and with `vllm.LLM(DIR)`
(give vLLM the model's dtype: its `auto` runs a float32 model in bfloat16). The weights keep the base's dtype.

The folder is written under a temporary sibling name and renamed. A non-empty DIR is refused unless `--force`,
which replaces it once the new folder is complete; a DIR that is or holds the run folder is always refused.
No config is read: the adapter's own adapter_config.json says how it attaches.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.checkpoint import Checkpoints
from rlvr.cli.from_checkpoint import write_json
from rlvr.cli.runs import CliError
from rlvr.run_weights import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    FULL_WEIGHTS,
    find_checkpoint,
    full,
    load_run_base,
    merged,
    quiet_progress_bars,
)

if TYPE_CHECKING:
    pass


def check_out(out: Path, run: Path, force: bool) -> None:
    out_abs, run_abs = out.resolve(), run.resolve()
    if out_abs == run_abs or out_abs in run_abs.parents or run_abs in out_abs.parents:
        raise CliError(f"--out {out} is the run folder {run}, inside it or holds it: choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CliError(f"--out {out} is not empty: choose another folder, or --force to replace it")


def run(path: Path, out: Path, force: bool) -> str:
    run_folder, checkpoint = find_checkpoint(path)
    check_out(out, run_folder, force)
    state = Checkpoints.read_state(checkpoint)
    if (checkpoint / ADAPTER_CONFIG).is_file():
        how = "adapter"
    elif (checkpoint / FULL_WEIGHTS).is_file():
        how = "full"
    else:
        raise CliError(f"{checkpoint} holds neither a LoRA adapter ({ADAPTER_WEIGHTS}) nor full weights "
                       f"({FULL_WEIGHTS}) (a remote backend's checkpoint keeps its weights on the service)")
    quiet_progress_bars()
    module, tokenizer = load_run_base(run_folder)
    if how == "adapter":
        model, detail = merged(module, checkpoint)
    else:
        model, detail = full(module, checkpoint), "its full weights"
    base = json.loads((run_folder / "base" / "base.json").read_text())
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, max_shard_size="10000GB")
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "rlvr_export.json", {
            "run": str(run_folder.resolve()), "checkpoint": str(checkpoint.resolve()), "step": state["step"],
            "weights": how, "base_weights": base["weights"], "base_sha256": base["sha256"],
            "warmup_key": base["warmup_key"],
        })
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    size = (out / FULL_WEIGHTS).stat().st_size / 2**20
    return "\n".join([
        f"rlvr export: {checkpoint} (step {state['step']}): {detail} into the base in {run_folder / 'base'}",
        f"wrote {out}: {files} ({FULL_WEIGHTS} {size:.1f} MiB, {dtype})",
        f"load it: transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}), "
        f"vllm.LLM({str(out)!r}, dtype={dtype!r})",
    ])
