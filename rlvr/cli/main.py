"""The `rlvr` command: `status`, `compare` and `plot` over run folders (see `rlvr/cli/__init__.py`);
`plan`, which previews a campaign before it is launched; `doctor`, what is usable here and what a run
needs; `squeeze`, a LoRA adapter's variance per rank and a compressed copy; `eval`, `sample` and `export`, a saved
checkpoint used from its run folder alone; `tree`, an experiment tech tree of multiruns; `serve-status`, the runs
as a live Prometheus and JSON endpoint; `replay`, a captured step's update run again and compared.

Sub-command modules are imported only when chosen, so `rlvr status` loads neither numpy nor matplotlib."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlvr.cli.runs import STALE_AFTER_S, CliError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description="Read rlvr run folders: progress, comparisons, plots.")
    sub = parser.add_subparsers(dest="command", required=True)

    status = sub.add_parser("status", help="one row per run under PATH: progress, reward, accuracy, state")
    status.add_argument("path", type=Path, metavar="PATH")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--stale-after", type=float, default=STALE_AFTER_S, metavar="SECONDS",
                        help=f"a running run whose files have not changed for this long is 'stale' "
                             f"(default {STALE_AFTER_S:.0f})")

    compare = sub.add_parser("compare", help="a metric per condition over seeds, paired Δ, 95%% t-intervals (≥3 seeds)")
    compare.add_argument("path", type=Path, metavar="PATH")
    compare.add_argument("--metric", action="append", default=None,
                         help="a metrics.jsonl name, repeatable: one table each (default eval/pass@1 and the largest "
                              "eval/pass@k where logged, else eval/accuracy; e.g. mean_reward, eval/avg@4, "
                              "eval/maj@4); an unknown one lists the runs' names")
    compare.add_argument("--at", choices=("final", "last-k"), default="final",
                         help="per run: the last value, or the mean of the last --k values")
    compare.add_argument("--k", type=int, default=10)
    compare.add_argument("--baseline", default=None,
                         help="condition to pair against (default: grpo or grpo+none, else the first)")
    compare.add_argument("--json", action="store_true", help="machine-readable output")
    compare.add_argument("--ignore-key", action="append", default=[], metavar="KEY",
                         help="a config key (and what is under it) whose differences between runs do not matter; "
                              "repeatable (without it, runs whose configs differ are refused)")
    compare.add_argument("--detect", type=float, default=None, metavar="DIFF",
                         help="a difference to find (e.g. 0.05): the power lines add the seeds it needs")
    compare.add_argument("--reach", type=float, default=None, metavar="X",
                         help="per run: the first step at which the metric is >= X (fewer steps win; a run that "
                              "never reaches X counts as its trainer.max_steps, and the table says so)")

    plot = sub.add_parser("plot", help="PNG, PDF, SVG: one curve per condition, mean over seeds, 95%% band (≥3 seeds)")
    plot.add_argument("path", type=Path, metavar="PATH")
    plot.add_argument("--metric", action="append", default=None,
                      help="repeatable: one figure each (default mean_reward)")
    plot.add_argument("--out", type=Path, default=None,
                      help="the PNG (PDF and SVG beside it); a folder for several metrics "
                           "(default: PATH/plot_<metric>.png)")
    plot.add_argument("--smooth", type=int, default=1, metavar="STEPS",
                      help="per run, a trailing mean over a window of STEPS steps (default 1: none)")
    plot.add_argument("--size", default=None, metavar="WxH",
                      help="the whole figure in inches, e.g. 3.3x2.5 for one column (default 6.4x4)")
    plot.add_argument("--font-size", type=float, default=10.0, metavar="PT", help="text size in points (default 10)")
    plot.add_argument("--legend", default="below", metavar="WHERE",
                      help="below | right (of the axes) | best | upper-left | upper-right | lower-left | "
                           "lower-right (inside them) | none (default below)")
    plot.add_argument("--ignore-key", action="append", default=[], metavar="KEY",
                      help="as for compare: a config key whose differences between runs do not matter")
    plot.add_argument("--passk", action="store_true",
                      help="also plot_passk.png: pass@k against k (log scale) at each run's last sampled evaluation")
    plan = sub.add_parser("plan", help="runs, steps and estimated wall time of a grid, before launching it")
    plan.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="as for train.py, e.g. campaign=smoke")
    plan.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder (default ./conf)")
    plan.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                      help="median step time of a pilot (default: measured from the campaign's runs)")
    plan.add_argument("--parallel", type=int, default=None, help="runs at once (default: array_parallelism)")
    plan.add_argument("--pilot", type=Path, default=None, metavar="PATH",
                      help="a folder of pilot runs (≥2 seeds a condition): the campaign's power from their spread")
    plan.add_argument("--metric", action="append", default=None,
                      help="with --pilot, as for compare (default eval/pass@1 and eval/pass@k, else eval/accuracy)")
    plan.add_argument("--detect", type=float, default=None, metavar="DIFF",
                      help="with --pilot: the seeds needed to find this difference (e.g. 0.05)")

    doctor = sub.add_parser("doctor", help="what is installed and usable here, and whether a run's config can run")
    doctor.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="as for train.py, e.g. engine=vllm")
    doctor.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder (default ./conf)")

    squeeze = sub.add_parser("squeeze", help="a LoRA adapter's variance per rank, the rank to keep, and --out it")
    squeeze.add_argument("path", type=Path, metavar="ADAPTER",
                         help="adapter folder (adapter_model.safetensors), checkpoints/step_N, or a run folder")
    squeeze.add_argument("--threshold", type=float, default=0.95, help="variance to retain (default 0.95)")
    squeeze.add_argument("--ranks", default=None, metavar="LIST",
                         help="target ranks, e.g. 1,2,3 or 1-16 (default: powers of two below r, and r)")
    squeeze.add_argument("--rank", type=int, default=None, help="rank --out writes (default: the recommended)")
    squeeze.add_argument("--out", type=Path, default=None, metavar="DIR", help="write the compressed adapter here")
    squeeze.add_argument("--device", default="cpu", help="where the QR/SVD run (default cpu)")
    squeeze.add_argument("--json", action="store_true", help="machine-readable output")
    _checkpoint_parsers(sub)
    replay = sub.add_parser("replay", help="run a captured step's update again (trainer.capture_steps) and compare")
    replay.add_argument("path", type=Path, metavar="CAPTURE", help="a run's captures/step_<N> folder")
    replay.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="key=value on the captured config (backend.micro_batch_size=2, backend.packing=true)")
    replay.add_argument("--threads", type=int, default=1, help="torch threads for the update (default 1: bitwise)")
    replay.add_argument("--expect-manifest", default=None, metavar="SHA256",
                        help="the manifest's sha256 the run logged at capture")
    replay.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder for group swaps")
    _tree_parsers(sub)
    serve = sub.add_parser("serve-status", help="the runs under PATH as Prometheus gauges and JSON over loopback HTTP")
    serve.add_argument("path", type=Path, metavar="PATH")
    serve.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=9464, help="default 9464; 0 = any free port (printed)")
    serve.add_argument("--stale-after", type=float, default=STALE_AFTER_S, metavar="SECONDS", help="as for status")
    return parser


def _tree_parsers(sub) -> None:
    """`tree FILE [view|next|run ID|eval [ID]|note ID TEXT|reset ID]` (rlvr/cli/tree.py)."""
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    tree = sub.add_parser("tree", help="an experiment tech tree: multiruns unlocked by their parents' outcomes",
                          parents=[as_json])
    tree.add_argument("file", type=Path, metavar="TREE.yaml")
    tree.set_defaults(json=False)
    actions = tree.add_subparsers(dest="action")
    actions.add_parser("view", help="every node: state, outcome, notes (the default)", parents=[as_json])
    actions.add_parser("next", help="the nodes unlocked and not yet run", parents=[as_json])
    run = actions.add_parser("run", help="launch a node's multirun (python train.py --multirun …), then eval it",
                             parents=[as_json])
    run.add_argument("node")
    run.add_argument("--train", type=Path, default=Path("train.py"), help="the entry point (default ./train.py)")
    run.add_argument("--force", action="store_true", help="run a node that is locked or already has an outcome")
    evaluate = actions.add_parser("eval", help="read the nodes' runs again and decide their outcomes",
                                  parents=[as_json])
    evaluate.add_argument("node", nargs="?", default=None, help="one node (default: every node with runs)")
    note = actions.add_parser("note", help="add a dated note to a node (kept by reset)", parents=[as_json])
    note.add_argument("node")
    note.add_argument("text")
    reset = actions.add_parser("reset", help="forget a node's outcome (its notes and run folders stay)",
                               parents=[as_json])
    reset.add_argument("node")


def _checkpoint_parsers(sub) -> None:
    """`eval`, `sample`, `export`: a saved checkpoint used from its run folder alone (rlvr/cli/from_checkpoint.py)."""
    where = "a run folder (its final, else latest checkpoint) or a checkpoints/step_N folder"
    overrides = "key=value on the run's stored config (data.eval_size=200), or engine|reward|data=<option> of --conf"
    evaluate = sub.add_parser("eval", help="a checkpoint's held-out accuracy and metrics, written beside it")
    evaluate.add_argument("path", type=Path, metavar="RUN_OR_CHECKPOINT", help=where)
    evaluate.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=overrides)
    evaluate.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder for group swaps")
    evaluate.add_argument("--json", action="store_true", help="machine-readable output")

    sample = sub.add_parser("sample", help="completions of a checkpoint's policy for given prompts")
    sample.add_argument("path", type=Path, metavar="RUN_OR_CHECKPOINT", help=where)
    sample.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=overrides)
    sample.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    sample.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                        help="one prompt per line, or .jsonl with \"prompt\" (and \"reference\": scored)")
    sample.add_argument("--n", type=int, default=1, help="completions per prompt (default 1)")
    sample.add_argument("--temperature", type=float, default=None, help="default: the run's; 0 = greedy")
    sample.add_argument("--top-p", type=float, default=None, help="default: the run's")
    sample.add_argument("--max-tokens", type=int, default=None, help="default: the run's trainer.sampling.max_tokens")
    sample.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    sample.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder for group swaps")
    sample.add_argument("--json", action="store_true", help="one JSON line per prompt")

    export = sub.add_parser("export", help="a checkpoint as a Hugging Face model folder (LoRA merged) + tokenizer")
    export.add_argument("path", type=Path, metavar="RUN_OR_CHECKPOINT", help=where)
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="the folder to write")
    export.add_argument("--force", action="store_true", help="replace a non-empty DIR")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if getattr(args, "detect", None) is not None and not args.detect > 0:
            raise CliError(f"--detect must be a difference > 0, got {args.detect}")
        if args.command == "status":
            from rlvr.cli import status

            print(status.run(args.path, args.json, args.stale_after))
        elif args.command == "compare":
            if args.k < 1:
                raise CliError(f"--k must be at least 1, got {args.k}")
            from rlvr.cli import compare

            print(compare.run(args.path, args.metric, args.at, args.k, args.baseline, args.json, args.ignore_key,
                              args.detect, args.reach))
        elif args.command == "plan":
            from rlvr.cli import plan

            print(plan.run(args.overrides, args.conf, args.step_time, args.parallel, args.pilot, args.metric,
                           args.detect))
        elif args.command == "doctor":
            from rlvr.cli import doctor

            report, code = doctor.run(args.overrides, args.conf)
            print(report)
            return code
        elif args.command == "squeeze":
            from rlvr.cli import squeeze

            print(squeeze.run(args.path, args.threshold, args.rank, args.ranks, args.out, args.json, args.device))
        elif args.command == "eval":
            from rlvr.cli import eval_checkpoint

            print(eval_checkpoint.run(args.path, args.overrides, args.conf, args.json))
        elif args.command == "sample":
            from rlvr.cli import sample

            print(sample.run(args.path, args.overrides, args.conf, args.prompt, args.prompts, args.n, args.temperature,
                             args.top_p, args.max_tokens, args.seed, args.json))
        elif args.command == "replay":
            from rlvr.cli import replay

            return replay.run(args.path, args.overrides, args.conf, args.threads, args.expect_manifest)
        elif args.command == "export":
            from rlvr.cli import export

            print(export.run(args.path, args.out, args.force))
        elif args.command == "tree":
            from rlvr.cli import tree

            text, code = tree.run(args)
            print(text)
            return code
        elif args.command == "serve-status":
            from rlvr.cli import serve_status

            print(serve_status.serve(args.path, args.host, args.port, args.stale_after))
        else:
            from rlvr.cli import plot

            metrics = args.metric or ([] if args.passk else ["mean_reward"])
            print(plot.run(args.path, metrics, args.out, args.smooth, args.ignore_key, args.size, args.font_size,
                           args.legend, args.passk))
    except CliError as err:
        print(f"rlvr {args.command}: error: {err}", file=sys.stderr)
        return err.code
    except BrokenPipeError:  # `rlvr compare … --json | head`: the reader left; not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
