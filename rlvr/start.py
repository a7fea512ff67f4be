"""A run's start: the policy loaded (or, on a remote backend, its tokenizer), warmed up by SFT (or its warm-up read
from the cache), the backend and the engine built around it, connected, and the rollout that samples from it:
the loop's working set (`Live`). The trainer starts a run with it; the checkpoint commands build their policy with
`local_policy` (rlvr/cli/from_checkpoint.py)."""

from __future__ import annotations

import copy
import json
import logging
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

from rlvr.algorithm.kl import uses_reference
from rlvr.chat.check import check_chat
from rlvr.checkpoint import Checkpoints, rng_state, set_rng_state
from rlvr.components import Components, Live
from rlvr.model.base_folder import save_base
from rlvr.model.prompt_encoding import eos_ids
from rlvr.outputs import RunDir
from rlvr.pack.cells import current_cell
from rlvr.preemption import StopSignals
from rlvr.progress import Progress, duration
from rlvr.protocols import Backend, Engine, Rollout
from rlvr.reward.guarded import RewardGuard
from rlvr.rollout import Episodes, SingleTurn
from rlvr.types import Demonstration
from rlvr.warmup import Warmup

if TYPE_CHECKING:
    from rlvr.transform.self_distill import SelfDistill

log = logging.getLogger("rlvr")

MAX_GAME_DEMONSTRATIONS = 50_000
"""Games an environment plays for the warm-up at most (each drawn once when steps × batch size ≤ this)."""


def start(c: Components, warmup: Warmup, keep_last: int, out: RunDir, stop: StopSignals | None = None) -> Live:
    """Load the policy, run (or load) the warm-up (trainer.warmup), build backend and engine around it; checkpoints
    keep the last `keep_last` (trainer.keep_last)."""
    for name, value in c.seeds.as_dict().items():
        log.info("seed %-8s %d", name, value)
    if c.remote:  # the policy lives on a service: no weights here, no warm-up (refused at config time)
        log.info("loading the tokenizer of <%s>; the policy stays on the service", type(c.preset).__name__)
        tokenizer, stops = c.preset.load_tokenizer()
        check_template(c, tokenizer, stops)
        backend, info = c.make_backend(lora=c.preset.lora, lora_seed=c.seeds.lora), None
        engine = c.make_engine(policy=backend.policy, eos_ids=stops, pad_id=tokenizer.pad_token_id)
    else:
        module, tokenizer, _, info = warmed_up(c, warmup, out, stop)
        if out.writes:
            save_base(out.path / "base", module, tokenizer, c.preset, info["key"] if info else None)
        reference = uses_reference(c.algorithm.loss) or "reference_model" in c.needs["transform"].requires
        backend, engine = local_policy(c, module, tokenizer, reference=reference)
    engine.connect()
    engine = packed(engine)
    open_teachers(c, tokenizer, backend)
    log.info("condition %s | %d trainable parameters", c.condition, backend.trainable_parameters)
    return Live(c, tokenizer, backend, engine, make_rollout(c, engine, tokenizer, stop), out, info,
                Checkpoints(out.path / "checkpoints", keep_last, c.world), stop=stop)


def open_teachers(c: Components, tokenizer: Any, backend: Any) -> None:
    """distill=…: the teacher loaded beside the policy (or its server asked for its vocabulary), a tokenizer that
    differs refused (rlvr/distill/distill.py `open`); the RNG is left as it was (loading a model draws from it).
    transform=sdpo|sdft: templates whose text the tokenizer cannot spell refused, and the whole vocabulary of a large
    one as transform.estimator=full's support."""
    if c.wants_self_teacher:
        from rlvr.distill.distill import refuse_whole_vocabulary
        from rlvr.distill.self_teacher import check_template

        self_distill = cast("SelfDistill", c.transform)
        check_template(self_distill.teacher, tokenizer)
        if self_distill.estimator == "full":
            refuse_whole_vocabulary("transform", self_distill.topk, len(tokenizer))
    if c.distill is None:
        return
    before = rng_state()
    c.distill.open(tokenizer, getattr(backend, "device", "cpu"))
    set_rng_state(before)
    log.info("distillation teacher: %s", c.distill.describe())


def packed(engine: Engine) -> Engine:
    """The engine itself; in a packed grid's cell, wrapped to sample together with the other cells
    (rlvr/pack/sampling.py)."""
    cell = current_cell()
    if cell is None:
        return engine
    from rlvr.pack.sampling import CellEngine

    return cast(Engine, CellEngine(engine, cell))


