"""rlvr entry point: compose the config with Hydra, then hand it to rlvr.run inside the job.

Nothing heavy (torch, transformers) is imported here, so `--cfg`, `--help` and submitting a sweep stay
fast; the job imports it when it starts, after every check of the config has passed (rlvr/run.py), so a
wrong invocation fails in about a second, printing the problems (exit status 2) without a traceback. A job
stopped by SIGTERM/SIGUSR1 checkpoints and exits with status 75 ("requeue me"), one stopped by Ctrl-C
checkpoints and exits with 130, both without a traceback; started again with the same command, it continues.
"""

import signal
import sys

import hydra
from omegaconf import DictConfig

CONFIG_ERROR_EXIT_CODE = 2


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    from rlvr.errors import ConfigError
    from rlvr.preemption import Preempted, StopSignals, exit_code

    try:
        with StopSignals():  # from the job's first moment a stop signal is remembered, not fatal
            from rlvr.run import run

            accuracy = run(cfg)["eval_accuracy_final"]  # the value a Hydra sweeper would optimise
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # finished: a time-limit warning now must not kill the exit
        return accuracy
    except ConfigError as err:  # the user's input, not a bug: the message names the keys, a traceback adds nothing
        print(f"rlvr.errors.ConfigError: {err}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    except Preempted as stopped:
        # Checkpointed: the exit status is decided. A signal now must not change it; in a job of several tasks
        # the first task to exit makes srun SIGTERM the others, and Python's shutdown puts back the default
        # (fatal) action of a signal it handled, so a task still exiting would die of it (143, not requeued).
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_IGN)
        print(f"rlvr: {stopped}; exit status {exit_code(stopped.signum)}", file=sys.stderr)
        sys.exit(exit_code(stopped.signum))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C while Hydra composes, before the job listens for it: nothing to save
        sys.exit(130)
