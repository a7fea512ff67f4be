"""Errors every layer may raise without importing the heavy ones."""


class ConfigError(ValueError):
    """The composed config cannot run; the message names every offending key."""
