"""The policy's tool calls in an action's text: the Hermes format Qwen2.5/Qwen3 templates ask for (the default),
the bare JSON Llama 3.1–3.3 templates ask for, or a one-character marker for models too small to write JSON
(`env.tool_call_format`, `call_parser`).

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "123 + 456"}}
    </tool_call>

Every top-level `<tool_call>…</tool_call>` block of the action is one call, in order. What verl's
`HermesToolParser` and vLLM's do (regex `<tool_call>(.*?)</tool_call>`, json.loads, skip what fails) is followed
with one deliberate change: a block that cannot be run is not skipped silently but kept as a refused call, so the
policy is told why (an observation) and the run counts it (`env/tool_malformed`):

    the block                                                        ParsedCall
    JSON object with a str "name" and an object "arguments"           name, arguments
      ("arguments" may also be a JSON string of an object, OpenAI's    (decoded)
       form; absent arguments are {})
    not JSON, not an object, no str "name", arguments not an object  problem="malformed: …"
    a <tool_call> inside it (a call inside a call)                   problem="nested: …", run neither
    a <tool_call> never closed (the action was cut by max_tokens)    problem="malformed: … not closed"

A `</tool_call>` with no open block is text, not a call. Whether the name is a tool and the arguments fit its
schema is run.py's check, not the parser's.

The JSON format (`env.tool_call_format: json`, `parse_json_calls`) is what Llama 3.1–3.3's templates ask for when
given `tools` ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its
value}'), read as vLLM's `llama3_json` parser reads it: an action that starts, after white space and an optional
`<|python_tag|>`, with "{" is a call, or several separated by ";"; any other action holds none. Each object is
decoded as a Hermes block's, its arguments under "parameters" (or "arguments"); what cannot be decoded from there
on is one malformed call, and text after the last object is not an answer, as text beside a Hermes block is not.
So under this format an answer that starts with "{" is a call (malformed unless it is one).

The marker format (`env.tool_call_format: marker`, `env.tool_call_marker`, default "?"; `MarkerCalls`) is for a
policy that cannot write a JSON object in a few tokens (model=tiny_tools, whose context is 64 characters): the text
after the action's first marker is the one argument of the one tool, e.g. with the calculator

    ?123*45      → calculate(expression="123*45")

It needs exactly one tool with exactly one required parameter, of type string (`call_parser` refuses anything
else naming the keys). An action holds at most one call; text before the marker is not an answer, as text beside
a Hermes block is not; a marker inside the argument is a call inside a call (problem "nested: …", not run).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.chat.tools import OPEN
from rlvr.errors import ConfigError

_TAG = re.compile(r"</?tool_call>")


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict | None
    problem: str | None = None
    """None for a well-formed call; else "malformed: …" or "nested: …" (not run)."""
    text: str = ""
    """The block's inner text (kept for the observation and the transcript)."""


def parse_tool_calls(action: str) -> list[ParsedCall]:
    """The action's tool-call blocks in order (module docstring); [] when it opens none."""
    calls: list[ParsedCall] = []
    depth, start, nested = 0, 0, False
    for tag in _TAG.finditer(action):
        if tag.group() == OPEN:
            if depth == 0:
                start, nested = tag.end(), False
            else:
                nested = True
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                inner = action[start: tag.start()]
                calls.append(ParsedCall(None, None, "nested: a <tool_call> inside a tool call is not run", inner)
                             if nested else _decode(inner))
    if depth > 0:
        calls.append(ParsedCall(None, None, "malformed: a <tool_call> is not closed by </tool_call>",
                                action[start:]))
    return calls


def _decode(inner: str) -> ParsedCall:
    try:
        call = json.loads(inner)
    except ValueError as err:
        return ParsedCall(None, None, f"malformed: not JSON ({err})", inner)
    return _call(call, inner, "arguments")


def _call(call: object, inner: str, key: str) -> ParsedCall:
    """A decoded call object: a str "name" and its arguments under `key` (or "arguments")."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedCall(None, None, f'malformed: expected {{"name": <tool name>, "{key}": {{...}}}}', inner)
    arguments = call.get(key, call.get("arguments", {}))
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError as err:
            return ParsedCall(call["name"], None, f"malformed: arguments are not JSON ({err})", inner)
    if not isinstance(arguments, dict):
        return ParsedCall(call["name"], None, f"malformed: arguments must be a JSON object, not "
                          f"{type(arguments).__name__}", inner)
    return ParsedCall(call["name"], arguments, None, inner)


PYTHON_TAG = "<|python_tag|>"


def parse_json_calls(action: str) -> list[ParsedCall]:
    """The action's JSON calls in order (module docstring, the JSON format); [] when it does not start with one."""
    text = action.strip()
    text = text[len(PYTHON_TAG):].lstrip() if text.startswith(PYTHON_TAG) else text
    if not text.startswith("{"):
        return []
    calls: list[ParsedCall] = []
    decoder, at = json.JSONDecoder(), 0
    while True:
        try:
            call, end = decoder.raw_decode(text, at)
        except ValueError as err:
            return [*calls, ParsedCall(None, None, f"malformed: not JSON ({err})", text[at:])]
        calls.append(_call(call, text[at:end], "parameters"))
        rest = text[end:].lstrip()
        after = rest[1:].lstrip()
        if not rest.startswith(";") or not after:
            return calls  # the last call; text after it is not an answer
        at = len(text) - len(after)


FORMATS = ("hermes", "json", "marker")


@dataclass(frozen=True)
class MarkerCalls:
    """The marker format (module docstring): the text after `marker` is `parameter` of tool `tool`."""

    marker: str
    tool: str
    parameter: str

    def __call__(self, action: str) -> list[ParsedCall]:
        start = action.find(self.marker)
        if start < 0:
            return []
        argument = action[start + len(self.marker):]
        if self.marker in argument:
            return [ParsedCall(None, None, f"nested: a {self.marker!r} inside a tool call is not run", argument)]
        return [ParsedCall(self.tool, {self.parameter: argument}, None, argument)]


def call_parser(call_format: str, marker: str, schemas: list[dict]) -> Callable[[str], list[ParsedCall]]:
    """The parser of `env.tool_call_format` for tools with `schemas`: `parse_tool_calls` for "hermes",
    `parse_json_calls` for "json", a `MarkerCalls` for "marker" (ConfigError unless there is one tool with one
    required string parameter)."""
    if call_format == "hermes":
        return parse_tool_calls
    if call_format == "json":
        return parse_json_calls
    if call_format != "marker":
        raise ConfigError(f"invalid config:\n  env.tool_call_format={call_format!r}: expected one of {list(FORMATS)}")
    if not isinstance(marker, str) or not marker:
        raise ConfigError(f"invalid config:\n  env.tool_call_marker={marker!r} must be a non-empty string")
    functions = [s["function"] for s in schemas]
    parameters = functions[0]["parameters"] if len(functions) == 1 else {}
    required = parameters.get("required", [])
    if len(functions) != 1 or len(required) != 1 or len(parameters.get("properties", {})) != 1 or \
            parameters["properties"][required[0]].get("type") != "string":
        raise ConfigError(f"invalid config:\n  env.tool_call_format=marker needs exactly one tool with exactly one "
                          f"parameter, a required string; the tools are {[f['name'] for f in functions]}")
    return MarkerCalls(marker, functions[0]["name"], required[0])
