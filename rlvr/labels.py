"""What a run is, in two names read from its composed config: the condition label and the task.

    label = <algorithm>+<transform>[,scale=<scale>][,form=<form>][,loss=<mode>][,agg=<aggregation>]
            [,clip=<ε>[/<ε_high>]][,cap=<cispo_max>][,ds=<dynamic sampling>][,overlong=<buffer_frac>[x<penalty>]]
            [,overlong_filter][,ahead=<k>[/bounded][/partial]]
            [,corr=<correction>[/decoupled]][,kl=<coef>[/<estimator>][/reward]][,ent=<entropy_coef>]
            [,distill=<coef>[/full][/top<k>][/beta<β>][/tail]][,sd=full[/top<k>][/beta<β>][/tail]]
            [,turn=<turn credit>]
            [,backend=<backend>]
    task  = [<env>-]<data>[-<reward>]-<model>

Both come from the `_target_`s and values the run is built from, never from the name of a Hydra choice:
`condition=maxrl_gtpo_sepa` and `algorithm=maxrl transform=sepa` are one config and get one label,
`maxrl+sepa`; `--multirun condition=grpo,maxrl algorithm=reinforce_pp` trains REINFORCE++ twice and both
runs are labelled `reinforce_pp+none` (and refused at start, rlvr/config_check.py, unless `condition=none`). The
label is what `metrics.jsonl`, `summary.json`, `rlvr status`, `rlvr compare` and `rlvr plot` show; the
default run folder is `outputs/<task>/<label>/<time>` (conf/train.yaml).

Every choice that changes the objective or the task shows: the algorithm, the transform, GRPO's advantage scale
other than `none`, a loss form other than `ppo`, a loss mode other than `standard`, a loss aggregation other than
`token_mean`, PPO's clip range (or CISPO's cap other than 5), dynamic sampling and DAPO's overlong handling,
sampling ahead of training (the rollouts come from weights k updates old), a
mismatch correction (or a decoupled π_old), a reference KL (its coefficient, its estimator when not the default of
where it applies, `reward` when in the reward) or an entropy bonus, a distillation teacher's coefficient, estimator,
top-k and divergence (and a self-teacher's), the turn credit of multi-turn episodes, a backend that samples elsewhere
(`tinker`; fsdp samples the same rollouts as one process), the environment, the data (with its file or task), the
verifier (single turn: an environment scores its own episodes) and the model. Everything else (learning rate, group
size, …) is the same within a comparison by rule: `rlvr compare` refuses cells whose configs differ.

Names are the familiar option names (`sepa_amp_c`, not `SEPAAmpClamped`): a class is named by the option file
that declares it as its `_target_`, in conf/ or in a `hydra.searchpath` folder (`names`); a class no option file
declares (`transform._target_=my_transforms.Mine` on the command line) is named by its module and class.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import cast

from rlvr.config_sources import config_dirs, group_options, option_file, read_yaml

LABELLED_GROUPS = ("algorithm", "transform", "turn_credit", "env", "data", "reward", "backend", "model")
"""The groups whose components a label or a task names (`condition_label`, `task_name`)."""


def names() -> dict[str, str]:
    """{`_target_`: option} of every option of `LABELLED_GROUPS` in the folders this run composes from
    (rlvr/config_sources.py): a class is named by the option file that declares it."""
    return target_names(config_dirs())


@functools.cache
def target_names(dirs: tuple[Path, ...]) -> dict[str, str]:
    """{`_target_`: option} over `dirs`: the options whose file declares a `_target_` of its own (an alias file,
    `defaults: [sepa]` alone, names none). Where several options declare one class, `own_option` picks."""
    declaring: dict[str, list[str]] = {}
    for group in LABELLED_GROUPS:
        for option in group_options(dirs, group):
            path = option_file(dirs, group, option)
            target = declared_target(path, group) if path else None
            if target:
                declaring.setdefault(target, []).append(option)
    return {target: own_option(target, options) for target, options in declaring.items()}


def declared_target(path: Path, group: str) -> str | None:
    """The `_target_` an option file itself writes for its group's node (a `# @package _global_` file, env=guess,
    writes it under `<group>:`), or None."""
    text = path.read_text()
    data = read_yaml(text)
    if isinstance(data, dict) and text.startswith("# @package _global_"):
        data = data.get(group)
    target = data.get("_target_") if isinstance(data, dict) else None
    return str(target) if target else None


def own_option(target: str, options: list[str]) -> str:
    """Of several options declaring one class (model=tiny and model=tiny_tools), the one named as the class's
    module (`rlvr.model.tiny.TinyLlama`: tiny); else the first by name."""
    module = target.rpartition(".")[0].rpartition(".")[2]
    return module if module in options else options[0]


SAME_ROLLOUTS_BACKENDS = ("local", "fsdp")
"""Backends that train on the rollouts this process samples (fsdp: the same ones as one process)."""


def name(node: Mapping | None) -> str:
    """The familiar name of the component `node` builds: the option declaring its target (`names`), else
    `<module>.<Class>` of its target."""
    if not node:
        return "none"
    target, known = str(node.get("_target_", "?")), names()
    if target in known:
        return known[target]
    module, _, cls = target.rpartition(".")
    return f"{module.rpartition('.')[2]}.{cls}" if module else cls


def condition_label(config: Mapping) -> str:
    """`<algorithm>+<transform>`, then the other objective-changing choices that are not the default."""
    label = f"{name(config.get('algorithm'))}+{name(config.get('transform'))}"
    scale = (config.get("algorithm") or {}).get("scale", "none")
    if scale != "none":
        label += f",scale={scale}"
    if name(config.get("algorithm")) == "pkpo":  # the k of pass@k is PKPO's objective: two ks are two arms
        label += f",k={(config.get('algorithm') or {}).get('k')}"
    form = ((config.get("algorithm") or {}).get("loss") or {}).get("form", "ppo")
    if form != "ppo":
        label += f",form={form}"
    mode = ((config.get("algorithm") or {}).get("loss") or {}).get("mode", "standard")
    if mode != "standard":
        label += f",loss={mode}"
    aggregation = ((config.get("algorithm") or {}).get("loss") or {}).get("aggregation", "token_mean")
    if aggregation != "token_mean":
        label += f",agg={aggregation}"
    label += clip_label((config.get("algorithm") or {}).get("loss") or {})
    label += sampling_label(config.get("trainer") or {})
    correction = ((config.get("algorithm") or {}).get("loss") or {}).get("correction") or {}
    if correction.get("kind", "none") != "none" or correction.get("pi_old", "bypass") != "bypass":
        label += f",corr={correction.get('kind', 'none')}" + ("/decoupled" if correction.get("pi_old") == "decoupled"
                                                              else "")
    label += regularizer_label(config.get("algorithm") or {})
    label += distill_label(config) + self_distill_label(config)
    if config.get("env"):
        label += f",turn={name(config.get('turn_credit'))}"
    backend = name(config.get("backend"))
    if backend not in SAME_ROLLOUTS_BACKENDS:
        label += f",backend={backend}"
    return label


def distill_label(config: Mapping) -> str:
    """`,distill=<coef>` when a teacher's credit joins the RL credit; under algorithm=opd, whose credit it is alone,
    only a coefficient other than 1 shows; then (`/`-joined) `estimator_parts`."""
    distill = config.get("distill")
    if not distill:
        return ""
    coef = distill.get("coef", 1.0)
    parts = [] if name(config.get("algorithm")) == "opd" and coef == 1.0 else [
        f"{coef:g}" if isinstance(coef, (int, float)) else str(coef)]
    parts += estimator_parts(distill)
    return f",distill={'/'.join(parts)}" if parts else ""


def self_distill_label(config: Mapping) -> str:
    """`,sd=full[/top<k>][/beta<β>][/tail]` when transform=sdpo|sdft takes the self-teacher's divergence in the loss
    (transform.estimator=full), not its log-ratio as credit."""
    transform = config.get("transform") or {}
    if transform.get("estimator", "sampled") == "sampled":
        return ""
    return f",sd={'/'.join(estimator_parts(transform))}"


def estimator_parts(node: Mapping) -> list[str]:
    """The estimator and the divergence of distill=… or transform=sdpo|sdft: `full`, then `top<k>` for the teacher's
    top-k (not its whole vocabulary, topk=0), `beta<β>` for a divergence other than the reverse KL and `tail` for the
    tail bucket (the sampled estimator shows its `top<k>` alone: β and the tail are refused beside it)."""
    estimator, topk, beta = node.get("estimator", "sampled"), node.get("topk", 0), node.get("beta", 1.0)
    parts = [] if estimator == "sampled" else [str(estimator)]
    if topk:
        parts.append(f"top{topk}")
    if beta != 1.0:
        parts.append(f"beta{beta:g}" if isinstance(beta, (int, float)) else f"beta{beta}")
    if node.get("tail", False):
        parts.append("tail")
    return parts


def clip_label(loss: Mapping) -> str:
    """`,clip=<ε>[/<ε_high>]` when algorithm.loss.clip_eps > 0 (ε_high when it differs from ε), `,cap=<cispo_max>`
    under form=cispo when the cap is not 5; nothing at the defaults."""
    out, eps, high = "", loss.get("clip_eps", 0.0), loss.get("clip_eps_high", 0.0)
    if isinstance(eps, (int, float)) and eps > 0:
        out += f",clip={eps:g}" + (f"/{high:g}" if isinstance(high, (int, float)) and high and high != eps else "")
    cap = loss.get("cispo_max", 5.0)
    if loss.get("form") == "cispo" and cap != 5.0:
        out += f",cap={cap:g}"
    return out


def sampling_label(trainer: Mapping) -> str:
    """`,ds=<filter|refill>` for dynamic sampling, `,overlong=<buffer_frac>[x<penalty>]` for DAPO's soft punishment
    (the penalty when not 1), `,overlong_filter` for overlong filtering, `,ahead=<k>[/bounded][/partial]` for
    rollouts sampled k steps ahead of training (trainer.off_policy_steps; off_policy_mode when bounded; partial
    rollouts); nothing at the defaults (trainer.yaml)."""
    out, mode = "", trainer.get("dynamic_sampling", "off")
    if mode not in ("off", False):
        out += f",ds={mode}"
    overlong = trainer.get("overlong") or {}
    frac, penalty = overlong.get("buffer_frac", 0.0), overlong.get("penalty", 1.0)
    if frac:
        out += f",overlong={frac:g}" + (f"x{penalty:g}" if penalty != 1.0 else "")
    if overlong.get("filter"):
        out += ",overlong_filter"
    ahead = trainer.get("off_policy_steps", 0)
    if isinstance(ahead, int) and ahead > 0:  # sampled from older weights: the rollouts' policy is another
        out += f",ahead={ahead}" + ("/bounded" if trainer.get("off_policy_mode") == "bounded" else "") + (
            "/partial" if trainer.get("partial_rollouts") else "")
    return out


def regularizer_label(algorithm: Mapping) -> str:
    """`,kl=<coef>[/<estimator>][/reward]` when algorithm.kl.coef > 0 (the estimator when it is not `where`'s
    default, rlvr/algorithm/kl.py), `,ent=<entropy_coef>` when that is not 0; nothing at the defaults."""
    from rlvr.algorithm.kl import DEFAULT_ESTIMATOR

    out, kl = "", algorithm.get("kl") or {}
    coef = kl.get("coef", 0.0)
    if isinstance(coef, (int, float)) and coef > 0:
        where = kl.get("where", "loss")
        estimator = kl.get("estimator", "auto")
        out += f",kl={coef:g}"
        if estimator not in ("auto", DEFAULT_ESTIMATOR.get(where)):
            out += f"/{estimator}"
        if where != "loss":
            out += f"/{where}"
    entropy = algorithm.get("entropy_coef", 0.0)
    if isinstance(entropy, (int, float)) and entropy != 0:
        out += f",ent={entropy:g}"
    return out


def task_name(config: Mapping) -> str:
    """`[<env>-]<data>[-<reward>]-<model>`: what is learnt, from what, judged by what, by which model."""
    env, data = config.get("env"), config.get("data") or {}
    parts = [env_name(env)] if env else []
    parts.append(_detailed(name(data), data, {"jsonl": "path", "reasoning_gym": "task"}))
    if not env:  # an environment scores its own episodes
        reward = config.get("reward") or {}
        parts.append(_detailed(name(reward), reward, {"function": "function"}))
    parts.append(model_name(config.get("model") or {}))
    return "-".join(safe(p) for p in parts)


def env_name(env: Mapping) -> str:
    return _detailed(name(env), env, {"textarena": "game", "verifiers": "environment", "openenv": "environment"})


def model_name(model: Mapping) -> str:
    """`tiny`, or a pretrained model's hub id / folder name (Qwen/Qwen3-0.6B → qwen3-0.6b)."""
    path = model.get("name_or_path")
    return PurePath(str(path)).name.lower() if path and name(model) == "pretrained" else name(model)


