"""A saved checkpoint's policy, rebuilt from its run folder alone, for `rlvr eval`, `rlvr sample` and `rlvr export`.

RUN_OR_CHECKPOINT is a run folder (its final checkpoint, else its latest) or one `checkpoints/step_N/` folder.
The weights are `<run>/base/` (rlvr/model/base_folder.py: the model RL started from, sha256-checked, with its
tokenizer) plus the checkpoint's adapter or full weights: no warm-up cache, no hub download for a tiny model.

The config is the one the checkpoint stored (`trainer_state.json` → `config`), with overrides:

    key=value        any key the stored config has (data.eval_size=200, trainer.eval_max_tokens=16,
                     backend.device=cpu, threads=1, seed=3); values parsed as Hydra parses them
    engine=<option>  swap the engine, reward or data group for an option of conf/ (`--conf`, default ./conf):
    reward=<option>  that group's node is taken from conf/ as `python train.py <group>=<option>` composes it;
    data=<option>    every other group stays as the run had it. Keys under the swapped group may follow
                     (engine=vllm engine.kv_cache_memory_bytes=134217728)

Refused, with the reason: `model.*` and a model or backend swap (the weights are the run's), swaps of the
groups that only shape training (algorithm, transform, trainer, condition, …), `+key`/`~key`, sweeps. The
result goes through a run's checks and builder (rlvr/build.py `build_components`), so a bad value gets the error a
training run would get. A run on a remote backend (Tinker) has no local weights and is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rlvr.checkpoint import Checkpoints
from rlvr.cli.runs import CliError
from rlvr.run_weights import find_checkpoint, load_run_base, quiet_progress_bars

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlvr.components import Components
    from rlvr.protocols import Backend, Engine

SWAPPABLE = ("engine", "reward", "data")
"""Groups an override may replace by another option of conf/."""
FIXED = ("model",)
"""Groups whose keys no override may change: the weights and their tokenizer are the run's."""



def run_config(stored: dict, overrides: list[str], conf: Path) -> DictConfig:
    """The checkpoint's stored config with `overrides` applied (see the module docstring)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise CliError(" ".join(str(err).split("See https")[0].split())) from None
    swaps: dict[str, str] = {}
    values = []
    for o in parsed:
        key, text = o.key_or_group, o.input_line
        if o.type != OverrideType.CHANGE or o.package or o.is_sweep_override():
            raise CliError(f"{text}: only key=value overrides of the run's config (no +key, ~key, @package or sweep)")
        if key.split(".")[0] in FIXED:
            raise CliError(f"{text}: the model is the run's (its base/ folder and the checkpoint's weights); "
                           "model.* cannot be overridden")
        if "." not in key and isinstance(stored.get(key), dict):
            if key not in SWAPPABLE:
                raise CliError(f"{text}: only {', '.join(g + '=<option>' for g in SWAPPABLE)} may swap a group here "
                               f"({key} is the run's; change single keys with {key}.<key>=<value>)")
            swaps[key] = str(o.value())  # an option's name, as it goes into `group=option`
        else:
            values.append((key, o.value(), text))
    cfg = OmegaConf.create(stored)
    for group, node in swapped_groups(swaps, conf).items():
        cfg[group] = node
    OmegaConf.set_struct(cfg, True)
    for key, value, text in values:
        try:
            OmegaConf.update(cfg, key, value, merge=False)
        except OmegaConfBaseException:
            raise CliError(f"{text}: the run's config has no key {key!r}") from None
    OmegaConf.set_struct(cfg, False)
    return cfg


def swapped_groups(swaps: dict[str, str], conf: Path) -> dict[str, dict]:
    """Each swapped group's node from conf/, composed as `python train.py <group>=<option> …` composes it."""
    if not swaps:
        return {}
    from omegaconf import OmegaConf

    from rlvr.cli.doctor.needs import compose

    if not (conf / "train.yaml").is_file():
        raise CliError(f"{conf}: no train.yaml there, which {', '.join(swaps)}=<option> is read from (run from the "
                       "repository root or pass --conf)")
    try:
        composed = compose(conf, [f"{group}={option}" for group, option in swaps.items()])
    except Exception as err:  # noqa: BLE001 - Hydra's composition errors, reported as the user's
        text = " ".join(str(err).split()).split(" Config search path")[0]
        raise CliError(f"{' '.join(f'{g}={o}' for g, o in swaps.items())}: {text}") from None
    # a group's node is a DictConfig, whose container is a dict
    return {group: cast(dict, OmegaConf.to_container(composed[group], resolve=True)) for group in swaps}


@dataclass
class Opened:
    """A checkpoint's policy, ready to sample: as a run's start builds it (rlvr/start.py), with the checkpoint's
    weights."""

    run: Path
    checkpoint: Path
    state: dict
    """The checkpoint's trainer_state.json."""
    config: dict
    """The config used (stored + overrides), resolved."""
    components: Components
    tokenizer: object
    backend: Backend
    engine: Engine

    def close(self) -> None:
        self.engine.close()


def open_checkpoint(path: Path, overrides: list[str], conf: Path) -> Opened:
    """Build the run's components from its (overridden) config, load base/ and the checkpoint's weights into
    the backend, and build the engine around it, exactly as the trainer does."""
    from omegaconf import OmegaConf

    from rlvr.build import build_components
    from rlvr.errors import ConfigError

    run, checkpoint = find_checkpoint(path)
    state = Checkpoints.read_state(checkpoint)
    cfg = run_config(state["config"], overrides, conf)
    try:
        components = build_components(cfg)
    except ConfigError as err:
        raise CliError(str(err)) from None
    if components.remote:
        raise CliError(f"{run} trained on a remote backend ({cfg.backend._target_}): its weights live on the service, "
                       "not in the run folder; eval/sample/export need a local policy")
    import torch

    from rlvr.threads import resolve as resolve_threads

    threads = resolve_threads(cfg.get("threads"))
    if threads is not None:  # as rlvr.run does: the same thread count gives the same bits
        torch.set_num_threads(threads)
    quiet_progress_bars()
    from rlvr.start import local_policy

    module, tokenizer = load_run_base(run)
    backend, engine = local_policy(components, module, tokenizer)  # as the trainer builds them
    try:
        backend.load(checkpoint)
    except (OSError, ValueError, RuntimeError) as err:
        raise CliError(f"{checkpoint}: the checkpoint's weights do not load onto {run / 'base'}: {err}") from None
    engine.connect()
    config = cast(dict, OmegaConf.to_container(cfg, resolve=True))  # a DictConfig's container is a dict
    return Opened(run, checkpoint, state, config, components, tokenizer, backend, engine)



def checkpoint_label(checkpoint: Path, state: dict) -> str:
    """`<checkpoint> (step 2 of 2, final)`."""
    final = ", final" if state.get("final") else ""
    return f"{checkpoint} (step {state['step']} of {state.get('max_steps', '?')}{final})"


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
