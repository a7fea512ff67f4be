"""Errors every layer may raise without importing the heavy ones."""


class CliError(Exception):
    """A user-facing failure of an `rlvr` command: printed without a traceback, exit status `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class ConfigError(ValueError):
    """The composed config cannot run; the message names every offending key."""


class RunFailed(RuntimeError):
    """The run cannot learn (every step skipped, every reward failed): it checkpoints, is marked `failed` with
    this message as the reason, and train.py exits with status 1."""
