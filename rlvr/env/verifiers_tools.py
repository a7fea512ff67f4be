"""A verifiers taskset's tools (verifiers 0.4.0, `vf.Toolset`) run through rlvr's tool harness (rlvr/tools/).

How verifiers 0.4.0 declares tools. There is no `tools=[fn, ...]` argument any more (v0's `ToolEnv` and
`StatefulToolEnv` are gone from 0.4.0): a tool is a method of a `vf.Toolset` subclass marked `@vf.tool` (its name,
or `@vf.tool(name=...)`; its docstring is the description), and a taskset declares its toolsets with
`Task.toolsets(config)` (one instance per rollout, set up with `setup()` then `setup_task(task)`) or
`Taskset.toolsets(config)` (shared by every rollout, `setup()` only). verifiers serves each toolset as an MCP
server (`python -m <its module>` in the toolset's runtime, or a remote `url`) and its harness programs show the
model the server's tools as `{server}_{tool}` (`server_name`: the snake-cased class name, or `TOOL_PREFIX`; none
when `TOOL_PREFIX = None`) with the MCP input schema as parameters (verifiers/v1/harnesses/utils/mcp.py,
`connect_mcp`).

What rlvr does instead, with no server process and no network: each episode builds its toolsets' instances in this
process (`setup()`, and `setup_task(task)` for a task's own), registers them on an in-process MCP server object
(`mcp.server.mcpserver.MCPServer`, the class verifiers serves them with), and offers the policy the same names and
schemas, e.g. for

    class LookupToolset(vf.Toolset[vf.ToolsetConfig]):
        @vf.tool
        def lookup(self, key: str) -> str:
            '''The code filed under a key.'''
    → {"type": "function", "function": {"name": "lookup_toolset_lookup", "description": "The code filed under a
       key.", "parameters": {"properties": {"key": {"title": "Key", "type": "string"}}, "required": ["key"],
       "title": "lookupArguments", "type": "object"}}}

A call is then an rlvr tool call (rlvr/tools/harness.py): parsed from the policy's `<tool_call>`, its arguments
checked against that schema, run bounded on a thread of its own (`MCPServer.call_tool` on that thread's own event
loop: a tool that hangs holds its thread, never verifiers' loop), its result's text blocks (one a line) the
tool-role turn, an MCP error result or a raised error the outcome "error", counted in `env/tool_*`. The verifiers
episode does not see the tool turns: its trace holds the policy's answers (the action without tool calls), and the
rubric scores the episode from them as without tools. A toolset with rollout state (`vf.Toolset[Config, MyState]`)
reads and writes the episode's `trace.state` (validated into each side's State class, last write wins, as verifiers'
`/state` channel does), so a `@vf.reward` can read what the tools did.

Which toolsets run here, checked when the environment is built (any other is refused, naming it and why):
  - yes: a `vf.Toolset` whose tools are its `@vf.tool` methods (the default `register`), in the subprocess runtime
    (the default; `colocated` or not), task- or taskset-scoped;
  - no: a toolset with a `url` (a remote MCP server: needs the network); one in another runtime (a sandbox:
    docker, prime, …, which rlvr does not start); one with its own `register` that forwards another server's
    catalog (verifiers' own HarborMCPToolset: a Harbor task's stdio/SSE/HTTP MCP servers; NeMoGymToolset: NeMo
    Gym's resource servers over HTTP): both tasksets verifiers ships with tools need servers that do not run here.
Differences from verifiers' serving: a taskset-scoped toolset is built and set up per episode (verifiers builds it
once per evaluation), and tool calls are not offered to verifiers' `@vf.intercept` request hooks.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.types import Tool


@dataclass(frozen=True)
class Scoped:
    """A toolset instance and whether it is the task's own (set up with the task) or the taskset's."""

    toolset: Any
    per_task: bool


def declared_toolsets(taskset, task=None) -> list[Scoped]:
    """The taskset's toolsets and its task type's (or `task`'s), new instances (verifiers' classmethods build them)."""
    task_type = type(task) if task is not None else type(taskset).task_type()
    task_config = task.config if task is not None else taskset.config.task
    return ([Scoped(t, False) for t in type(taskset).toolsets(taskset.config)]
            + [Scoped(t, True) for t in task_type.toolsets(task_config)])


def refusal(toolset) -> str | None:
    """Why `toolset` cannot run in this process (module docstring), or None."""
    from verifiers.v1.mcp import Toolset

    name = type(toolset).__name__
    if not isinstance(toolset, Toolset):
        return f"{name} is a tool server, not a vf.Toolset of @vf.tool methods"
    if getattr(toolset.config, "url", None):
        return f"{name} is a remote MCP server at {toolset.config.url} (needs the network)"
    runtime = getattr(toolset.config.runtime, "type", None)
    if runtime != "subprocess":
        return f"{name} runs in a {runtime!r} runtime (a sandbox), which rlvr does not start"
    if type(toolset).register is not Toolset.register:
        return (f"{name} forwards another server's tools (its own `register`), a server that rlvr does not start "
                "(only a vf.Toolset's own @vf.tool methods run, in this process)")
    return None


def check_toolsets(environment: str, scoped: list[Scoped]) -> None:
    refused = [reason for s in scoped if (reason := refusal(s.toolset)) is not None]
    if refused:
        raise ValueError(f"env.environment={environment!r}: its tools cannot run here: {'; '.join(refused)}. rlvr "
                         "runs a vf.Toolset's @vf.tool methods in this process, in the subprocess runtime, with no "
                         "url (rlvr/env/verifiers_tools.py)")


def mcp_server(toolset):
    """The in-process MCP server object holding `toolset`'s tools, as verifiers registers them to serve them."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(toolset.server_name or type(toolset).__name__)
    toolset.register(server)
    return server


