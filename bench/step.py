"""Step-time benchmark: rlvr's real RL step against TRL's GRPOTrainer on the same tiny setting.

What it measures
    The wall time of one on-policy RL step (sample → score → advantages → one optimizer update) and the
    peak resident memory of each side, on the tiny Llama of `conf/model/tiny.yaml` with LoRA, on the
    built-in arithmetic task. rlvr's side calls `Trainer.step` on a live set-up composed from
    `conf/train.yaml` (the same components `rlvr.run` builds), so the split into sampling / scoring /
    advantages / training comes from rlvr's own metrics row (`sample_time_s`, `score_time_s`,
    `advantage_time_s`, `train_time_s`). TRL's side is timed by a `TrainerCallback` from `on_step_begin` to
    `on_step_end`, a window that holds generation, reward, loss, backward, optimizer and scheduler step, but
    not the dataloader fetch nor the logging that follow. rlvr's headline number is the whole `step`
    call, which also builds the metrics row and writes `samples/` (its own `step_time_s` leaves those out
    and is printed too), so the comparison leans against rlvr, not for it. Each step's process CPU time
    is recorded beside its wall time: with one thread it is the better number on a busy shared box.

How to run (from the repo root)
    .venv/bin/python bench/step.py                    # 3 uncounted + 50 measured steps, 1 torch thread
    .venv/bin/python bench/step.py --steps 100 --threads 2
    .venv/bin/python bench/step.py --profile          # also cProfile rlvr's measured steps
    .venv/bin/python bench/step.py --steps 1 --warmup 0 --rounds 1 --sft-steps 0   # smallest (tests/bench)

    Use `--threads 2` only on an idle box: with other jobs on the cores, two threads were measured 4–6×
    slower than one, with multi-second outliers (docs/cpu-recipe.md#threads).

    Each side runs in its own child process (this script re-invoked with `--side`), so `ru_maxrss` is that
    side's peak alone. `--rounds` (default 2) fresh processes per side run interleaved rlvr, TRL, TRL,
    rlvr, … so that load from other jobs drifting over the run hits both sides alike; the table pools
    their measured steps and also shows each round's median. A first child runs before them and fills
    the SFT warm-up cache (`trainer.warmup`, about a minute the first time, then loaded from
    `~/.cache/rlvr/warmup`), so neither measured side pays for it.

Why a warm-up at all
    A randomly initialised policy almost never produces the exact sum, so every group's rewards tie, every
    advantage is 0 and rlvr skips the update (TRL still runs its backward on zero advantages). The warm-up
    of `conf/trainer/cpu.yaml` (docs/cpu-recipe.md#design-b) gives about 40% correct samples, realistic
    2–4 token completions, and steps that really train. Both sides start from the same warmed-up weights
    and the same LoRA initialisation; the table shows a fingerprint of each side's initial parameters.

What is matched
    model and tokenizer: `TinyLlama` of conf/model/tiny.yaml, same init seed, same cached warm-up weights
    LoRA: r=8, alpha=16, dropout 0, q/k/v/o/gate/up/down; TRL gets it as `peft_config`, then its fresh
        adapter is overwritten with rlvr's initialisation (TRL seeds PEFT with `args.seed`, which must fit in
        32 bits, while rlvr seeds it with its 63-bit `lora` sub-seed)
    batch: 8 prompts × 8 completions (`per_device_train_batch_size=64` counts completions), the same
        prompts in the same order (rlvr's `data.batch(step)`, fed to TRL with `shuffle_dataset=False`)
    sampling: T=1, top_p=1, top_k=0 (off), at most 8 new tokens, stop at EOS
    reward: rlvr's `ExactMatch` on the completion text up to and including the first EOS, decoded with
        special tokens skipped — exactly what rlvr's `decode_completions` gives (TRL's `completion_ids` are
        already cut after the first EOS)
    algorithm: GRPO A = r − mean(r) per group, no std division, no KL, on-policy (ratio 1), token-level
        (DAPO) loss, one AdamW update per step, lr 1e-3 constant, betas (0.9, 0.95), eps 1e-8, no weight
        decay, no gradient clipping, fp32, torch threads set identically in both children
    Not matched: the random draws (each side has its own generator, so rewards differ slightly); the loss
    normaliser (TRL divides by every completion token, rlvr by the tokens whose advantage is non-zero; no
    effect on time); TRL also computes per-token entropies for its logs, rlvr does not (`transform=none`).

TRL defaults overridden, and why (trl 1.16.0; docs/cpu-recipe.md#trl-baseline)
    bf16=False, fp16=False, use_cpu=True      GRPOConfig turns bf16 on by default; this is an fp32 CPU run
    gradient_checkpointing=False              on by default; it recomputes activations (slower, not rlvr's)
    learning_rate=1e-3                        the default 1e-6 is not rlvr's LoRA lr
    lr_scheduler_type="constant", warmup=0    TrainingArguments decays linearly to 0 by default
    max_grad_norm=0.0                         the default 1.0 clips; rlvr's backend does not
    scale_rewards="none"                      the default "group" divides by the group std (not rlvr's GRPO)
    loss_type="dapo"                          token-level mean, as rlvr's loss (stated for clarity)
    beta=0.0, num_iterations=1                no reference model, one update per batch (the defaults, pinned)
    top_k=0, top_p=1.0, temperature=1.0       plain sampling, as rlvr's engine
    adam_beta2=0.95, optim="adamw_torch"      rlvr's AdamW betas; the plain (not fused) torch AdamW rlvr uses
    shuffle_dataset=False                     the same prompts per step as rlvr
    report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True
                                              no trackers, checkpoints or progress bars inside the timing

Target: rlvr's median step ≤ 0.7 × TRL's median step.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.7
PROMPTS, GROUP, MAX_TOKENS, LR = 8, 8, 8, 1e-3

SETTING = [
    "trainer=cpu", "algorithm=grpo", "transform=none", "engine=pytorch", "backend=local", "reward=exact",
    "model=tiny", "data=arithmetic",
    f"trainer.batch_size={PROMPTS}", f"trainer.group_size={GROUP}", f"trainer.lr={LR}",
    "trainer.sampling.temperature=1.0", "trainer.sampling.top_p=1.0", f"trainer.sampling.max_tokens={MAX_TOKENS}",
    "backend.device=cpu", "backend.grad_clip_norm=0.0", "backend.micro_batch_size=0",
]
"""Overrides pinning the benchmark's setting, whatever the defaults of conf/ become."""


