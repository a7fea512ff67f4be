"""rlvr entry point: compose the config with Hydra, then hand it to rlvr.run inside the job.

Nothing heavy (torch, transformers) is imported here, so `--cfg`, `--help` and submitting a sweep stay
fast; the job imports it when it starts, after every check of the config has passed (rlvr/run.py), so a
wrong invocation fails in about a second, printing the problems (exit status 2) without a traceback. So do
the mistakes Hydra finds while composing (an unknown key or option, an override it cannot parse, an output
folder it cannot create): rlvr/hydra_errors.py words them. A job stopped by SIGTERM/SIGUSR1 checkpoints and
exits with status 75 ("requeue me"), one stopped by Ctrl-C checkpoints and exits with 130, both without a
traceback; started again with the same command, it continues (rlvr/resume.py finds its folder). A run that
cannot learn (rlvr/trainer.py: every step skipped, every reward failed) exits with 1, saying why.
"""

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from rlvr.labels import register_resolvers

CONFIG_ERROR_EXIT_CODE = 2
RUN_FAILED_EXIT_CODE = 1
CONF = Path(__file__).resolve().parent / "conf"
os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra's errors reach __main__ below as exceptions, not exit 1
register_resolvers()  # ${rlvr.task:} and ${rlvr.label:} in hydra.run.dir (conf/train.yaml)
job_started = False
"""Set when the first job starts: an error before that is Hydra's (composition, the output folder)."""


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    global job_started
    job_started = True
    from rlvr.errors import ConfigError, RunFailed
    from rlvr.preemption import Preempted, StopSignals, exit_code

    try:
        with StopSignals():  # from the job's first moment a stop signal is remembered, not fatal
            from rlvr.run import run

            accuracy = run(cfg)["eval_accuracy_final"]  # the value a Hydra sweeper would optimise
        ignore(signal.SIGUSR1)  # finished: a time-limit warning now must not kill the exit
        return accuracy
    except ConfigError as err:  # the user's input, not a bug: the message names the keys, a traceback adds nothing
        print(f"rlvr.errors.ConfigError: {err}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    except RunFailed as failed:  # the run cannot learn; status.json says failed, with the same reason
        print(f"rlvr: run failed: {failed}", file=sys.stderr)
        sys.exit(RUN_FAILED_EXIT_CODE)
    except Preempted as stopped:
        # Checkpointed: the exit status is decided. A signal now must not change it; in a job of several tasks
        # the first task to exit makes srun SIGTERM the others, and Python's shutdown puts back the default
        # (fatal) action of a signal it handled, so a task still exiting would die of it (143, not requeued).
        ignore(signal.SIGTERM, signal.SIGUSR1)
        print(f"rlvr: {stopped}; exit status {exit_code(stopped.signum)}", file=sys.stderr)
        sys.exit(exit_code(stopped.signum))


def ignore(*signums: int) -> None:
    """Ignore these signals from now on; in a packed grid's cell (a thread, rlvr/pack/) the main thread decides."""
    if threading.current_thread() is threading.main_thread():
        for signum in signums:
            signal.signal(signum, signal.SIG_IGN)


def leave(code: int | str | None) -> NoReturn:
    """Exit with `code` (SystemExit's). A rank of a distributed run started as this script (torchrun, srun python
    train.py) skips the interpreter's shutdown, its logs and streams flushed first: once FSDP2 has sharded a model,
    gloo's threads (`gloo_tcp_loop`, `pt_gloo_runloop`) outlive `destroy_process_group`, and their C++ objects torn
    down at shutdown aborted a rank now and then under load ("terminate called without an active exception",
    exit -6, the run's work all done). A job run by submitit is left to submitit, which writes its result after."""
    from rlvr.distributed import World

    if World.from_env().size > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
    sys.exit(code)


if __name__ == "__main__":
    from rlvr.command_line import repeated_choices

    if repeated := repeated_choices(sys.argv[1:], CONF):  # Hydra would take the last choice of each silently
        print("rlvr.errors.ConfigError: invalid config:\n  " + "\n  ".join(repeated), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    try:
        try:
            main()
        except SystemExit as done:  # the job's own exit status (2, 1, 75, 130): a distributed rank leaves at once
            leave(done.code)
        leave(0)
    except KeyboardInterrupt:  # Ctrl-C while Hydra composes, before the job listens for it: nothing to save
        sys.exit(130)
    except Exception as err:
        from rlvr.hydra_errors import explain

        message = None if job_started else explain(err, sys.argv[1:], CONF, multirun="-m" in sys.argv
                                                     or "--multirun" in sys.argv)
        if message is None:
            raise
        print(f"rlvr.errors.ConfigError: invalid config:\n  {message}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
