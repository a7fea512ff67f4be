"""`env=verifiers`: an environment written with the verifiers library (verifiers 0.4.0, its v1 API), driven in
this process with rlvr's own policy answering every model call.

What a verifiers environment is (0.4.0). A Taskset yields Tasks (`vf.Task`, scored by its `@vf.reward` methods);
an `Env` plays a task with agents (`Env.run(task, agents)`: the plain `SingleAgentEnv` runs one agent on the
prompt; a multi-turn Env drives `agents.<seat>.interaction(task)`, sending user turns and reading replies); each
agent runs a Harness program whose model calls go to a local interception server, which records each turn in the
trace and asks a `Client` for the model's answer. `env.environment` names the taskset package as verifiers names
it: an installed package (`my_env`) or, here also, a dotted module path (`my_pkg.my_env`); the module exports its
`vf.Taskset` subclass (and, for a multi-turn environment, its `vf.Env` subclass) via `__all__`. `env.settings`
are values of the verifiers EnvConfig (taskset knobs under `taskset:`, a paired env id under `id:`).

How it is driven: the control is inverted. A verifiers episode is a program that calls a model; rlvr's rollout
loop (rlvr/rollout/episodes.py) owns sampling and calls `Episode.step(action)`. So `reset` starts the verifiers episode
(`Env.run_episode`) as a task, and rlvr's `Client` (the interception server's `Client.get_response`) turns each
model request into an observation and waits for the reply:

    reset()       starts run_episode(task) ──► the harness posts the prompt ──► Client.get_response: the request's
                  new messages (`turn.tail`) are the observation; reset returns it and the request waits
    step(action)  the waiting request is answered with `action` ──► the program goes on (the Env's user turn,
                  the rubric) until its next model request (→ Step(observation, 0, False)) or the episode's end
                  (→ Step(None, reward, True, info)).

The pieces verifiers needs and how each is supplied, with no network and no sandbox:
  - the harness: every seat is pinned to rlvr's own (`HARNESS_ID`), which runs in this process: one chat request
    per segment, posted to the interception endpoint with the rollout's secret (verifiers' built-in harnesses install
    their programs with `uv` from the network: verifiers/v1/runtimes/base.py `prepare_uv_script`).
  - tools: a taskset's `vf.Toolset`s are not served to verifiers (it would start an MCP server process per toolset,
    and its pairing check refuses a harness without MCP); their `@vf.tool` methods run in this process through
    rlvr's tool harness (rlvr/env/verifiers_tools.py: `offered_tools`, each episode's `tools`; `env.max_tool_calls`
    bounds them). A toolset that needs a remote server or a sandbox is refused when the environment is built.
  - the runtime: `subprocess` (a scratch folder per rollout; nothing is run in it), not the default remote sandbox.
  - the interception server: verifiers' own, on 127.0.0.1 (an ephemeral port), held by `Env.serving()` for the
    environment's life. 0.4.0 cannot be driven without it: it is where a turn is recorded in the trace, where
    `max_turns`/`@vf.stop` limits apply, and what the rubric reads.
  - the client: 0.4.0 takes no live client object; `InterceptionServer._client` builds one from a config with
    `resolve_client` (verifiers/v1/interception/server.py, `_client`; verifiers/v1/clients/client.py,
    `resolve_client`), which knows only its eval and train clients. So `resolve_client` in the server's module is
    wrapped, once, to return rlvr's client for the config whose `base_url` is `POLICY_URL`, and verifiers' own for
    any other (a judge's endpoint, say).
  - plugin ids: verifiers finds a taskset or harness by top-level module name only (verifiers/v1/utils/loaders.py
    `_import_plugin`: a dotted id fails in `importlib.util.find_spec`), so a dotted `environment`, and rlvr's
    harness, are registered in `sys.modules` under a top-level alias.

verifiers' machinery (the server, the episodes' tasks) lives on an event loop of its own, on a daemon thread
started with the first episode: rlvr's loop is a new one every training step (`asyncio.run`), and the server must
outlive it. rlvr's `Episode` methods hand work to that loop and await the result; a cancelled await (the guard's
`step_timeout_s`) cancels the work there, and `close` cancels the verifiers episode itself. Cost, measured on the
busy 2-core machine: building the environment imports verifiers (~10 s of CPU, before any model loads); 64
concurrent two-turn episodes take ~2 s (verifiers' per-rollout bookkeeping, all on that one thread).

Observations are text: the new messages' texts, one per line (the first observation starts with the task's system
prompt), each observation after the first put through `env.observation` (e.g. "\\n{text}\\n") since rlvr appends
it right after the action's tokens. An action is the assistant message's content as decoded. A request whose new
messages include an assistant message (the program rewrote the conversation instead of extending it) ends the
episode as an environment error: rlvr's context is never re-rendered.

Reward: the rubric's score when the episode ends, the sum over its traces of `trace.reward` (each trace's
weighted `@vf.reward` values, and any reward `Env.run`/`finalize` recorded) is the final step's reward; every
other step's is 0 (verifiers 0.4.0 gives no per-turn reward). The final step's info holds the rewards by name, the
stop condition and the turn count. A verifiers episode that failed (`Episode.ok` false: a hook raised, a timeout)
raises, which the guard turns into an environment error (reward 0).

Tasks and seeds: the taskset's first `num_tasks` tasks (all of a finite taskset when null) are loaded when the
environment is built; episode `seed` plays task `seed % len(tasks)`. The data example is not used. A group's G
episodes play the same task; whatever else an Env draws at random is its own to seed (rlvr requires an episode to
be a function of (example, seed)). Episodes do not fork.

Multi-agent environments: every seat is the policy, and its requests arrive in the order the Env makes them. So
an Env with one policy seat is meaningful; one whose seats converse (verifiers' user-sim) plays the policy against
itself, through one context.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import types
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rlvr.env.verifiers_tools import EpisodeTools, check_toolsets, declared_toolsets, offered_tools
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra
from rlvr.types import Example, Step

VERIFIERS_PACKAGE = Package("verifiers", pip_extra("envs"), ("verifiers",))
HARNESS_ID = "rlvr_policy_harness"
"""The top-level module name under which verifiers finds rlvr's harness (registered in `sys.modules`)."""
POLICY_URL = "rlvr://policy"
"""The client config `base_url` whose model calls rlvr's policy answers."""
POLICY_MODEL = "rlvr-policy"