# ---------------------------------------------------------------------------------------------- shared


def compose(args: argparse.Namespace):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = [*SETTING, f"seed={args.seed}", f"threads={args.threads}"]
    if args.sft_steps is not None:
        overrides.append(f"trainer.warmup.steps={args.sft_steps}")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def build_components(cfg):
    """What `rlvr.run.run` builds, without starting `fit` (which would evaluate and checkpoint)."""
    from rlvr.build import build_all

    return build_all(cfg)


def warmed_up_model(trainer, c, out_dir: Path):
    """The base model after the (cached) SFT warm-up: rlvr/start.py `warmed_up`, what `start` builds on."""
    from rlvr.outputs import RunDir
    from rlvr.start import warmed_up

    module, tokenizer, _, info = warmed_up(c, trainer.warmup, RunDir(out_dir))
    return module, tokenizer, info


def fingerprint(model) -> str:
    """sha256 of every parameter (name, bytes), in name order: equal iff the two policies are equal."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------- children


def side_warmup(args: argparse.Namespace) -> dict:
    """Fill the warm-up cache so that neither measured side trains (or pays memory for) the SFT."""
    set_threads(args.threads)
    c, trainer = build_components(compose(args))
    with tempfile.TemporaryDirectory() as tmp:
        _, _, info = warmed_up_model(trainer, c, Path(tmp))
    return {"side": "warmup", "info": info}


def side_rlvr(args: argparse.Namespace) -> dict:
    from rlvr.outputs import RunDir
    from rlvr.start import start
    from rlvr.trainer import freeze_startup_heap

    set_threads(args.threads)
    c, trainer = build_components(compose(args))
    with tempfile.TemporaryDirectory() as tmp:
        out = RunDir(Path(tmp) / "run")
        live = start(c, trainer.warmup, trainer.keep_last, out)
        freeze_startup_heap()  # as `Trainer.fit` does before its first step
        initial = fingerprint(live.backend.policy)
        profiler = None
        rows, walls, cpus = [], [], []
        with trainer.stepping(live):  # as `Trainer.fit` steps
            for step in range(args.warmup + args.steps):
                if step == args.warmup and args.profile:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                t0, c0 = time.perf_counter(), time.process_time()
                row = trainer.step(live, step).row
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                out.append("metrics.jsonl", row)
                if step >= args.warmup:
                    rows.append(row)
                    walls.append(wall)
                    cpus.append(cpu)
        if profiler is not None:
            profiler.disable()
            print_profile(profiler)
    keys = ("step_time_s", "sample_time_s", "score_time_s", "advantage_time_s", "train_time_s")
    return {
        "side": "rlvr",
        "fingerprint": initial,
        "step_wall_s": walls,
        "step_cpu_s": cpus,
        **{k: [r[k] for r in rows] for k in keys},
        "skipped_steps": sum(r["skipped"] for r in rows),
        "mean_reward": statistics.fmean(r["mean_reward"] for r in rows),
        "mean_completion_length": statistics.fmean(r["mean_completion_length"] for r in rows),
        "uniform_group_rate": statistics.fmean(r["reward_uniform_group_rate"] for r in rows),
        "max_rss_mb": peak_rss_mb(),
    }


def print_profile(profiler) -> None:
    import io
    import pstats

    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(order).print_stats(30)
        print(f"\n----- cProfile of rlvr's measured steps, by {order} -----\n{buf.getvalue()}", file=sys.stderr)


def rlvr_lora_init(module, spec, lora_seed: int) -> dict:
    """The adapter weights rlvr's backend would start from (it seeds torch, then wraps)."""
    import copy

    import torch
    from peft import get_peft_model

    torch.manual_seed(lora_seed)
    wrapped = get_peft_model(copy.deepcopy(module), spec.to_peft())
    return {n: p.detach().clone() for n, p in wrapped.named_parameters() if p.requires_grad}


