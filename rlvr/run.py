"""The only module that reads the composed DictConfig: check it, build every component from its
`_target_`, and hand typed objects to the loop.

Everything that can be checked without loading a model is checked here first, and every problem found
is reported at once, naming the keys involved.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from rlvr.outputs import RunDir
from rlvr.seeds import Seeds
from rlvr.trainer import Components, Trainer

log = logging.getLogger("rlvr")


class ConfigError(ValueError):
    """The composed config cannot run; the message names every offending key."""


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    components, trainer = build_all(cfg)
    if out_dir is None:
        from hydra.core.hydra_config import HydraConfig

        out_dir = HydraConfig.get().runtime.output_dir
    log.info("run folder %s", out_dir)
    return trainer.fit(components, RunDir(Path(out_dir)))


def build_all(cfg: DictConfig) -> tuple[Components, Trainer]:
    """Check the config, then build every component; nothing heavy (no model) is loaded yet."""
    check(cfg)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    seeds = Seeds.from_root(int(cfg.seed))
    components = Components(
        preset=build(cfg, "model"),
        data=build(cfg, "data", seed=seeds.data),
        reward=build(cfg, "reward"),
        algorithm=build(cfg, "algorithm"),
        transform=build(cfg, "transform"),
        planning=build(cfg, "planning"),
        make_backend=build(cfg, "backend", _partial_=True),
        make_engine=build(cfg, "engine", _partial_=True),
        condition=condition_label(cfg),
        uncertainty_kind=cfg.transform.get("uncertainty"),
        seeds=seeds,
    )
    check_components(cfg, components)
    return components, build(cfg, "trainer")


def build(cfg: DictConfig, group: str, **kwargs):
    log.info("building %-9s <%s>", group, cfg[group]._target_)
    return instantiate(cfg[group], _convert_="all", **kwargs)


def condition_label(cfg: DictConfig) -> str:
    """`<algorithm>+<transform>` from the modules the two `_target_`s name (maxrl+sepa, grpo+none)."""
    return "+".join(cfg[g]._target_.split(".")[-2] for g in ("algorithm", "transform"))


def check(cfg: DictConfig) -> None:
    """Cross-field checks on the config alone (no component is built)."""
    t, errors = cfg.trainer, []
    positive = {"batch_size": t.batch_size, "group_size": t.group_size, "lr": t.lr, "log_every": t.log_every,
                "eval_max_tokens": t.eval_max_tokens, "sampling.max_tokens": t.sampling.max_tokens}
    errors += [f"trainer.{k}={v} must be > 0" for k, v in positive.items() if v <= 0]
    at_least_0 = {"max_steps": t.max_steps, "save_every": t.save_every, "eval_every": t.eval_every,
                  "samples_per_step": t.samples_per_step, "warmup.steps": t.warmup.steps,
                  "sampling.temperature": t.sampling.temperature}
    errors += [f"trainer.{k}={v} must be >= 0" for k, v in at_least_0.items() if v < 0]
    if t.group_size == 1:
        errors.append("trainer.group_size=1: every group's rewards tie, so no step would train (need >= 2)")
    if not 0 < t.sampling.top_p <= 1:
        errors.append(f"trainer.sampling.top_p={t.sampling.top_p} must be in (0, 1]")
    if t.warmup.steps > 0 and t.warmup.batch_size <= 0:
        errors.append(f"trainer.warmup.batch_size={t.warmup.batch_size} must be > 0 when trainer.warmup.steps > 0")
    rows = t.batch_size * t.group_size
    mb = cfg.backend.get("micro_batch_size", 0)
    if mb and (mb < 0 or rows % mb):
        errors.append(
            f"backend.micro_batch_size={mb} does not divide trainer.batch_size × trainer.group_size "
            f"= {t.batch_size} × {t.group_size} = {rows}"
        )
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def check_components(cfg: DictConfig, c: Components) -> None:
    """Checks that need a built (but still light) component: still before any model loads."""
    errors = []
    engine_cls = get_class(cfg.engine._target_)
    if c.transform.needs_entropy and not getattr(engine_cls, "provides_entropy", False):
        errors.append(
            f"transform <{cfg.transform._target_}> needs full-distribution entropy, which "
            f"engine <{cfg.engine._target_}> cannot give: choose engine=pytorch or another uncertainty signal"
        )
    if cfg.trainer.warmup.steps > 0 and not c.data.demonstrations():
        errors.append(
            f"trainer.warmup.steps={cfg.trainer.warmup.steps} but data <{cfg.data._target_}> has no warm-up "
            "demonstrations: set trainer.warmup.steps=0 (or trainer=gpu)"
        )
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