def warmed_up(c: Components, warmup: Warmup, out: RunDir, stop: StopSignals | None = None
              ) -> tuple[Any, Any, list[int], dict | None]:
    """(module, tokenizer, EOS ids, warm-up info): the local policy RL starts from, loaded and warmed up (or its
    warm-up loaded from the cache), before any backend wraps it. `start` builds the backend and engine around
    it; bench/step.py hands the same module to TRL."""
    cell = current_cell()
    key = base_key(c) if cell is not None else None
    if cell is not None and key in cell.shared:  # a packed grid's cell: an earlier cell loaded and warmed it up
        module, tokenizer, stops, info, rng = cell.shared[key]
        log.info("policy <%s> shared with an earlier cell of the pack", type(c.preset).__name__)
        set_rng_state(rng)  # as after loading it here
        return sharing_weights(module), tokenizer, stops, loaded(info, out)
    log.info("loading policy <%s>", type(c.preset).__name__)
    module, tokenizer = c.preset.load(c.seeds.init)
    stops = eos_ids(tokenizer, module.generation_config.eos_token_id)
    check_template(c, tokenizer, stops)
    info = warm_up(c, warmup, module, tokenizer, out, stop)
    if cell is not None:
        source = info and {**info, "loaded_from": info["cache_entry"] or str(out.path / "base")}
        cell.shared[key] = (sharing_weights(module), tokenizer, stops, source, rng_state())
    return module, tokenizer, stops, info


def loaded(info: dict | None, out: RunDir) -> dict | None:
    """An earlier cell's warm-up, recorded as a run records a warm-up it loads (`Warmup.run`): its one row in
    warmup.jsonl, its facts with where it came from (the cache, or that cell's base/ without a cache)."""
    if info is None:
        return None
    out.append("warmup.jsonl", {"step": info["steps"], "steps": info["steps"], "loaded_from": info["loaded_from"]})
    log.info("warm-up loaded from %s", info["loaded_from"])
    return {**info, "seconds": 0.0, "final_loss": None}


def base_key(c: Components) -> str:
    """What the policy a run starts from depends on: the model, its init seed (where the model draws its weights
    from it, or a warm-up trains them: `base_of`), and its warm-up's settings and demonstrations (the data, or the
    environment's games)."""
    from rlvr.pack.fit import base_of

    config = c.config
    warmup = config["trainer"].get("warmup") or {}
    return json.dumps([config["model"], base_of(c.seeds.init, warmup.get("steps", 0), c.preset.seeded), warmup,
                       config.get("data"), config.get("env")], sort_keys=True, default=str)


def sharing_weights(module):
    """A copy of `module` whose parameters and buffers are `module`'s own tensors: a packed grid's cells that start
    from one policy hold one copy of its weights (LoRA trains adapters beside them; only full fine-tuning, never
    packed with another run, changes them)."""
    return copy.deepcopy(module, memo={id(t): t for t in [*module.parameters(), *module.buffers()]})


def check_template(c: Components, tokenizer, stops: list[int]) -> None:
    """A multi-turn run's chat template, checked before the warm-up and any training (rlvr/chat/check.py)."""
    if c.env is not None:
        check_chat(tokenizer, c.preset.name, stops, c.env.tools)


def warm_up(c: Components, w: Warmup, module, tokenizer, out: RunDir, stop: StopSignals | None) -> dict | None:
    """trainer.warmup: SFT on the task's demonstrations (or the environment's games), its steps in warmup.jsonl;
    a stop signal during it stops the run with nothing saved."""
    if w.steps <= 0:
        return None
    demos = demonstrations(c, w)
    key = w.cache_key(c.preset, c.seeds.init, demos)
    log.info("SFT warm-up: %d steps on %d demonstrations (cache key %s)", w.steps, len(demos), key)
    plan = stop.plan if stop is not None else ""
    if stop is not None:
        stop.plan = ("stopping the SFT warm-up: nothing is saved before the RL steps start, and the warm-up "
                     "starts over when the run continues")
    with Progress("warm-up", total=w.steps) as progress:

        def on_step(r: dict) -> None:
            out.append("warmup.jsonl", r)
            progress.update(1 if "loss" in r else w.steps - progress.done)
            if stop is not None and stop.requested and "loss" in r and r["step"] + 1 < w.steps:
                raise stop.stopped(f"during the SFT warm-up (step {r['step'] + 1} of {w.steps}); "
                                   "nothing was saved: the warm-up starts over when the run continues")

        def on_wait() -> None:
            if stop is not None and stop.requested:
                raise stop.stopped("while waiting for another run's SFT warm-up of the same key; nothing was saved")

        try:
            info = w.run(module, tokenizer, demos, c.seeds.init, key, on_step, out.path / "base",
                         on_wait if c.world.rank == 0 else None)
        finally:
            if stop is not None:
                stop.plan = plan
    log.info("warm-up %s", f"loaded from {info['loaded_from']}" if info["loaded_from"] else
             f"done in {duration(info['seconds'])}, final loss {info['final_loss']:.4f}")
    return info


