"""Checks on the command line itself, before Hydra composes it.

Hydra takes the last of two choices given to the same config group: `campaign=smoke campaign=sepa_ablation`
silently launched the 15-run campaign, `algorithm=maxrl algorithm=grpo` trained GRPO. A group chosen twice with
different options is refused instead (twice the same option is harmless and passes). A dotted key given twice
keeps Hydra's rule, the last one wins: scripts build commands as a base plus overrides of it.
"""

from __future__ import annotations

from pathlib import Path


def repeated_choices(argv: list[str], conf: Path) -> list[str]:
    """One message per config group of `conf` (a folder of it, or Hydra's own `hydra/…`) that `argv` (train.py's
    arguments) chooses more than once with different options; [] when Hydra cannot parse the overrides (its own
    error then says why)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = get_args_parser().parse_known_args(argv)[0].overrides
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports its own parse errors in its words (rlvr/hydra_errors.py)
        return []
    given: dict[str, list[str]] = {}
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        if override.is_delete() or not ((conf / key).is_dir() or key.startswith("hydra/")):
            continue
        given.setdefault(override.get_key_element(), []).append(text)
    return [f"{key} is chosen {len(texts)} times with different options ({', '.join(texts)}): Hydra would silently "
            f"take the last one; keep one of them" for key, texts in given.items()
            if len({t.split("=", 1)[1] for t in texts}) > 1]
