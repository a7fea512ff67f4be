"""The `rlvr` command: `status`, `compare` and `plot` over run folders (see `rlvr/cli/__init__.py`);
`plan`, which previews a campaign before it is launched; `doctor`, what is usable here and what a run
needs; `squeeze`, a LoRA adapter's variance per rank and a compressed copy.

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

    compare = sub.add_parser("compare", help="a metric per condition across seeds, bootstrap CIs, paired Δ")
    compare.add_argument("path", type=Path, metavar="PATH")
    compare.add_argument("--metric", default="eval/accuracy")
    compare.add_argument("--at", choices=("final", "last-k"), default="final",
                         help="per run: the last value, or the mean of the last --k values")
    compare.add_argument("--k", type=int, default=10)
    compare.add_argument("--baseline", default=None,
                         help="condition to pair against (default: grpo or grpo+none, else the first)")
    compare.add_argument("--json", action="store_true", help="machine-readable output")

    plot = sub.add_parser("plot", help="PNG: one curve per condition, mean over seeds with a 95%% band")
    plot.add_argument("path", type=Path, metavar="PATH")
    plot.add_argument("--metric", default="mean_reward")
    plot.add_argument("--out", type=Path, default=None, help="default: PATH/plot_<metric>.png")
    plot.add_argument("--smooth", type=int, default=1, metavar="N", help="trailing mean over N values per run")
    plan = sub.add_parser("plan", help="runs, steps and estimated wall time of a grid, before launching it")
    plan.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="as for train.py, e.g. campaign=smoke")
    plan.add_argument("--conf", type=Path, default=Path("conf"), help="the config folder (default ./conf)")
    plan.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                      help="median step time of a pilot (default: measured from the campaign's runs)")
    plan.add_argument("--parallel", type=int, default=None, help="runs at once (default: array_parallelism)")

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "status":
            from rlvr.cli import status

            print(status.run(args.path, args.json, args.stale_after))
        elif args.command == "compare":
            if args.k < 1:
                raise CliError(f"--k must be at least 1, got {args.k}")
            from rlvr.cli import compare

            print(compare.run(args.path, args.metric, args.at, args.k, args.baseline, args.json))
        elif args.command == "plan":
            from rlvr.cli import plan

            print(plan.run(args.overrides, args.conf, args.step_time, args.parallel))
        elif args.command == "doctor":
            from rlvr.cli import doctor

            report, code = doctor.run(args.overrides, args.conf)
            print(report)
            return code
        elif args.command == "squeeze":
            from rlvr.cli import squeeze

            print(squeeze.run(args.path, args.threshold, args.rank, args.ranks, args.out, args.json, args.device))
        else:
            if args.smooth < 1:
                raise CliError(f"--smooth must be at least 1, got {args.smooth}")
            from rlvr.cli import plot

            print(plot.run(args.path, args.metric, args.out, args.smooth))
    except CliError as err:
        print(f"rlvr {args.command}: error: {err}", file=sys.stderr)
        return err.code
    except BrokenPipeError:  # `rlvr compare … --json | head`: the reader left; not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
