"""What `logger=wandb`'s chosen mode needs of this machine, checked before any model loads by every run (as
machine requirements `at_start`, rlvr/config_check.py: start_errors, exit status 2) and reported line by line by
`rlvr doctor`: the same `WandbLogger.needs`, so the two cannot disagree.

    mode      logger.mode, by default $WANDB_MODE, else online (conf/logger/wandb.yaml: `${oc.env:WANDB_MODE,online}`);
              wandb's aliases dryrun (= offline) and run (= online) are accepted
    online    a well-formed key ($WANDB_API_KEY, else a netrc entry for the server's host, or a
              $WANDB_IDENTITY_TOKEN_FILE), and a server that answers one HEAD request within WANDB_PROBE_TIMEOUT_S
    offline   nothing: no key (a malformed one is not read), no network; `wandb sync` uploads the run's files later
    disabled  nothing

The key is checked as wandb checks it before it contacts the server (wandb/sdk/lib/wbauth/validation.py:
check_api_key in wandb 0.31): a JWT passes; otherwise, after an optional `<prefix>-` (on-premises keys), the
secret is letters, digits, `_` and `-`, at least 40 of them. `key_problem` repeats that rule rather than
importing wandb (1-2 s) for it; tests/logger/test_preflight.py holds it against wandb's own function. The
server is $WANDB_BASE_URL, else what wandb's settings say (`wandb login --host` writes it; else wandb's
default), and the probe is rlvr.requirements.unanswered's (any HTTP status is an answer): wandb itself would
retry for minutes before it gives up.
"""

from __future__ import annotations

import netrc
import os
import re
from dataclasses import dataclass
from typing import Literal, cast
from urllib.parse import urlsplit

from rlvr.protocols import Finding

Mode = Literal["online", "offline", "disabled"]
MODES: tuple[Mode, ...] = ("online", "offline", "disabled")
MODE_ALIASES = {"dryrun": "offline", "run": "online"}
"""Older names wandb still accepts in $WANDB_MODE."""
WANDB_PROBE_TIMEOUT_S = 3.0
"""The most the start check waits for the W&B server (name resolution, connection, TLS and answer together)."""
DEFAULT_BASE_URL = "https://api.wandb.ai"
"""The server when neither $WANDB_BASE_URL nor wandb's settings name one and wandb cannot be asked."""
OFFLINE_WAY_OUT = ("without network, choose logger.mode=offline (or WANDB_MODE=offline): the run logs to its folder, "
                   "and `wandb sync` uploads it later")
_JWT = re.compile(r"[\w-]+\.[\w-]+\.[\w-]+")


def resolve_mode(mode: str | None) -> Mode | None:
    """logger.mode as wandb runs it (an alias replaced), or None when it is not a mode wandb knows."""
    mode = MODE_ALIASES.get(str(mode), mode)
    return cast(Mode, mode) if mode in MODES else None


def key_problem(key: str) -> str | None:
    """What wandb would refuse in `key` (its own sentence), or None when it is well-formed. Whether the server
    accepts it is not known before a run contacts it."""
    if not key:
        return "API key is empty."
    if _JWT.fullmatch(key):
        return None
    secret = key.split("-", 1)[-1]
    if not re.fullmatch(r"[\w-]+", secret):
        return "API key may only contain the letters A-Z, digits and underscores."
    if len(secret) < 40:
        return f"API key must have 40+ characters, has {len(secret)}."
    return None


def base_url() -> str:
    """The W&B server a run would use: $WANDB_BASE_URL, else wandb's settings (its settings files, then its
    default), read without starting wandb's service."""
    if url := os.environ.get("WANDB_BASE_URL", "").strip():
        return url.rstrip("/")
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url).rstrip("/")
    except Exception:  # noqa: BLE001 - an older or broken wandb: its long-standing default
        return DEFAULT_BASE_URL


def netrc_key(url: str) -> str | None:
    """The password of the netrc entry for `url`'s host (where `wandb login` writes the key), or None."""
    host = urlsplit(url).netloc
    path = os.environ.get("NETRC") or None
    try:
        found = netrc.netrc(os.path.expanduser(path) if path else None).authenticators(host) if host else None
    except (OSError, netrc.NetrcParseError):
        return None
    return found[2] if found and found[2] else None


def key_finding(url: str) -> Finding:
    """Whether a well-formed key for the server `url` is at hand (never showing it)."""
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE", "").strip():
        return Finding("ok", "$WANDB_IDENTITY_TOKEN_FILE is set (an identity token, not a key)")
    key, source = os.environ.get("WANDB_API_KEY"), "$WANDB_API_KEY"
    if not key or not key.strip():
        key, source = netrc_key(url), f"the netrc entry for {urlsplit(url).netloc}"
    if key is None:
        return Finding("missing", f"neither $WANDB_API_KEY nor a netrc entry for {urlsplit(url).netloc} holds one "
                                  "(`wandb login` writes it)")
    if key != key.strip():
        return Finding("missing", f"{source} starts or ends with whitespace, which wandb refuses")
    if (problem := key_problem(key)) is not None:
        return Finding("missing", f"{source} fails wandb's own check ({problem.rstrip('.')})")
    return Finding("ok", f"{source} is a well-formed key (the value is never shown)")


@dataclass(frozen=True)
class WandbKey:
    """logger.mode=online needs a well-formed W&B key; offline and disabled need none."""

    mode: str
    item: str = "wandb key"
    at_start: bool = True

    def check(self) -> Finding:
        if self.mode != "online":
            return Finding("ok", f"logger.mode={self.mode} needs no key")
        found = key_finding(base_url())
        if found.status == "ok":
            return found
        return Finding("missing", f"logger.mode=online needs a well-formed W&B key: {found.detail}; "
                                  f"{OFFLINE_WAY_OUT}")


@dataclass(frozen=True)
class WandbServer:
    """logger.mode=online needs the W&B server to answer: one HEAD request, at most WANDB_PROBE_TIMEOUT_S."""

    mode: str
    item: str = "wandb server"
    at_start: bool = True

    def check(self) -> Finding:
        from rlvr.requirements import unanswered_probe

        if self.mode != "online":
            return Finding("ok", f"logger.mode={self.mode} contacts no server")
        url = base_url()
        why = unanswered_probe(url, WANDB_PROBE_TIMEOUT_S)
        if why is None:
            return Finding("ok", f"{url} answers")
        return Finding("missing", f"logger.mode=online: the W&B server {url} does not answer ({why}; $WANDB_BASE_URL "
                                  f"names another server): {OFFLINE_WAY_OUT}")


@dataclass(frozen=True)
class WandbMode:
    """logger.mode (from $WANDB_MODE when not given) is a mode wandb knows."""

    mode: str
    item: str = "logger.mode"
    at_start: bool = True

    def check(self) -> Finding:
        if resolve_mode(self.mode) is not None:
            return Finding("ok", f"logger.mode={self.mode}")
        return Finding("missing", f"logger.mode={self.mode!r} (from $WANDB_MODE unless given): expected one of "
                                  f"{', '.join(MODES)}")


def wandb_requirements(mode: str) -> tuple[WandbMode | WandbKey | WandbServer, ...]:
    """What `mode` needs of this machine, in the order a user fixes it."""
    resolved = resolve_mode(mode)
    if resolved is None:
        return (WandbMode(str(mode)),)
    return WandbKey(resolved), WandbServer(resolved)
