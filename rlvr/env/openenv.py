"""`env=openenv`: an OpenEnv environment (openenv-core 0.3.0), in this process or behind a server.

Exactly one of:
  `environment`: the dotted path of an `openenv.core.Environment` subclass, built once per episode (as an OpenEnv
      server builds one per session) and called in this process;
  `url`: a running OpenEnv server (`ws://host:port`, or http://, which the client turns into ws://), reached with
      openenv-core's own client (`GenericEnvClient`, WebSocket `/ws`), one session per episode.

Text in, text out. An action is the policy's text in one field of the environment's Action (`action_field`); in
process, the Action class is `action` (a dotted path) or, null, the first type argument of the class's
`Environment[Action, Observation, State]` base. The policy sees one field of each Observation (`observation_field`),
which must hold a str; reward None counts as 0. `reset(seed=seed)` starts the episode, so a seeded environment
replays the same episode from the same seed in process and served (tests/env/test_openenv.py checks that the two
transcripts are equal); nothing of the example is sent. The observation's other fields are not read: a server does
not send `metadata`, so reading it would make the two modes differ.

Synchronous `reset`/`step` of an in-process class run on the episode's `SyncCalls` thread (rlvr/env/guarded.py),
so a hang costs that episode only; a class that overrides `reset_async`/`step_async` (a real async
implementation) is awaited on the event loop, as an OpenEnv server does. A server call that drops its connection
or answers an error (CAPACITY_REACHED when more episodes run at once than the server's `max_concurrent_envs`: give
it at least trainer.batch_size × trainer.group_size) raises, which the guard turns into an environment error. With
`url`, `needs` checks at start that `GET {url}/health` answers within `SERVER_CHECK_TIMEOUT_S`, so a server that is
down fails the run before any model loads. Episodes do not fork (a server session cannot be copied).

Importing openenv-core costs ~6 s of CPU (its package imports gradio, ~20 s of wall time on a busy 2-core machine);
it happens when the environment is built, before any model loads, so that no episode's time bound pays for it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlvr.env.guarded import SyncCalls
from rlvr.protocols import Finding, Needs
from rlvr.requirements import Package, pip_extra
from rlvr.types import Example, Step

if TYPE_CHECKING:
    from openenv.core.generic_client import GenericEnvClient

OPENENV_PACKAGE = Package("openenv", pip_extra("envs"), ("openenv-core",))
SERVER_CHECK_TIMEOUT_S = 3.0


def http_url(url: str) -> str:
    """The server's HTTP root for a ws://, wss://, http:// or https:// URL."""
    url = url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws):]
    return url


@dataclass(frozen=True)
class ServerAnswers:
    """An OpenEnv server answers `GET {url}/health` with HTTP 200; checked by every run at start."""

    url: str
    item: str = "env.url"
    at_start: bool = True

    def check(self) -> Finding:
        import httpx

        health = f"{http_url(self.url)}/health"
        try:
            response = httpx.get(health, timeout=SERVER_CHECK_TIMEOUT_S)
        except httpx.HTTPError as err:
            return Finding("missing", f"the OpenEnv server env.url={self.url} is not answering (GET {health}: "
                                      f"{type(err).__name__}: {err})")
        if response.status_code != 200:
            return Finding("missing", f"the OpenEnv server env.url={self.url} answered GET {health} with HTTP "
                                      f"{response.status_code}")
        return Finding("ok", f"the OpenEnv server env.url={self.url} answers")


def action_type(environment: type) -> type | None:
    """The Action class of an `Environment[Action, Observation, State]` subclass, from its generic bases."""
    from openenv.core.env_server.interfaces import Environment

    for klass in environment.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin, args = typing.get_origin(base), typing.get_args(base)
            if inspect.isclass(origin) and issubclass(origin, Environment) and args and inspect.isclass(args[0]):
                return args[0]
    return None


