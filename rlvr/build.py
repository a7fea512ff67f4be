"""The one builder: the composed config (checked, rlvr/config_check.py) becomes the run's components, for
`rlvr.run`, the benches and the CLI alike. Everything built here is light (no model, no torch import): the
components from their `_target_`s, the trainer, and the step's stages (rlvr/stages/); the policy, its warm-up,
the backend, the engine and the rollout are built at start (rlvr/start.py)."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from rlvr.components import Components
from rlvr.config_check import check
from rlvr.distributed import ONE_PROCESS, World
from rlvr.env.guarded import GuardedEnvironment
from rlvr.errors import ConfigError
from rlvr.labels import condition_label
from rlvr.reward.guarded import RewardGuard
from rlvr.seeds import Seeds

if TYPE_CHECKING:
    from rlvr.stages import Stage
    from rlvr.trainer import Trainer
    from rlvr.transform.self_distill import SelfDistill

log = logging.getLogger("rlvr")


def build_all(cfg: DictConfig, campaign_root: Path | None = None, world: World = ONE_PROCESS
              ) -> tuple[Components, Trainer]:
    """The run's components (`build_components`), its trainer, and the step's stages built from both."""
    components = build_components(cfg, campaign_root, world)
    trainer = build(cfg, "trainer")
    components.stages = stages(trainer, components)
    return components, trainer


def build_components(cfg: DictConfig, campaign_root: Path | None = None, world: World = ONE_PROCESS) -> Components:
    """Check the config, then build every component for this process of `world` (the check has refused several
    processes without a backend that trains over them); nothing heavy (no model) is loaded yet, and not the
    training loop (the checkpoint commands build theirs here). In a multirun (`campaign_root` given) a backend
    that takes `throttle_dir` shares `<campaign root>/tinker_throttle` with the campaign's other jobs
    (rlvr/backend/throttle.py); a single run gets none."""
    needs = check(cfg)
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)  # a DictConfig's container
    seeds = Seeds.from_root(int(cfg.seed))
    multi_turn = cfg.get("env") is not None
    components = Components(
        preset=build(cfg, "model"),
        data=build(cfg, "data", seed=seeds.data),
        reward=build(cfg, "reward"),
        algorithm=build(cfg, "algorithm"),
        transform=build(cfg, "transform"),
        planning=build(cfg, "planning"),
        logger=build(cfg, "logger"),
        backpressure=build(cfg, "backpressure"),
        env=GuardedEnvironment(build_env(cfg), max_abs=RewardGuard.of(cfg).max_abs) if multi_turn else None,
        turn_credit=build(cfg, "turn_credit") if multi_turn else None,
        echo=build(cfg, "echo") if cfg.get("echo") is not None else None,
        distill=build(cfg, "distill") if cfg.get("distill") is not None else None,
        make_backend=functools.partial(build(cfg, "backend", _partial_=True),
                                       **backend_runtime_args(cfg, campaign_root, world)),
        make_engine=build(cfg, "engine", _partial_=True),
        condition=condition_label(config),
        uncertainty_kind=cfg.transform.get("uncertainty"),
        seeds=seeds,
        config=config,
        config_sha256=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
        needs=needs,
        world=world,
    )
    check_components(cfg, components)
    return components


def stages(t: Trainer, c: Components) -> list[Stage]:
    """The step's stages in the order they run (rlvr/stages/__init__.py), each from its part of the config
    (imported here: a command that builds no trainer, `rlvr eval`, imports no part of the step)."""
    from rlvr.stages.collect import Collect
    from rlvr.stages.credit import CreditStage, SelfTeach, Signals, Teach
    from rlvr.stages.observe import (
        BackPressureStage,
        DataObserver,
        FailureWarning,
        LearningGuard,
        NonfiniteGuard,
        ObservingSource,
        Samples,
        SyncGuard,
    )
    from rlvr.stages.record import Record
    from rlvr.stages.select import Select
    from rlvr.stages.shape import OverlongShaping, RewardKL
    from rlvr.stages.train import Train

    shaping = OverlongShaping(t.overlong, t.sampling.max_tokens)
    observes = "observes_steps" in c.needs["data"].provides  # its class declares it (data=discover)
    observer = [DataObserver(cast(ObservingSource, c.data))] if observes else []
    return [
        Collect(),
        shaping,
        Select(t.dynamic, shaping, t.group_size, t.sampling),
        Signals(t.group_size, c.planning, c.wants_planning, c.wants_entropy),
        Teach(c.distill),
        SelfTeach(cast("SelfDistill", c.transform) if c.wants_self_teacher else None),
        RewardKL(c.algorithm),
        CreditStage(c.algorithm, c.transform, c.turn_credit, t.overlong, t.sampling.max_tokens, c.echo),
        Train(c.algorithm, t.capture, t.lr, bool(t.off_policy_steps)),
        *observer,
        NonfiniteGuard(t.max_nonfinite_skips),
        FailureWarning(t.reward_warn_frac),
        Samples(t.samples_per_step),
        SyncGuard(t.sync_check),
        BackPressureStage(c.backpressure, t.group_size),
        LearningGuard(t.max_skipped_steps, t.max_failed_steps),
        Record(c.condition, c.uncertainty_kind),
    ]


def backend_runtime_args(cfg: DictConfig, campaign_root: Path | None, world: World) -> dict:
    """What the chosen backend takes besides its YAML: the run's `world` (backend=fsdp), a campaign's
    `throttle_dir` (backend=tinker); given to the constructor as they are (Hydra would turn a World into a dict)."""
    takes = inspect.signature(get_class(cfg.backend._target_)).parameters
    return ({"world": world} if "world" in takes else {}) | (
        {"throttle_dir": str(campaign_root / "tinker_throttle")} if campaign_root and "throttle_dir" in takes else {})


def build(cfg: DictConfig, group: str, **kwargs):
    """The `cfg[group]` component; a constructor that rejects its values is a ConfigError naming the group."""
    log.info("building %-9s <%s>", group, cfg[group]._target_)
    try:
        return instantiate(cfg[group], _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"invalid config:\n  {group} <{cfg[group]._target_}>: {cause}") from cause


def build_env(cfg: DictConfig):
    """The `env` component: built from its keys less `env.tools` and its siblings, then wrapped with those tools
    (rlvr/tools/harness.py); `build(cfg, "env")` when it names no tools."""
    from rlvr.tools import TOOL_KEYS
    from rlvr.tools.harness import with_tools

    if not any(k in cfg.env for k in TOOL_KEYS):
        return build(cfg, "env")
    env = OmegaConf.to_container(cfg.env, resolve=True)
    assert isinstance(env, dict)  # a DictConfig's container
    settings = {k: env[k] for k in TOOL_KEYS if k in env}
    bare = copy.deepcopy(cfg)
    with open_dict(bare):
        for k in settings:
            del bare.env[k]
    return with_tools(build(bare, "env"), settings)


def check_components(cfg: DictConfig, c: Components) -> None:
    """Checks that need a built (but still light) component: still before any model loads."""
    games = c.env is not None and c.env.demonstrations is not None  # an environment that plays its own
    if cfg.trainer.warmup.steps > 0 and not games and not c.data.demonstrations():
        file = ", or name a JSON-lines file of prompt/completion pairs with data.demonstrations_path=FILE" if (
            "demonstrations_path" in cfg.data) else ""
        raise ConfigError(
            f"invalid config:\n  trainer.warmup.steps={cfg.trainer.warmup.steps} but data <{cfg.data._target_}> has no "
            f"warm-up demonstrations: set trainer.warmup.steps=0 (or trainer=gpu){file}"
        )