def side_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    set_threads(args.threads)
    c, trainer = build_components(compose(args))
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        module, tokenizer, _ = warmed_up_model(trainer, c, Path(tmp))
        lora_init = rlvr_lora_init(module, c.preset.lora, c.seeds.lora)
        dataset = Dataset.from_list(
            [{"prompt": e.prompt, "answer": e.reference} for step in range(total) for e in c.data.batch(step, PROMPTS)]
        )

        def exact_match(completion_ids: list[list[int]], answer: list[str], **_) -> list[float]:
            # the ids end at (and include) the first EOS; decoding drops specials, as decode_completions does
            texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
            return c.reward.score(texts, answer).values

        class StepTimer(TrainerCallback):
            def __init__(self) -> None:
                self.times: list[float] = []
                self.cpu_times: list[float] = []
                self.logs: list[dict] = []
                self._t0 = self._c0 = 0.0

            def on_step_begin(self, args, state, control, **kwargs):
                self._t0, self._c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                self.times.append(time.perf_counter() - self._t0)
                self.cpu_times.append(time.process_time() - self._c0)

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "reward" in logs:
                    self.logs.append(logs)

        config = GRPOConfig(
            output_dir=str(Path(tmp) / "trl"),
            use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
            per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP, gradient_accumulation_steps=1,
            max_completion_length=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, optim="adamw_torch", max_grad_norm=0.0,
            beta=0.0, num_iterations=1, scale_rewards="none", loss_type="dapo",
            shuffle_dataset=False, max_steps=total, seed=args.seed,
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        )
        timer = StepTimer()
        grpo = GRPOTrainer(
            model=module, reward_funcs=exact_match, args=config, train_dataset=dataset,
            processing_class=tokenizer, peft_config=c.preset.lora.to_peft(), callbacks=[timer],
        )
        grpo.remove_callback(PrinterCallback)  # disable_tqdm=True would print every step's logs
        with torch.no_grad():
            params = dict(grpo.model.named_parameters())
            for name, value in lora_init.items():
                params[name].copy_(value)
        initial = fingerprint(grpo.model)
        grpo.train()
    logs = timer.logs[args.warmup :]
    return {
        "side": "trl",
        "fingerprint": initial,
        "step_wall_s": timer.times[args.warmup :],
        "step_cpu_s": timer.cpu_times[args.warmup :],
        "mean_reward": statistics.fmean(r["reward"] for r in logs) if logs else float("nan"),
        "mean_completion_length": (
            statistics.fmean(r["completions/mean_length"] for r in logs) if logs else float("nan")
        ),
        "uniform_group_rate": statistics.fmean(r["frac_reward_zero_std"] for r in logs) if logs else float("nan"),
        "max_rss_mb": peak_rss_mb(),
    }