def _detailed(base: str, node: Mapping, detail_keys: Mapping[str, str]) -> str:
    """`base`, with the value that picks among a component's many tasks (a file's stem, a game, a function)."""
    key = detail_keys.get(base)
    value = node.get(key) if key else None
    if not value or str(value).startswith("???"):
        return base
    value = str(value)
    return f"{base}.{PurePath(value).stem if key == 'path' else value.rpartition('.')[2] or value}"


def safe(text: str) -> str:
    """A folder name: anything but letters, digits and `._+=,-` becomes `_`."""
    return re.sub(r"[^A-Za-z0-9._+=,-]", "_", text)


def register_resolvers() -> None:
    """`${rlvr.task:}` and `${rlvr.label:}`, the default run folder's parts (conf/train.yaml's hydra.run.dir),
    read from the config being composed."""
    from omegaconf import DictConfig, OmegaConf

    def plain(root) -> Mapping:  # a DictConfig converts to a dict (omegaconf's return type is every container)
        return cast(dict, OmegaConf.to_container(root, resolve=False)) if isinstance(root, DictConfig) else root

    for key, fn in (("rlvr.task", task_name), ("rlvr.label", condition_label)):
        if not OmegaConf.has_resolver(key):
            OmegaConf.register_new_resolver(key, lambda *, _root_, fn=fn: safe(fn(plain(_root_))))