class OpenEnvEnvironment:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        url = settings.get("url")
        return Needs(provides=frozenset({"episodes"}),
                     machine=(OPENENV_PACKAGE, *((ServerAnswers(url),) if url else ())))

    def __init__(self, environment: str | None, url: str | None, action: str | None, action_field: str,
                 observation_field: str, max_turns: int, max_context_tokens: int, step_timeout_s: float,
                 connect_timeout_s: float, max_concurrent: int) -> None:
        if (environment is None) == (url is None):
            raise ValueError(f"set exactly one of env.environment (a class, in process) and env.url (a server): got "
                             f"environment={environment!r}, url={url!r}")
        if max_concurrent < 1:
            raise ValueError(f"env.max_concurrent={max_concurrent} must be >= 1")
        if max_turns < 1 or max_context_tokens < 1 or not step_timeout_s > 0 or not connect_timeout_s > 0:
            raise ValueError(f"env.max_turns={max_turns}, env.max_context_tokens={max_context_tokens}, "
                             f"env.step_timeout_s={step_timeout_s} and env.connect_timeout_s={connect_timeout_s} must "
                             "be > 0")
        self.environment_class: type | None = None
        self.action_class: type | None = None
        self.client_class: type[GenericEnvClient] | None = None
        if environment is not None:
            self.environment_class, self.action_class = self._classes(environment, action)
        elif url is None or not url.startswith(("ws://", "wss://", "http://", "https://")):  # None: ruled out above
            raise ValueError(f"env.url={url!r} must start with ws://, wss://, http:// or https://")
        else:  # imported here, not in the first episode's reset, whose time bound the import would eat
            from openenv.core.generic_client import GenericEnvClient

            self.client_class = GenericEnvClient
        self.url = url
        self.action_field = action_field
        self.observation_field = observation_field
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.step_timeout_s = step_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_concurrent = max_concurrent
        """Episodes whose reset/step calls are in flight at once (a server answers CAPACITY_REACHED past its own
        max_concurrent_envs); rlvr/rollout/episodes.py holds the rest back."""

    @staticmethod
    def _classes(environment: str, action: str | None) -> tuple[type, type]:
        from hydra.utils import get_class
        from openenv.core.env_server.interfaces import Environment

        try:
            klass = get_class(environment)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error
            raise ValueError(f"env.environment={environment!r} cannot be imported: {err}") from err
        if not (inspect.isclass(klass) and issubclass(klass, Environment)):
            raise ValueError(f"env.environment={environment!r} is not an openenv.core.Environment subclass")
        if action is not None:
            try:
                return klass, get_class(action)
            except Exception as err:  # noqa: BLE001
                raise ValueError(f"env.action={action!r} cannot be imported: {err}") from err
        found = action_type(klass)
        if found is None:
            raise ValueError(f"env.environment={environment!r} names no Action class in its Environment[Action, "
                             "Observation, State] base: set env.action to its dotted path")
        return klass, found

    def episode(self, example: Example, seed: int) -> InProcessEpisode | ServedEpisode:
        if self.url is not None:
            return ServedEpisode(self, seed)
        return InProcessEpisode(self, seed)


@dataclass
class InProcessEpisode:
    env: OpenEnvEnvironment
    seed: int
    calls: SyncCalls = field(default_factory=lambda: SyncCalls("rlvr-env-openenv"))
    instance: Any = None

    async def _call(self, name: str, *args: Any, **kwargs: Any):
        from openenv.core.env_server.interfaces import Environment

        if getattr(type(self.instance), f"{name}_async") is not getattr(Environment, f"{name}_async"):
            return await getattr(self.instance, f"{name}_async")(*args, **kwargs)
        return await self.calls(lambda: getattr(self.instance, name)(*args, **kwargs))

    async def reset(self) -> str:
        if self.instance is None:
            assert self.env.environment_class is not None  # in-process episodes are made when env.environment is set
            self.instance = await self.calls(self.env.environment_class)
        observation = await self._call("reset", seed=self.seed)
        return getattr(observation, self.env.observation_field)

    async def step(self, action: str) -> Step:
        assert self.env.action_class is not None  # set with environment_class
        observation = await self._call("step", self.env.action_class(**{self.env.action_field: action}))
        return Step(None if observation.done else getattr(observation, self.env.observation_field),
                    float(observation.reward or 0.0), observation.done, {})

    def fork(self) -> InProcessEpisode:
        raise NotImplementedError("env=openenv episodes do not fork")

    async def close(self) -> None:
        instance, self.instance = self.instance, None
        if instance is not None and hasattr(instance, "close"):
            await self.calls(instance.close)
        self.calls.stop()


@dataclass
class ServedEpisode:
    env: OpenEnvEnvironment
    seed: int
    client: Any = None

    async def reset(self) -> str:
        assert self.env.client_class is not None  # served episodes are made when env.url is set
        self.client = self.env.client_class(base_url=self.env.url, connect_timeout_s=self.env.connect_timeout_s,
                                            message_timeout_s=self.env.step_timeout_s)
        result = await self.client.reset(seed=self.seed)
        return result.observation[self.env.observation_field]

    async def step(self, action: str) -> Step:
        result = await self.client.step({self.env.action_field: action})
        return Step(None if result.done else result.observation[self.env.observation_field],
                    float(result.reward or 0.0), bool(result.done), {})

    def fork(self) -> ServedEpisode:
        raise NotImplementedError("env=openenv episodes do not fork")

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()