SIDES = {"warmup": side_warmup, "rlvr": side_rlvr, "trl": side_trl}


# --------------------------------------------------------------------------------------------- parent


def run_child(side: str, args: argparse.Namespace) -> dict:
    """Re-invoke this script for one side; it writes its result as JSON to a file we name."""
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TQDM_DISABLE": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        cmd = [sys.executable, __file__, "--side", side, "--result", result.name, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--threads", threads, "--seed", str(args.seed)]
        if args.sft_steps is not None:
            cmd += ["--sft-steps", str(args.sft_steps)]
        if args.profile and side == "rlvr":
            cmd.append("--profile")
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, cwd=REPO)
        data = json.loads(Path(result.name).read_text())
    data["process_s"] = time.perf_counter() - t0
    return data


def pooled(rounds: list[dict]) -> dict:
    """One side's rounds merged: per-step lists concatenated, peak RSS the largest, means re-averaged."""
    merged = {k: [x for r in rounds for x in r[k]] for k, v in rounds[0].items() if isinstance(v, list)}
    merged["round_medians"] = [statistics.median(r["step_wall_s"]) for r in rounds]
    merged["max_rss_mb"] = max(r["max_rss_mb"] for r in rounds)
    for k in ("mean_reward", "mean_completion_length", "uniform_group_rate"):
        merged[k] = statistics.fmean(r[k] for r in rounds)
    merged["skipped_steps"] = sum(r.get("skipped_steps", 0) for r in rounds)
    merged["fingerprints"] = sorted({r["fingerprint"] for r in rounds})
    return merged


