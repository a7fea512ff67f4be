"""`rlvr replay CAPTURE [OVERRIDE…]`: run a captured step's optimizer update again (rlvr/capture.py) and compare the
weights it gives with the captured run's.

    1. verify   manifest.json's format; its own sha256 against --expect-manifest when given; every pinned file
                (payload, config, the starting state, the result; the run's base/base.json) against its sha256.
                A missing, extra or changed file is refused, naming it with the expected and found hashes.
    2. rebuild  the run's components from the capture's config.json (with OVERRIDEs, key=value as for `rlvr eval`:
                backend.micro_batch_size=2, backend.packing=true …), the model from <run>/base/ (sha256-checked),
                the backend as the trainer builds it, then the starting state loaded by its checkpoint reader
    3. update   the payload's TrainBatch, the captured RNG state, one `backend.train_step` at the captured learning
                rate, on --threads torch threads (default 1: the captured update's own count on a CPU)
    4. compare  every trainable tensor with result.safetensors, bit for bit; the loss and gradient norm too

Exit status: 0 when every tensor is identical, 1 when any differs (each differing tensor listed with its largest
|Δ|), 2 for bad input (a missing or tampered file, a config that does not build).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.capture import (
    CONFIG,
    FORMAT,
    MANIFEST,
    PAYLOAD,
    RESULT,
    START,
    file_sha256,
    from_payload,
    set_rng_states,
    trainable_state,
)
from rlvr.cli.runs import CliError

if TYPE_CHECKING:
    from torch import Tensor

SHOWN = 20
"""Differing tensors listed at most (the count says how many more)."""


@dataclass(frozen=True)
class Difference:
    name: str
    max_abs: float
    """The largest |captured − replayed| over the tensor's elements (inf: shapes or names differ)."""
    elements: int
    """Elements that differ."""


def verify(capture: Path, expect_manifest: str | None = None) -> dict:
    """The capture's manifest, once every pin holds; a CliError (exit 2) naming the first file that does not."""
    capture = Path(capture)
    path = capture / MANIFEST
    if not path.is_file():
        raise CliError(f"{capture}: no {MANIFEST} here; give a captures/step_<N> folder written by "
                       "trainer.capture_steps")
    found = file_sha256(path)
    if expect_manifest is not None and found != expect_manifest.lower():
        raise CliError(f"{path}: sha256 {found}, but --expect-manifest gave {expect_manifest}: the manifest is not the "
                       "one the run logged at capture; refusing to replay")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise CliError(f"{path}: not JSON ({err}); refusing to replay") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CliError(f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}, expected "
                       f"{FORMAT!r}")
    pins, base = manifest.get("files"), manifest.get("base")
    if not isinstance(pins, dict) or not isinstance(base, dict) or not all(isinstance(v, str) for v in base.values()):
        raise CliError(f"{path}: its pins (`files`, and `base` for the run's base/base.json) are missing or not "
                       "sha256 strings; refusing to replay")
    present = {p.relative_to(capture).as_posix() for p in capture.rglob("*") if p.is_file()} - {MANIFEST}
    extra = sorted(present - pins.keys())
    if extra:
        raise CliError(f"{capture / extra[0]}: a file the manifest does not pin (added after capture); refusing to "
                       "replay")
    for name, expected in sorted(pins.items()):
        check_pin(capture / name, expected)
    for name, expected in base.items():
        check_pin(capture.parent.parent / name, expected)
    return manifest


def check_pin(path: Path, expected: str) -> None:
    if not path.is_file():
        raise CliError(f"{path}: missing (the manifest pins sha256 {expected}); refusing to replay")
    found = file_sha256(path)
    if found != expected:
        raise CliError(f"{path}: sha256 {found}, but the manifest pins {expected}: the file changed after capture "
                       "(or the manifest did); refusing to replay")