class VerifiersEnvironment:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"episodes"}), machine=(VERIFIERS_PACKAGE,))

    def __init__(self, environment: str, settings: Mapping[str, Any] | None, num_tasks: int | None,
                 observation: str, max_turns: int, max_context_tokens: int, step_timeout_s: float) -> None:
        if max_turns < 1 or max_context_tokens < 1 or not step_timeout_s > 0:
            raise ValueError(f"env.max_turns={max_turns}, env.max_context_tokens={max_context_tokens} and "
                             f"env.step_timeout_s={step_timeout_s} must be > 0")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"env.num_tasks={num_tasks} must be >= 1 (or null: every task of a finite taskset)")
        try:
            if "{text}" not in observation or observation.format(text="") is None:
                raise ValueError
        except (ValueError, KeyError, IndexError) as err:
            raise ValueError(f"env.observation={observation!r} must hold {{text}} (where the messages' text goes) "
                             "and no other {field}") from err
        self.environment = environment
        self.observation = observation
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.step_timeout_s = step_timeout_s
        self.vf_env = build_env(environment, dict(settings or {}))
        self.tasks = load_tasks(self.vf_env, environment, num_tasks)
        self.offered_tools = taskset_tools(self.vf_env, self.tasks, environment)
        """The taskset's tools (rlvr/env/verifiers_tools.py), which rlvr/tools/harness.py offers the policy."""
        self._loop: PolicyLoop | None = None
        self._loop_lock = threading.Lock()

    def loop(self) -> PolicyLoop:
        """The verifiers loop, its thread and interception server started at the first episode."""
        with self._loop_lock:
            if self._loop is None:
                self._loop = PolicyLoop(self.vf_env)
            return self._loop

    def episode(self, example: Example, seed: int) -> VerifiersEpisode:
        return VerifiersEpisode(self, self.tasks[seed % len(self.tasks)])

    def shutdown(self) -> None:
        """Stop the interception server and the loop's thread (a process that ends needs not: both are daemons)."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()


def plugin_id(name: str) -> str:
    """The id verifiers' loader finds `name` by: a top-level module name as is; a dotted module path imported
    here and registered in `sys.modules` under a top-level alias (module docstring)."""
    if "." not in name.split("/")[-1]:
        return name
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise ValueError(f"env.environment={name!r} cannot be imported: {err}") from err
    alias = "rlvr_vf__" + name.replace(".", "__").lower()
    sys.modules.setdefault(alias, module)
    return alias


def build_env(environment: str, settings: dict[str, Any]):
    """The verifiers Env for `environment`, every seat pinned to rlvr's harness in the subprocess runtime."""
    import verifiers.v1 as vf

    install_policy_client()
    register_harness()
    taskset = {**dict(settings.pop("taskset", None) or {}), "id": plugin_id(environment)}
    try:
        config = vf.resolve_env_config({**settings, "taskset": taskset})
        seats = {name: {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}
                 for name, value in config if isinstance(value, vf.AgentConfig)}
        config = vf.resolve_env_config({**settings, "taskset": taskset, **seats})
        return vf.load_environment(config)
    except Exception as err:  # noqa: BLE001 - any loader failure is a config error
        raise ValueError(f"env.environment={environment!r}: verifiers cannot build it: "
                         f"{type(err).__name__}: {err}") from err