def run_sync(coroutine) -> Any:
    """`coroutine`'s result on a new event loop on a thread of its own (the caller may be inside a loop)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def advertised(toolset, server) -> list[tuple[str, str, dict]]:
    """(the name the policy calls, the tool's own name, its function schema) for each of `toolset`'s tools."""
    prefix = toolset.server_name
    out = []
    for tool in run_sync(server.list_tools()):
        full = f"{prefix}_{tool.name}" if prefix else tool.name
        out.append((full, tool.name, {"type": "function", "function": {
            "name": full, "description": tool.description or "", "parameters": tool.input_schema}}))
    return out


def _outside_an_episode(**arguments: Any) -> str:
    raise RuntimeError("a verifiers tool runs in an episode (its toolsets' instances), not on the environment")


def offered_tools(environment: str, scoped: list[Scoped]) -> list[Tool]:
    """The tools' names and schemas, for the prompt and the harness; each episode runs its own (`EpisodeTools`)."""
    tools: dict[str, Tool] = {}
    for s in scoped:
        for full, _, schema in advertised(s.toolset, mcp_server(s.toolset)):
            if full in tools:
                raise ValueError(f"env.environment={environment!r}: two of its tools are named {full!r}")
            tools[full] = Tool(full, _outside_an_episode, schema)
    return list(tools.values())


def call_tool(server, name: str, **arguments: Any) -> str:
    """One call on the calling thread's own event loop: the result's text blocks, one a line; an error result
    raises (rlvr/tools/run.py calls this on a thread of its own, bounded)."""
    result = asyncio.run(server.call_tool(name, arguments))
    text = "\n".join(block.text if getattr(block, "type", None) == "text" else str(block)
                     for block in getattr(result, "content", None) or [])
    if getattr(result, "is_error", False):
        raise RuntimeError(text or f"{name} returned an error")
    return text


@dataclass
class EpisodeTools:
    """One episode's toolsets: built and set up at its start, their tools reading and writing `trace()`'s state."""

    scoped: list[Scoped]
    trace: Callable[[], Any]
    """The episode's verifiers trace (None before its first model request)."""
    tools: dict[str, Tool] = field(default_factory=dict)

    async def start(self, task) -> None:
        for s in self.scoped:
            self.bind_state(s.toolset)
            await s.toolset.setup()
            if s.per_task:
                await s.toolset.setup_task(task)
            server = mcp_server(s.toolset)
            for full, name, schema in advertised(s.toolset, server):
                self.tools[full] = Tool(full, functools.partial(call_tool, server, name), schema)

    def bind_state(self, toolset) -> None:
        """`toolset`'s state pulled from and pushed to the episode's `trace.state` (verifiers' `/state` channel)."""
        from pydantic import TypeAdapter
        from verifiers.v1.mcp.server import _call_state

        def pull():
            trace = self.trace()
            if trace is None:
                return toolset._state_cls()
            return toolset._state_adapter.validate_json(TypeAdapter(type(trace.state)).dump_json(trace.state))

        async def pull_state():
            return pull()

        async def push_state(before: bytes) -> None:
            trace = self.trace()
            after = toolset._state_adapter.dump_json(_call_state.get())
            if trace is not None and after != before:
                trace.state = TypeAdapter(type(trace.state)).validate_json(after)

        vars(toolset).update(_pull_state=pull_state, _push_state=push_state)

    async def close(self) -> None:
        for s in self.scoped:
            await s.toolset._exit_stack.aclose()
