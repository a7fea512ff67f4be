"""Checks on the composed config alone, before any component is built or any model loads: every problem at once,
naming the keys, as one ConfigError (rlvr/run.py raises it; `rlvr doctor` reports the same problems one by one).

    unknown_keys       top-level keys nothing reads (`+algoritm=maxrl`)
    condition_errors   a `condition=` contradicted by `algorithm=`/`transform=` (Hydra's choices)
    type_errors        unset `???` values; each YAML value against the `_target_` constructor's annotations,
                       recursively (check_types), and keys the constructor does not take
    value_errors       each component's own rules (its `needs(settings).errors`), then the rules between
                       components (micro-batches, back pressure, positions) and of the top-level keys
    unmet_needs        what a chosen component requires that no other provides (rlvr/protocols.py: Needs)
    start_errors       the machine requirements every run checks at start (keys, model files)
    world_errors       several processes need a backend that trains over them

The component groups are conf/train.yaml's defaults list (`GROUPS`), less `condition` and `campaign`, which are
deltas to the whole config rather than components.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import sys
import types
import typing
from pathlib import Path

from hydra.utils import get_class, get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from rlvr.config_sources import REPO_CONF, config_dirs, option_file
from rlvr.distributed import World
from rlvr.errors import ConfigError
from rlvr.hydra_errors import TOP_LEVEL_KEYS, renamed, unchosen_group, unknown_top_level_key
from rlvr.protocols import CAPABILITIES, Needs
from rlvr.providers import how
from rlvr.tools import TOOL_KEYS


def hydra_choice(group: str) -> str | None:
    """The option chosen for `group` in this Hydra job, or None (not chosen, or not run by Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None


def check(cfg: DictConfig) -> dict[str, Needs]:
    """Checks on the config alone (no component is built), every problem at once, as a ConfigError; returns
    each group's declared needs."""
    needs, errors = config_problems(cfg)
    errors = condition_errors(cfg) + discover_errors() + errors
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    return needs


def config_problems(cfg: DictConfig, at_start: bool = True) -> tuple[dict[str, Needs], list[str]]:
    """Each group's declared needs and every problem found: types against each `_target_`'s signature (alone
    when there are any: the rules after them assume the types), then value ranges, cross-field rules, what
    the chosen components need of each other and, with `at_start`, the machine requirements every run checks
    at start (`rlvr doctor` reports those one by one instead)."""
    errors = unknown_keys(cfg) + type_errors(cfg)
    if errors:
        return {}, errors
    needs = {group: declared_needs(cfg, group) for group in chosen_groups(cfg)}
    errors = value_errors(cfg, needs) + unmet_needs(cfg, needs) + loss_support_errors(cfg)
    return needs, (errors + start_errors(cfg, needs) + world_errors(cfg, needs) if at_start else errors)


def loss_support_errors(cfg: DictConfig) -> list[str]:
    """What of `algorithm.loss` the chosen backend declares it does not compute (rlvr/loss/support.py)."""
    from rlvr.algorithm.loss import PolicyLoss
    from rlvr.loss.support import support_errors

    loss = cfg.algorithm.get("loss") if "algorithm" in cfg and cfg.algorithm is not None else None
    settings = OmegaConf.to_container(loss, resolve=True, throw_on_missing=False) if loss is not None else None
    target = settings.get("_target_") if isinstance(settings, dict) else None
    custom = target is not None and get_object(target) is not PolicyLoss
    return support_errors(get_class(cfg.backend._target_), cfg.backend._target_, settings, custom)


def world_errors(cfg: DictConfig, needs: dict[str, Needs]) -> list[str]:
    """A run started as several processes (torchrun, a SLURM job of several tasks) needs a backend that trains
    over them."""
    world = World.from_env()
    if world.size > 1 and "distributed" not in needs["backend"].provides:
        return [f"this run is {world.size} processes (torchrun or SLURM tasks), but backend "
                f"<{cfg.backend._target_}> trains in one: choose backend=fsdp, or start one process"]
    return []


def type_errors(cfg: DictConfig) -> list[str]:
    """Mandatory values left unset (`???`), and values of the wrong type or for no constructor argument."""
    groups = chosen_groups(cfg)
    missing = [f"{key}=??? must be set (e.g. {key}=...)" for group in groups  # full keys (data.path)
               for key in sorted(OmegaConf.missing_keys(cfg[group]))]
    return missing + [e for group in groups for e in check_types(cfg[group], group)]


def value_errors(cfg: DictConfig, needs: dict[str, Needs]) -> list[str]:
    """Each component's own rules (its `needs(settings).errors`: the trainer's in rlvr/trainer_rules.py), then
    the rules between components and the top-level keys (the types being right; numbers that are not finite alone,
    since the rules compare numbers and NaN passes every comparison's `not`)."""
    errors = nonfinite_errors(cfg)
    if errors:
        return errors
    errors = [e for group in needs.values() for e in group.errors] + position_errors(cfg)
    t = cfg.trainer
    rows = t.batch_size * t.group_size
    mb = cfg.backend.get("micro_batch_size", 0)
    if mb and (mb < 0 or rows % mb):
        errors.append(
            f"backend.micro_batch_size={mb} does not divide trainer.batch_size × trainer.group_size "
            f"= {t.batch_size} × {t.group_size} = {rows}"
        )
    errors += check_backpressure(cfg)
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or not 0 <= cfg.seed < 2**63:
        errors.append(f"seed={cfg.seed!r} must be an integer in [0, 2**63)")
    threads = cfg.get("threads")
    if threads is not None and threads != "auto" and (not isinstance(threads, int) or isinstance(threads, bool)
                                                      or threads < 1):
        errors.append(f"threads={threads!r}: expected auto, a positive integer or null (torch's default)")
    if cfg.resume not in ("auto", "never", "must"):
        errors.append(f"resume={cfg.resume!r}: expected auto, never or must")
    return errors


def nonfinite_errors(cfg: DictConfig) -> list[str]:
    """Every number written in the config must be finite: NaN and ±inf pass the range rules' comparisons and then
    cannot train (`trainer.lr=nan` made every weight NaN at the first update; `algorithm.kl.coef=inf` passes `>= 0`).
    Read where written (before interpolation): `algorithm.kl.coef`, not also `algorithm.loss.kl.coef`, which reads
    it. No key takes an infinite value to mean "no limit": those say 0 or null."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)  # a DictConfig's container
    return [f"{key}={value} must be a finite number" for key, value in leaves({k: v for k, v in tree.items()
            if k != "hydra"}) if isinstance(value, float) and not math.isfinite(value)]


def leaves(node: object, key: str = "") -> collections.abc.Iterator[tuple[str, object]]:
    """(dotted key, value) of every value in a config's container, list items as `key[i]`."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from leaves(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, f"{key}[{i}]")
    else:
        yield key, node


def position_errors(cfg: DictConfig) -> list[str]:
    """A model with a known number of positions (model.max_positions) must hold a prompt token and the longest
    completion, and a multi-turn episode's whole context."""
    positions = cfg.model.get("max_positions")
    if not isinstance(positions, int) or isinstance(positions, bool):
        return []
    t, errors, model = cfg.trainer, [], f"model <{cfg.model._target_}> has {positions} positions (model.max_positions)"
    for key, value in (("sampling.max_tokens", t.sampling.max_tokens), ("eval_max_tokens", t.eval_max_tokens)):
        if value >= positions:
            errors.append(f"trainer.{key}={value} does not fit: {model}, shared by the prompt (at least 1 token) "
                          f"and the completion; at most {positions - 1}")
    context = (cfg.get("env") or {}).get("max_context_tokens")
    if isinstance(context, int) and context > positions:
        errors.append(f"env.max_context_tokens={context} does not fit: {model}; at most {positions}. To fit, give the "
                      f"model the positions (model.max_positions={context}), or the episodes fewer tokens "
                      f"(env.max_context_tokens={positions}, fewer turns with env.max_turns=N, shorter actions with "
                      "trainer.sampling.max_tokens=N) where the environment's first observation still fits")
    return errors


def check_backpressure(cfg: DictConfig) -> list[str]:
    """A back pressure that chooses batch sizes (one whose option has min/max_batch_size) starts from
    trainer.batch_size inside its bounds, and every batch size it may choose fits backend.micro_batch_size."""
    bp = cfg.get("backpressure")
    if bp is None or "min_batch_size" not in bp or "max_batch_size" not in bp:
        return []
    lo, hi, t, errors = bp.min_batch_size, bp.max_batch_size, cfg.trainer, []
    if not lo <= t.batch_size <= hi:
        errors.append(f"trainer.batch_size={t.batch_size} is outside backpressure.min_batch_size .. max_batch_size "
                      f"= {lo} .. {hi}")
    mb = cfg.backend.get("micro_batch_size", 0)
    periods = range(lo, min(hi, lo + mb) + 1) if mb > 0 else ()  # b × G mod mb repeats with period mb in b
    misfit = next((b for b in periods if (b * t.group_size) % mb), None)
    if misfit is not None:
        errors.append(f"backend.micro_batch_size={mb} does not divide b × trainer.group_size for every batch size b "
                      f"in backpressure.min_batch_size .. max_batch_size = {lo} .. {hi} (b = {misfit}: "
                      f"{misfit} × {t.group_size} = {misfit * t.group_size})")
    return errors


def unknown_keys(cfg: DictConfig) -> list[str]:
    """Top-level keys that are neither a group nor conf/train.yaml's own (`+algoritm=maxrl` adds one that nothing
    would read; a group's unknown keys are found against its constructor, `check_types`)."""
    return [unknown_top_level_key(str(key), cfg[key], config_dir()) for key in cfg
            if key not in GROUPS and key not in TOP_LEVEL_KEYS and key != "hydra"]  # `hydra`: a composition's own


def condition_errors(cfg: DictConfig) -> list[str]:
    """`condition=<arm>` names an algorithm and a transform (its `override /group: option` lines); a choice of
    another one for the same run contradicts it (`condition=grpo algorithm=reinforce_pp` would train REINFORCE++
    under grpo's name). `condition=none` lets the groups' own choices stand."""
    choice = hydra_choice("condition")
    if choice in (None, "none"):
        return []
    dirs, errors = config_dirs(), []
    for group, named in condition_choices(option_file(dirs, "condition", choice)).items():
        chosen = hydra_choice(group)
        if chosen is not None and canonical_option(dirs, group, chosen) != canonical_option(dirs, group, named):
            errors.append(f"condition={choice} trains {group}={named}, but {group}={chosen} was chosen too: drop one "
                          f"of them, or say condition=none to train {group}={chosen}")
    return errors


def discover_errors() -> list[str]:
    """TTT-Discover is trainer=discover (its loop's knobs) over data=discover (the archive), which trainer=discover
    selects: one without the other would train the data's task without an archive, or the archive without the loop's
    settings (its warm-up, evaluation, token budget)."""
    trainer, data = hydra_choice("trainer"), hydra_choice("data")
    if (trainer == "discover") != (data == "discover") and None not in (trainer, data):
        return [f"TTT-Discover is trainer=discover over data=discover (trainer={trainer} and data={data} were chosen): "
                "run `python train.py trainer=discover`, which selects data=discover, reward=closeness and "
                "algorithm=discover_entropic"]
    return []


def config_dir() -> Path:
    """The folder train.py composes from (Hydra's primary config source), else the repository's conf/; the
    `hydra.searchpath` folders after it are `config_dirs()`."""
    return config_dirs()[0]


def condition_choices(path: Path | None) -> dict[str, str]:
    """{group: option} of a condition file's `override /group: option` defaults (none without a file)."""
    import yaml

    defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults", []) if path and path.is_file() else []
    return {k.removeprefix("override /"): str(v) for entry in defaults if isinstance(entry, dict)
            for k, v in entry.items() if k.startswith("override /")}


def canonical_option(dirs: collections.abc.Sequence[Path], group: str, option: str) -> str:
    """An option an alias file only extends (transform=gtpo_sepa: `defaults: [sepa]`, nothing else) is that one;
    the files are looked up in `dirs` (`config_dirs()`) as Hydra finds them."""
    import yaml

    path = option_file(dirs, group, option)
    data = yaml.safe_load(path.read_text()) if path else None
    if isinstance(data, dict) and list(data) == ["defaults"] and len(data["defaults"]) == 1 and \
            isinstance(data["defaults"][0], str) and data["defaults"][0] != "_self_":
        return canonical_option(dirs, group, data["defaults"][0])
    return option


def component_groups(train_yaml: Path) -> tuple[str, ...]:
    """The groups of conf/train.yaml's defaults list that build a component: all but `_self_` and the deltas to the
    whole config (`condition`, `campaign`)."""
    import yaml

    defaults = yaml.safe_load(train_yaml.read_text())["defaults"]
    names = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    return tuple(n for n in names if n not in ("condition", "campaign"))


GROUPS = component_groups(REPO_CONF / "train.yaml")


def chosen_groups(cfg: DictConfig) -> list[str]:
    """The groups this config has a component for (`env=none` composes `env: null`: single turn). `turn_credit` is
    one even without an env, so that a choice that needs episodes says so (`unmet_needs`); then it is not built."""
    return [g for g in GROUPS if g in cfg and cfg[g] is not None]
def check_types(node: DictConfig, key: str) -> list[str]:
    """Each YAML value against the type annotation of the `_target_` parameter it feeds, recursively;
    YAML keys the target does not take are errors too."""
    if "_target_" not in node:  # keys added to a group whose option builds nothing (`+env.max_turns=3` under env=none)
        return [unchosen_group(f"{key}.{name!s}={_show(node[name])}", key, hydra_choice(key) or "none", config_dir())
                for name in node]
    try:
        target = get_class(node._target_)
    except Exception as err:  # noqa: BLE001 - any import failure is a config error here
        return [f"{key}._target_={node._target_!r} cannot be imported: {err}"]
    params = inspect.signature(target).parameters
    hints = parameter_types(target)
    errors = []
    # a _target_ node's keys name parameters: strings (omegaconf types a key as any DictKeyType)
    for name in typing.cast(collections.abc.Iterable[str], node):
        if name.startswith("_") or (key == "env" and name in TOOL_KEYS):  # the tool harness's (rlvr/tools/)
            continue
        if name not in params:
            expected = ", ".join(p for p in params if p in node)  # what the builder passes besides is not YAML
            errors.append(f"{key}.{name}: <{node._target_}> takes no such argument (it takes: {expected})"
                          f"{moved(node, key, name)}")
            continue
        if OmegaConf.is_missing(node, name):
            continue  # reported by type_errors as unset
        value = node[name]
        if isinstance(value, DictConfig) and "_target_" in value:
            if str(value._target_).startswith("rlvr."):  # a library's callable (tinker.ServiceClient) is built as
                errors += check_types(value, f"{key}.{name}")  # given: importing it here would cost its import
        elif name in hints and not fits(value, hints[name]):
            quote = " (YAML reads off, no, yes, on as booleans: quote the word)" if isinstance(value, bool) else ""
            errors.append(f"{key}.{name}={_show(value)} must be {_describe(hints[name])}{quote}")
    return errors


def moved(node: DictConfig, key: str, name: str) -> str:
    """`; <key>.<name> is now <its new name> (say …)` for a key that moved (rlvr/hydra_errors.py RENAMED), else ''."""
    hint = renamed(f"{key}.{name}", typing.cast(dict, OmegaConf.to_container(node))[name])  # a DictConfig: a dict
    return f"; {hint}" if hint else ""


def parameter_types(target) -> dict[str, object]:
    """Each constructor parameter's annotation, evaluated one at a time in the module's namespace: a name
    imported only for type checkers (`Tensor`, `nn.Module`) leaves that parameter unchecked, not all of them."""
    init = target.__init__ if inspect.isclass(target) else target
    namespace = {**vars(typing), **vars(sys.modules[target.__module__])}
    types_ = {}
    for name, annotation in getattr(init, "__annotations__", {}).items():
        try:
            types_[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
        except Exception:  # noqa: BLE001 - an annotation only a type checker can resolve: nothing to check
            continue
    return types_


def fits(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        return isinstance(value, (list, tuple, ListConfig))  # a str is a Sequence too, but never meant here
    return True  # objects, protocols, Any: built and checked by their own constructors


def _describe(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _show(value) -> str:
    return repr(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value)


def declared_needs(cfg: DictConfig, group: str) -> Needs:
    """What the `cfg[group]` option's class says it needs (`needs(settings)`, rlvr/protocols.py)."""
    target = cfg[group]._target_
    needs = getattr(get_class(target), "needs", None)
    if needs is None:
        raise ConfigError(f"{group}._target_={target!r} declares no `needs(settings)` classmethod, which every "
                          "component has (rlvr/protocols.py: Component)")
    return needs(OmegaConf.to_container(cfg[group], resolve=True, throw_on_missing=False))


def start_errors(cfg: DictConfig, needs: dict[str, Needs]) -> list[str]:
    """The machine requirements every run checks at start (an API key's variable, a model's files, threads, free
    disk) that fail; the others are checked before the model loads (rlvr/machine_check.py)."""
    from rlvr.machine_check import machine_requirements

    return [f"{who} <{cfg[who]._target_}>: {found.detail}" if who in needs else f"{found.detail}"
            for who, requirement in machine_requirements(cfg, needs, run_folder(cfg))
            if requirement.at_start and (found := requirement.check()).status == "missing"]


def run_folder(cfg: DictConfig) -> Path:
    """Where the run writes: the Hydra job's folder, else the composed `hydra.run.dir` (rlvr doctor), else here."""
    from hydra.core.hydra_config import HydraConfig

    try:
        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001 - a composition without a job (rlvr doctor) has no runtime folder
        pass
    try:
        return Path(str(cfg.hydra.run.dir))
    except Exception:  # noqa: BLE001 - no `hydra` node: a config composed without it
        return Path.cwd()


def unmet_needs(cfg: DictConfig, needs: dict[str, Needs]) -> list[str]:
    """One message per capability a chosen component requires and no other chosen component provides, and per
    capability a chosen component excludes and another provides: the one rule by which an option that would act
    only with another (turn credit or echo without an env), or would silently do nothing or go wrong beside one
    (dynamic sampling on episodes, sampling ahead on Tinker), is refused at start."""
    errors = []
    for group, declared in needs.items():
        for name, why in declared.requires.items():
            if not any(name in other.provides for g, other in needs.items() if g != group):
                capability = CAPABILITIES[name]
                errors.append(f"{group} <{cfg[group]._target_}> needs {capability.meaning} ({why}), which no chosen "
                              f"component gives: {how(name, capability)}")
        for name, why in declared.excludes.items():
            for other in [g for g, n in needs.items() if g != group and name in n.provides]:
                errors.append(f"{group} <{cfg[group]._target_}> does not work with {CAPABILITIES[name].meaning}, "
                              f"which {other} <{cfg[other]._target_}> gives: {why}")
    return errors