def demonstrations(c: Components, w: Warmup) -> list[Demonstration]:
    """The warm-up's demonstrations: the environment's games when it plays some (`env=guess`: one per warm-up
    example drawn), else the data source's."""
    games = c.env.demonstrations if c.env is not None else None
    if games is None:
        return c.data.demonstrations()
    count = min(w.steps * w.batch_size, MAX_GAME_DEMONSTRATIONS)
    return [Demonstration(g[0], g[1], tuple(g[2:])) for g in games(count, c.seeds.init)]


def local_policy(c: Components, module, tokenizer, reference: bool = False) -> tuple[Backend, Engine]:
    """The backend around `module` (LoRA attached, or all weights trained) and the engine that samples from it, not
    yet connected: the trainer's, and the checkpoint commands' (rlvr/cli/from_checkpoint.py), built alike. With
    `reference` (algorithm.kl.coef > 0, the trainer's only) a full fine-tuning backend keeps a frozen copy of `module`,
    the base, as the reference (rlvr/algorithm/kl.py)."""
    own = sampling_copy(c, module)
    backend = c.make_backend(model=module, lora=c.preset.lora, lora_seed=c.seeds.lora, pad_id=tokenizer.pad_token_id,
                             **({"reference": True} if reference else {}))
    backend.prepare_sampling()  # on every process (backend=fsdp: a collective)
    stops = eos_ids(tokenizer, module.generation_config.eos_token_id)
    if own is not None:
        own.to(next(backend.policy.parameters()).device)
    return backend, c.make_engine(policy=own if own is not None else backend.policy, eos_ids=stops,
                                  pad_id=tokenizer.pad_token_id, **pack_hosts(c))


def pack_hosts(c: Components) -> dict[str, Any]:
    """In a packed grid's cell, an engine that samples several adapters on one base in one batch (`multi_lora`:
    engine=vllm) gets the pack's vLLMs to start its own in or share (`hosts`, rlvr/engine/vllm.py); else nothing."""
    cell = current_cell()
    if cell is None or "multi_lora" not in c.needs["engine"].provides:
        return {}
    from rlvr.engine.vllm import Hosts

    return {"hosts": cell.shared.setdefault("vllm", Hosts(cell.size))}


def sampling_copy(c: Components, module) -> Any:
    """An engine that samples with the trainer's module (engine=pytorch) sampling ahead of training
    (trainer.off_policy_steps ≥ 1) samples while the trainer changes its module: it gets a copy of its own, made
    here before the backend wraps the module (FSDP's cannot be copied) and adapted alike (the same LoRA draw; the
    global RNG ends as after one); its `sync` copies the trained weights in. None otherwise."""
    from rlvr.backend.local import prepare

    if not c.config["trainer"].get("off_policy_steps") or "trainer_module" not in c.needs["engine"].provides:
        return None
    return prepare(copy.deepcopy(module), c.preset.lora, c.seeds.lora, gradient_checkpointing=False)


def make_rollout(c: Components, engine: Engine, tokenizer, stop: StopSignals | None = None) -> Rollout:
    """How a run's steps (and evaluations) are collected: single-turn completions, or episodes of its environment
    (the trainer's, and `rlvr eval`'s on a checkpoint)."""
    if c.env is None:
        return SingleTurn(engine, tokenizer, c.reward, RewardGuard.of(c.config), c.seeds, c.world, c.engine_entropy,
                          stop.interruptible if stop is not None else nullcontext)
    branching = c.turn_credit.branching if c.turn_credit is not None else None
    return Episodes(engine, tokenizer, c.env, c.seeds, c.world, c.engine_entropy, branching)