def replay(capture: Path, manifest: dict, overrides: list[str], conf: Path, threads: int
           ) -> tuple[dict[str, float], list[Difference]]:
    """(the replayed update's stats, the tensors that differ) of a capture `verify` passed."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from rlvr.algorithm.kl import uses_reference
    from rlvr.build import build_components
    from rlvr.cli.from_checkpoint import run_config
    from rlvr.errors import ConfigError
    from rlvr.run_weights import load_run_base, quiet_progress_bars

    capture = Path(capture)
    run = capture.parent.parent
    cfg = run_config(json.loads((capture / CONFIG).read_text()), overrides, conf)
    try:
        c = build_components(cfg)
    except ConfigError as err:
        raise CliError(str(err)) from None
    quiet_progress_bars()
    module, tokenizer = load_run_base(run)
    reference = uses_reference(c.algorithm.loss)
    backend = c.make_backend(model=module, lora=c.preset.lora, lora_seed=c.seeds.lora, pad_id=tokenizer.pad_token_id,
                             **({"reference": True} if reference else {}))  # as rlvr/start.py local_policy
    backend.load(capture / START)
    with safe_open(str(capture / PAYLOAD), framework="pt") as f:
        metadata = f.metadata()
    batch, rng = from_payload(load_file(capture / PAYLOAD), metadata)
    torch.set_num_threads(threads)
    set_rng_states(rng)
    stats = backend.train_step(batch, c.algorithm.loss, manifest["lr"])
    return stats, compare(load_file(capture / RESULT), trainable_state(backend.policy))


def compare(captured: dict[str, Tensor], replayed: dict[str, Tensor]) -> list[Difference]:
    """Every tensor that is not bit for bit the captured one, with its largest |Δ|."""
    import torch

    out = [Difference(name, float("inf"), -1) for name in sorted(captured.keys() ^ replayed.keys())]
    for name in sorted(captured.keys() & replayed.keys()):
        a, b = captured[name], replayed[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(Difference(name, float("inf"), -1))
        elif not torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)):
            delta = (a.double() - b.double()).abs()
            out.append(Difference(name, float(delta.max()), int((delta > 0).sum())))
    return out


def run(capture: Path, overrides: list[str], conf: Path, threads: int, expect_manifest: str | None) -> int:
    """Print the verdict; the exit status (0 identical, 1 different; bad input raises CliError, 2)."""
    if threads < 1:
        raise CliError(f"--threads {threads}: expected a positive integer")
    manifest = verify(capture, expect_manifest)
    stats, differences = replay(capture, manifest, overrides, conf, threads)
    compared = len(manifest["result"]["tensors"])
    where = (f"step {manifest['step']} of {Path(capture).parent.parent}, {'LoRA' if manifest['lora'] else 'full'} "
             f"weights, {manifest['rows']} rows, {threads} thread(s) on {manifest['device']}"
             + (f", overrides: {' '.join(overrides)}" if overrides else ""))
    lines = [f"rlvr replay: {where}"]
    for key, captured in manifest["stats"].items():
        lines.append(f"  {key:<22} captured {captured!r:<24} replayed {stats.get(key)!r}")
    if not differences:
        lines.append(f"IDENTICAL: all {compared} trainable tensors equal the captured update's bit for bit")
        print("\n".join(lines))
        return 0
    lines.append(f"DIFFERENT: {len(differences)} of {compared} trainable tensors differ from the captured update's "
                 f"(largest |Δ| {max(d.max_abs for d in differences):.3g})")
    for d in sorted(differences, key=lambda d: -d.max_abs)[:SHOWN]:
        what = "missing, extra or reshaped" if d.elements < 0 else f"{d.elements} elements differ"
        lines.append(f"  {d.name}: max |Δ| {d.max_abs:.3g} ({what})")
    if len(differences) > SHOWN:
        lines.append(f"  … and {len(differences) - SHOWN} more")
    print("\n".join(lines))
    return 1
