"""The `trainer` node's own rules: its values (ranges, and the rules between its keys), and what its options need
of the other chosen components or cannot act beside (rlvr/protocols.py `Needs`; rlvr/config_check.py reports
them with every other component's). `Trainer.needs` is this module's `needs`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlvr.protocols import Needs
from rlvr.reward.guarded import MAX_ABS


def needs(settings: Mapping[str, Any]) -> Needs:
    """The loop's options that act only with another component, or not beside one, and its values' errors."""
    requires, excludes = {}, {}
    if (steps := settings["warmup"]["steps"]) > 0:
        requires["local_policy"] = f"trainer.warmup.steps={steps}: the SFT warm-up trains it here"
    if capture := settings.get("capture_steps"):
        requires["capture"] = f"trainer.capture_steps={list(capture)} writes down the updates of those steps"
    overlong = settings.get("overlong") or {}
    single = [f"trainer.dynamic_sampling={settings.get('dynamic_sampling', 'off')}"] if settings.get(
        "dynamic_sampling", "off") != "off" else []
    single += [f"trainer.overlong.{k}={overlong[k]}" for k in ("buffer_frac", "filter") if overlong.get(k)]
    if single:
        excludes["episodes"] = (f"{', '.join(single)} read(s) single-turn completions (a group's rewards, a "
                                "completion's length and EOS): with an env leave trainer.dynamic_sampling=off "
                                "and trainer.overlong off")
    ahead = settings.get("off_policy_steps", 0)
    if isinstance(ahead, int) and ahead > 0:
        requires["off_policy_loss"] = f"trainer.off_policy_steps={ahead} trains on rollouts sampled {ahead} " \
                                       "update(s) behind"
    if settings.get("partial_rollouts") is True:
        requires["partial_rollouts"] = "trainer.partial_rollouts=true continues unfinished sequences under new weights"
        excludes["episodes"] = ("trainer.partial_rollouts=true continues single-turn completions (an episode's turns "
                                "are not built): with an env set trainer.partial_rollouts=false")
    return Needs(provides=frozenset({"sampled_ahead"}) if isinstance(ahead, int) and ahead > 0 else frozenset(),
                 requires=requires, excludes=excludes, errors=tuple(errors(settings)))


def errors(t: Mapping[str, Any]) -> list[str]:
    """Every rule of the node's values that fails (its types already checked against the Trainer's signature)."""
    return (range_errors(t) + eval_errors(t) + overlap_errors(t) + refill_errors(t) + capture_errors(t))


def range_errors(t: Mapping[str, Any]) -> list[str]:
    sampling, warmup = t["sampling"], t["warmup"]
    positive = {"batch_size": t["batch_size"], "group_size": t["group_size"], "lr": t["lr"],
                "log_every": t["log_every"], "eval_max_tokens": t["eval_max_tokens"],
                "sampling.max_tokens": sampling["max_tokens"],
                "reward_max_abs": t.get("reward_max_abs", MAX_ABS)}  # a config stored before it existed: the default
    errors = [f"trainer.{k}={v} must be > 0" for k, v in positive.items() if v <= 0]
    at_least_0 = {"max_steps": t["max_steps"], "save_every": t["save_every"], "eval_every": t["eval_every"],
                  "max_skipped_steps": t.get("max_skipped_steps", 50), "max_failed_steps": t.get("max_failed_steps", 5),
                  "samples_per_step": t["samples_per_step"], "warmup.steps": warmup["steps"],
                  "sampling.temperature": sampling["temperature"]}
    errors += [f"trainer.{k}={v} must be >= 0" for k, v in at_least_0.items() if v < 0]
    if t["group_size"] == 1:
        errors.append("trainer.group_size=1: every group's rewards tie, so no step would train (need >= 2)")
    if sampling["temperature"] == 0 and t["max_steps"] > 0:
        errors.append("trainer.sampling.temperature=0 samples greedily: a group's completions are all alike, their "
                      "rewards tie, and no RL step would train (need > 0; evaluation is greedy already)")
    if not 0 < sampling["top_p"] <= 1:
        errors.append(f"trainer.sampling.top_p={sampling['top_p']} must be in (0, 1]")
    if not 0 <= t["reward_warn_frac"] <= 1:
        errors.append(f"trainer.reward_warn_frac={t['reward_warn_frac']} must be in [0, 1]")
    if warmup["steps"] > 0:
        errors += [f"trainer.warmup.{k}={v} must be > 0 when trainer.warmup.steps > 0"
                   for k, v in (("batch_size", warmup["batch_size"]), ("lr", warmup["lr"])) if v <= 0]
    return errors


def eval_errors(t: Mapping[str, Any]) -> list[str]:
    """trainer.eval_samples and final_eval_samples (0 or 1: greedy; k >= 2: sampled at trainer.eval_temperature,
    rlvr/rollout/sampled_eval.py), trainer.eval_rows (rows sampled at once). A config stored before they existed
    has none: greedy, in one part."""
    temperature, rows = t.get("eval_temperature", 1.0), t.get("eval_rows", 1)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        return [f"trainer.eval_rows={rows!r} must be an integer >= 1 (rows sampled at once in an evaluation)"]
    final = t.get("final_eval_samples")
    for key, k in (("eval_samples", t.get("eval_samples", 0)), ("final_eval_samples", final)):
        if key == "final_eval_samples" and k is None:
            continue
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            return [f"trainer.{key}={k!r} must be an integer >= 0 (0 or 1: greedy evaluation; k >= 2: k samples "
                    "per held-out example)" + ("; null: trainer.eval_samples" if key == "final_eval_samples" else "")]
        if k >= 2 and not temperature > 0:
            return [f"trainer.eval_temperature={temperature} must be > 0 with trainer.{key}={k}: k samples at T=0 "
                    f"would be k copies of the greedy one (for greedy evaluation leave trainer.{key}=0)"]
    return []


def overlap_errors(t: Mapping[str, Any]) -> list[str]:
    """trainer.off_policy_steps ≥ 1 (rlvr/overlap.py): its values. What it needs of the other components (the
    decoupled loss) and what refuses it (back pressure, Tinker, a sleeping vLLM) they declare (`needs`)."""
    k, mode = t.get("off_policy_steps", 0), t.get("off_policy_mode", "fixed")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        return [f"trainer.off_policy_steps={k!r} must be an integer >= 0 (0 = the synchronous loop)"]
    if mode not in ("fixed", "bounded"):
        return [f"trainer.off_policy_mode={mode!r}: expected fixed or bounded"]
    partial = t.get("partial_rollouts", False)
    if partial and k == 0:
        return ["trainer.partial_rollouts=true continues sequences across weight updates, so their tokens are up to k "
                "updates old: set trainer.off_policy_steps=k >= 1 (the staleness bound)"]
    if partial and mode != "fixed":
        return ["trainer.partial_rollouts=true samples in trainer.off_policy_mode=fixed only (repeatable; bounded: "
                "not built)"]
    return []


def refill_errors(t: Mapping[str, Any]) -> list[str]:
    """trainer.dynamic_sampling=refill draws its later rounds in the step (that they read single-turn completions,
    `needs` declares)."""
    if t.get("dynamic_sampling", "off") == "refill" and t.get("off_policy_steps", 0):
        return [f"trainer.dynamic_sampling=refill samples more prompts in the step until batch_size groups differ; a "
                f"step sampled ahead (trainer.off_policy_steps={t['off_policy_steps']}) cannot know where the data "
                "stream will be: use trainer.off_policy_steps=0, or trainer.dynamic_sampling=filter"]
    return []


def capture_errors(t: Mapping[str, Any]) -> list[str]:
    """trainer.capture_steps (rlvr/capture.py): steps of this run, whose update backend=local writes down (its
    checkpoint writer saves the exact starting state; FSDP's shards and Tinker's service are not captured)."""
    steps = t.get("capture_steps") or []
    if not steps:
        return []
    setting, max_steps = f"trainer.capture_steps={list(steps)}", t["max_steps"]
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < max_steps for s in steps):
        return [f"{setting}: expected a list of step indices in 0 .. {max_steps - 1} (0-based, as metrics.jsonl's "
                f"`step`; trainer.max_steps={max_steps})"]
    return []  # that the backend writes its update down, `needs` requires