def taskset_tools(vf_env, tasks: list, environment: str) -> list:
    """The tools of the taskset's toolsets, checked (a refused one raises, naming it); the toolsets hidden from
    verifiers itself (an instance's `toolsets` answers none), which would serve them as MCP server processes."""
    try:
        scoped = declared_toolsets(vf_env.taskset)
    except Exception as err:  # noqa: BLE001 - a toolset that cannot be built is a config error
        raise ValueError(f"env.environment={environment!r}: its toolsets cannot be built: "
                         f"{type(err).__name__}: {err}") from err
    if not scoped:
        return []
    check_toolsets(environment, scoped)
    tools = offered_tools(environment, scoped)
    for owner in [vf_env.taskset, *tasks]:
        vars(owner)["toolsets"] = _no_toolsets
    return tools


def _no_toolsets(config) -> list:
    return []


def load_tasks(vf_env, environment: str, num_tasks: int | None) -> list:
    taskset = vf_env.taskset
    if num_tasks is None and not taskset.bounded:
        raise ValueError(f"env.environment={environment!r}: its taskset {type(taskset).__name__} is infinite: set "
                         "env.num_tasks (episodes play its first num_tasks tasks)")
    tasks = list(taskset if num_tasks is None else taskset.take(num_tasks))
    if not tasks:
        raise ValueError(f"env.environment={environment!r}: its taskset {type(taskset).__name__} yields no task")
    return tasks


ROUTES: dict[str, Channel] = {}
"""Trace id → the channel of the rlvr episode it belongs to (touched on the verifiers loop only)."""


def install_policy_client() -> None:
    """Wrap `resolve_client` in verifiers' interception server once (module docstring)."""
    import verifiers.v1.interception.server as server

    if getattr(server.resolve_client, "rlvr_policy", False):
        return
    original = server.resolve_client

    def resolve_client(config):
        return policy_client() if getattr(config, "base_url", None) == POLICY_URL else original(config)

    vars(resolve_client)["rlvr_policy"] = True  # the mark `getattr` reads above (mypy takes no new function attributes)
    server.resolve_client = resolve_client


def policy_context():
    import verifiers.v1 as vf

    return vf.ModelContext(model=POLICY_MODEL, client=vf.EvalClientConfig(base_url=POLICY_URL,
                                                                           api_key_var="RLVR_POLICY_KEY"))