def print_table(args: argparse.Namespace, rlvr: dict, trl: dict | None) -> None:
    med, mean = statistics.median, statistics.fmean
    print(f"\nsetting: {PROMPTS} prompts × {GROUP} completions, ≤{MAX_TOKENS} new tokens, GRPO, LoRA r=8, lr {LR:g}, "
          f"T=1, top_p=1, torch threads {args.threads}; per side {args.rounds} round(s) × ({args.warmup} uncounted + "
          f"{args.steps} measured) steps, rounds interleaved rlvr/TRL")
    line = "{:<36}{:>12}{:>12}"

    def row(label: str, x: str, y: str = "-") -> None:
        print(line.format(label, x, y))

    def both(label: str, key: str, f, fmt: str) -> None:
        row(label, format(f(rlvr[key]), fmt), format(f(trl[key]), fmt) if trl else "-")

    row("", "rlvr", "TRL" if trl else "TRL (skipped)")
    both("median step wall (s)", "step_wall_s", med, ".4f")
    both("mean step wall (s)", "step_wall_s", mean, ".4f")
    both("median step CPU time (s)", "step_cpu_s", med, ".4f")
    row("per-round median wall (s)", " ".join(f"{x:.3f}" for x in rlvr["round_medians"]),
        " ".join(f"{x:.3f}" for x in trl["round_medians"]) if trl else "-")
    for label, key in (("rlvr step_time_s", "step_time_s"), ("sampling", "sample_time_s"),
                       ("scoring", "score_time_s"), ("advantages", "advantage_time_s"), ("training", "train_time_s")):
        row(f"  {label}, median (s)", f"{med(rlvr[key]):.4f}")
    row("peak RSS (MB)", f"{rlvr['max_rss_mb']:.0f}", f"{trl['max_rss_mb']:.0f}" if trl else "-")
    row("mean reward", f"{rlvr['mean_reward']:.3f}", f"{trl['mean_reward']:.3f}" if trl else "-")
    row("mean completion length (tokens)", f"{rlvr['mean_completion_length']:.2f}",
        f"{trl['mean_completion_length']:.2f}" if trl else "-")
    row("groups with all-tied rewards", f"{rlvr['uniform_group_rate']:.2f}",
        f"{trl['uniform_group_rate']:.2f}" if trl else "-")
    row("initial-weights fingerprint", ",".join(f[:10] for f in rlvr["fingerprints"]),
        ",".join(f[:10] for f in trl["fingerprints"]) if trl else "-")
    if rlvr["skipped_steps"]:
        print(f"note: {rlvr['skipped_steps']} rlvr steps had only tied groups and skipped the update")
    if trl is None:
        print("TRL was skipped: `trl` is not importable in this environment.")
        return
    if rlvr["fingerprints"] != trl["fingerprints"]:
        print("WARNING: the two sides did not start from identical weights")
    ratio = med(rlvr["step_wall_s"]) / med(trl["step_wall_s"])
    cpu_ratio = med(rlvr["step_cpu_s"]) / med(trl["step_cpu_s"])
    verdict = "MET" if ratio <= TARGET_RATIO else "NOT met"
    print(f"ratio rlvr/TRL of median step wall: {ratio:.2f} (CPU time: {cpu_ratio:.2f}); "
          f"target: rlvr median step ≤ {TARGET_RATIO}× TRL's → {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50, help="measured steps per side and round")
    p.add_argument("--warmup", type=int, default=3, help="uncounted RL steps before measuring")
    p.add_argument("--rounds", type=int, default=2,
                   help="fresh processes per side, interleaved rlvr,TRL,TRL,rlvr,… so drifting load hits both alike")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads on both sides")
    p.add_argument("--seed", type=int, default=0, help="rlvr root seed (and TRL's seed)")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="SFT warm-up steps before RL (default: conf/trainer/cpu.yaml's, cached)")
    p.add_argument("--profile", action="store_true", help="cProfile rlvr's measured steps (printed to stderr)")
    p.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1 or args.rounds < 1:
        p.error(f"--steps={args.steps} and --rounds={args.rounds} must be >= 1, --warmup={args.warmup} >= 0, "
                f"--threads={args.threads} >= 1")
    return args


def main() -> None:
    args = parse_args()
    if args.side:
        Path(args.result).write_text(json.dumps(SIDES[args.side](args)))
        return
    warm = run_child("warmup", args) if args.sft_steps != 0 else {"info": None}  # 0: no warm-up to cache
    if info := warm["info"]:
        how = f"loaded from {info['loaded_from']}" if info["loaded_from"] else f"trained in {info['seconds']:.0f} s"
        print(f"SFT warm-up ({info['steps']} steps): {how}")
    sides = ["rlvr", "trl"] if importlib.util.find_spec("trl") else ["rlvr"]
    results: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            results[side].append(run_child(side, args))
            print(f"round {r + 1} {side}: median step {statistics.median(results[side][-1]['step_wall_s']):.4f} s",
                  flush=True)
    print_table(args, pooled(results["rlvr"]), pooled(results["trl"]) if "trl" in results else None)


if __name__ == "__main__":
    main()
