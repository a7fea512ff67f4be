"""One tool call, checked and run bounded: whatever the tool or the call does, the answer is a text.

    the call                                      outcome         the tool-role turn's text
    a name no tool has                            "unknown_tool"  error: no tool named 'x' (tools: calculate)
    arguments that do not fit the schema          "bad_arguments" error: calculate: argument 'expression' must be
      (a missing required one, an unknown one,                    string, got integer 7
       a JSON type that is not the parameter's)
    the tool raises                               "error"         error: calculate raised ZeroDivisionError: …
    the tool runs past `timeout_s`                "timeout"       error: calculate did not return within 2 s
    the tool returns                              "ok"            its value: a str as is, else JSON (else repr)

and any text longer than `max_chars` is cut there, marked `… [N more characters cut]` (`truncated`). Argument
types are checked, never coerced ("12" is not an integer): a policy learns the schema rather than a lenient
reader. Nested arrays are checked one level deep (their items' type), objects only as objects.

Bounding. A tool is synchronous code, which cannot be cancelled: each call runs on a daemon thread of its own
and is awaited with `asyncio.wait_for(…, timeout_s)`. A call past its time is abandoned (the episode goes on
with the timeout's text): its thread keeps running what hung until it returns or the process exits, and its
result is dropped, as rlvr/env/guarded.py abandons a hung environment call. Converting the result to text runs on
that thread too, so a result whose `str` is slow is bounded as well. A tool that may hang for good and often
costs a thread each time (visible as `env/tool_timeouts`); a process per call would free it at the price of a
process start and pickled tools per call, not done here.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any

from rlvr.calls import describe, settle
from rlvr.tools.parse import ParsedCall
from rlvr.types import Tool

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


@dataclass(frozen=True)
class Outcome:
    kind: str
    """ok | error | timeout | unknown_tool | bad_arguments | malformed | nested | over_budget"""
    text: str
    """The tool-role turn's content."""
    truncated: bool = False

    def record(self, name: str | None) -> dict:
        """What the episode's Step.info keeps of the call (the `env/tool_*` metrics read it)."""
        return {"name": name, "outcome": self.kind, "truncated": self.truncated}


def type_problem(value: Any, schema: dict) -> str | None:
    """Why `value` does not fit a parameter's JSON schema, or None."""
    types = schema.get("type")
    if types is None:
        return None
    names = [types] if isinstance(types, str) else list(types)
    if schema.get("nullable"):
        names.append("null")
    if not any(_is(value, t) for t in names):
        return f"must be {' or '.join(names)}, got {_json_type(value)} {_short(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}, got {_short(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = type_problem(item, schema["items"])
            if problem is not None:
                return f"item {i} {problem}"
    return None


def _is(value: Any, json_type: str) -> bool:
    if isinstance(value, bool) and json_type in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES.get(json_type, (object,)))


def _json_type(value: Any) -> str:
    return next((t for t in ("null", "boolean", "integer", "number", "string", "array", "object") if _is(value, t)),
                type(value).__name__)


def _short(value: Any, width: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[:width] + "…"


def arguments_problem(tool: Tool, arguments: dict) -> str | None:
    """Why a call's arguments do not fit the tool's schema, or None."""
    properties = tool.parameters.get("properties", {})
    unknown = [a for a in arguments if a not in properties]
    if unknown:
        return f"no argument {unknown[0]!r} (it takes: {', '.join(properties) or 'none'})"
    missing = [a for a in tool.parameters.get("required", []) if a not in arguments]
    if missing:
        return f"argument {missing[0]!r} is required"
    for name, value in arguments.items():
        problem = type_problem(value, properties[name])
        if problem is not None:
            return f"argument {name!r} {problem}"
    return None


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def cut(text: str, max_chars: int) -> tuple[str, bool]:
    """`text`, or its first `max_chars` characters marked as cut."""
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters cut]", True


async def run_call(call: ParsedCall, tools: dict[str, Tool], timeout_s: float, max_chars: int) -> Outcome:
    """The call's outcome (module docstring); never raises for anything the tool or the call does."""
    if call.problem is not None:
        kind = call.problem.split(":", 1)[0]
        return Outcome(kind, cut(f"error: {call.problem}", max_chars)[0])
    assert call.name is not None and call.arguments is not None  # a well-formed call has both
    tool = tools.get(call.name)
    if tool is None:
        text = f"error: no tool named {call.name!r} (tools: {', '.join(tools) or 'none'})"
        return Outcome("unknown_tool", cut(text, max_chars)[0])
    problem = arguments_problem(tool, call.arguments)
    if problem is not None:
        return Outcome("bad_arguments", cut(f"error: {tool.name}: {problem}", max_chars)[0])
    try:
        text = await asyncio.wait_for(_on_a_thread(tool, call.arguments), timeout_s)
    except TimeoutError:
        return Outcome("timeout", f"error: {tool.name} did not return within {timeout_s:g} s")
    except Exception as err:  # noqa: BLE001 - the tool's own failure is the policy's observation
        return Outcome("error", cut(f"error: {tool.name} raised {describe(err)}", max_chars)[0])
    text, truncated = cut(text, max_chars)
    return Outcome("ok", text, truncated)


def _on_a_thread(tool: Tool, arguments: dict) -> asyncio.Future:
    """The call's text, computed on a daemon thread of its own (module docstring: abandoned on timeout)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def work() -> None:
        outcome: str | BaseException
        try:
            outcome, failed = as_text(tool.fn(**arguments)), False
        except Exception as err:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome, failed = err, True
        except BaseException as err:  # noqa: BLE001 - a tool's sys.exit() ends its call, not the run
            outcome, failed = RuntimeError(describe(err)), True
        try:
            loop.call_soon_threadsafe(settle, future, outcome, failed)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=work, name=f"rlvr-tool-{tool.name}", daemon=True).start()
    return future