def policy_client():
    """rlvr's `vf.Client`: answers a model request with its rlvr episode's next action (module docstring). One
    object serves every request (`ROUTES` finds the episode by the request's trace id)."""
    import verifiers.v1 as vf

    class PolicyClient(vf.Client):
        async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
            channel = ROUTES.get(session_id or "")
            if channel is None:
                raise RuntimeError(f"a model request from trace {session_id!r}, which no rlvr episode started")
            new = turn.tail if turn is not None else dialect.parse_request(body).messages
            action = await channel.ask(new)
            raw = {"id": f"rlvr-{channel.turns}", "object": "chat.completion", "created": 0, "model": POLICY_MODEL,
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": action}}]}
            response = dialect.parse_response(dialect.validate_response(raw))
            response.raw = raw
            return response

    return PolicyClient()


def register_harness() -> None:
    """rlvr's harness as the module `HARNESS_ID`, which verifiers' loader imports by that name."""
    if HARNESS_ID in sys.modules:
        return
    import verifiers.v1 as vf
    from verifiers.v1.dialects.chat import message_to_wire

    class PolicyHarnessConfig(vf.HarnessConfig):
        pass

    class PolicyHarness(vf.Harness[PolicyHarnessConfig]):
        """One chat request per segment, in this process, to the interception endpoint; no tools."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [message_to_wire(m) for m in prompt or []]
            answer = await http_client().post(f"{endpoint.rstrip('/')}/chat/completions",
                                              json={"model": ctx.model, "messages": messages},
                                              headers={"Authorization": f"Bearer {secret}"})
            failed = answer.status_code != 200
            return vf.ProgramResult(exit_code=int(failed), stdout="", stderr=answer.text if failed else "")

    module = types.ModuleType(HARNESS_ID, "rlvr's in-process harness for verifiers (rlvr/env/verifiers.py)")
    vars(module).update(PolicyHarness=PolicyHarness, PolicyHarnessConfig=PolicyHarnessConfig, __all__=["PolicyHarness"])
    sys.modules[HARNESS_ID] = module


HTTP_CLIENTS: dict[asyncio.AbstractEventLoop, Any] = {}
"""The harness's HTTP client on each verifiers loop: one, since building an httpx client loads the CA bundle
(~60 ms of CPU here, most of an episode's cost when it was one a request)."""


def http_client():
    import httpx

    loop = asyncio.get_running_loop()
    if loop not in HTTP_CLIENTS:
        HTTP_CLIENTS[loop] = httpx.AsyncClient(timeout=None)
    return HTTP_CLIENTS[loop]


async def _stop_serving(serving) -> None:
    try:
        await serving.__aexit__(None, None, None)
    finally:
        client = HTTP_CLIENTS.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


class PolicyLoop:
    """verifiers' event loop on a daemon thread, inside `Env.serving()` (the interception server) until `stop`."""

    def __init__(self, vf_env) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rlvr-env-verifiers", daemon=True)
        self.thread.start()
        self.serving = vf_env.serving()
        self.submit(self.serving.__aenter__()).result()

    def submit(self, coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def run(self, coroutine):
        """Await `coroutine` run on verifiers' loop from another loop; cancelling the await cancels it there."""
        return await asyncio.wrap_future(self.submit(coroutine))

    def stop(self) -> None:
        try:
            self.submit(_stop_serving(self.serving)).result(timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)


@dataclass
class Channel:
    """One rlvr episode's verifiers episode, on verifiers' loop: its requests waiting for an action."""

    observation: str
    requests: asyncio.Queue = field(default_factory=asyncio.Queue)
    reply: asyncio.Future | None = None
    run: asyncio.Task | None = None
    turns: int = 0
    trace: Any = None
    """The episode's latest verifiers trace (`on_trace`), whose `state` its tools read and write."""

    async def ask(self, messages) -> str:
        """A model request's new messages → the action that answers it, once rlvr's `step` gives it."""
        from verifiers.v1.types import content_text

        if any(m.role == "assistant" for m in messages):
            raise RuntimeError("the environment re-sent the conversation with an assistant turn rlvr did not take "
                               "(rlvr appends observations and cannot follow a rewritten history)")
        text = "\n".join(t for m in messages if (t := content_text(m.content)))
        reply = asyncio.get_running_loop().create_future()
        await self.requests.put((text if self.turns == 0 else self.observation.format(text=text), reply))
        self.turns += 1
        return await reply

    async def next(self) -> str | None:
        """The next request's observation (its reply pending), or None when the episode ended."""
        assert self.run is not None  # set when the episode starts, before its first request is awaited
        get = asyncio.ensure_future(self.requests.get())
        try:
            await asyncio.wait({get, self.run}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            text, self.reply = get.result()
            return text
        return None


@dataclass
class VerifiersEpisode:
    env: VerifiersEnvironment
    task: Any
    channel: Channel | None = None
    ended: Step | None = None
    toolsets: EpisodeTools | None = None

    @property
    def tools(self) -> dict:
        """This episode's tools by name (rlvr/tools/harness.py runs the calls): its toolsets' instances."""
        return self.toolsets.tools if self.toolsets is not None else {}

    async def reset(self) -> str:
        loop = self.env.loop()
        return await loop.run(self._start())

    async def _start(self) -> str:
        channel = Channel(self.env.observation)
        self.channel = channel

        def route(trace) -> None:
            ROUTES[trace.id] = channel
            channel.trace = trace

        if self.env.offered_tools:
            self.toolsets = EpisodeTools(declared_toolsets(self.env.vf_env.taskset, self.task), lambda: channel.trace)
            await self.toolsets.start(self.task)
        channel.run = asyncio.ensure_future(self.env.vf_env.run_episode(self.task, policy_context(), on_trace=route))
        text = await channel.next()
        if text is None:
            raise RuntimeError(f"the verifiers episode ended before its first model request: {outcome(channel.run)}")
        return text

    async def step(self, action: str) -> Step:
        if self.channel is None or self.channel.reply is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        return await self.env.loop().run(self._step(action))

    async def _step(self, action: str) -> Step:
        channel = self.channel
        # `step` checked the channel and its pending request; the episode's run started in `_start`
        assert channel is not None and channel.reply is not None and channel.run is not None
        reply, channel.reply = channel.reply, None
        if not reply.done():
            reply.set_result(action)
        text = await channel.next()
        if text is not None:
            return Step(text, 0.0, False, {})
        return final_step(channel.run.result())

    def fork(self) -> VerifiersEpisode:
        raise NotImplementedError("env=verifiers episodes do not fork (a running verifiers episode cannot be copied)")

    async def close(self) -> None:
        channel, self.channel = self.channel, None
        toolsets, self.toolsets = self.toolsets, None
        if channel is not None:
            await self.env.loop().run(_cancel(channel))
        if toolsets is not None:
            await self.env.loop().run(toolsets.close())


async def _cancel(channel: Channel) -> None:
    if channel.reply is not None and not channel.reply.done():
        channel.reply.cancel()
    if channel.run is not None and not channel.run.done():
        channel.run.cancel()
        await asyncio.gather(channel.run, return_exceptions=True)
    for trace_id in [t for t, c in ROUTES.items() if c is channel]:
        del ROUTES[trace_id]


def outcome(run: asyncio.Task) -> str:
    if not run.done():
        return "still running"
    if run.cancelled():
        return "cancelled"
    if run.exception() is not None:
        return f"{type(run.exception()).__name__}: {run.exception()}"
    episode = run.result()
    return "; ".join(f"{e.type}: {e.message}" for e in episode.errors) or f"ok={episode.ok}"


def final_step(episode) -> Step:
    """The finished verifiers episode's Step: its traces' summed reward, or an error when it failed."""
    if not episode.ok:
        errors = [f"{e.type}: {e.message}" for e in episode.errors]
        errors += [f"{e.type}: {e.message}" for t in episode.traces for e in t.errors]
        raise RuntimeError(f"the verifiers episode failed: {'; '.join(errors) or 'not ok'}")
    rewards = {name: r.value for t in episode.traces for name, r in t.rewards.items() if r is not None}
    info = {"rewards": rewards, "stop": [t.stop_condition for t in episode.traces],
            "turns": sum(t.num_turns for t in episode.traces)}
    return Step(None, float(sum(t.reward for t in episode.traces)), True, info)
