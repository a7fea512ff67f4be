"""The policy's tool calls in an action's text: the Hermes format Qwen2.5/Qwen3 templates ask for.

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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(r"</?tool_call>")


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict | None
    problem: str | None = None
    """None for a well-formed call; else "malformed: …" or "nested: …" (not run)."""
    text: str = ""
    """The block's inner text (kept for the observation and the transcript)."""


def has_tool_call(action: str) -> bool:
    return OPEN in action


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
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedCall(None, None, 'malformed: expected {"name": <tool name>, "arguments": {...}}', inner)
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError as err:
            return ParsedCall(call["name"], None, f"malformed: arguments are not JSON ({err})", inner)
    if not isinstance(arguments, dict):
        return ParsedCall(call["name"], None, f"malformed: arguments must be a JSON object, not "
                          f"{type(arguments).__name__}", inner)
    return ParsedCall(call["name"], arguments, None, inner)
