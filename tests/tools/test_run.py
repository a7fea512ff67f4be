"""One tool call checked and run bounded (rlvr/tools/run.py): every bad tool and bad call is an outcome."""

import asyncio
import time

import pytest
from sample_tools import add, boom, flood, hang, leave

from rlvr.tools.parse import parse_tool_calls
from rlvr.tools.run import run_call
from rlvr.tools.schema import tool_schema
from rlvr.types import Tool

TOOLS = {f.__name__: Tool(f.__name__, f, tool_schema(f)) for f in (add, boom, hang, flood, leave)}


def outcome(block: str, timeout_s: float = 5.0, max_chars: int = 100):
    (call,) = parse_tool_calls(block)
    return asyncio.run(run_call(call, TOOLS, timeout_s, max_chars))


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def test_a_good_call_returns_the_value_as_text():
    out = outcome(call("add", '{"a": 123, "b": 456}'))
    assert (out.kind, out.text, out.truncated) == ("ok", "579", False)  # 123 + 456 = 579, JSON-encoded


@pytest.mark.parametrize("arguments, text", [
    ('{"a": "123", "b": 456}', "error: add: argument 'a' must be integer, got string \"123\""),
    ('{"a": 1.5, "b": 456}', "error: add: argument 'a' must be integer, got number 1.5"),
    ('{"a": true, "b": 456}', "error: add: argument 'a' must be integer, got boolean true"),
    ('{"a": 1}', "error: add: argument 'b' is required"),
    ('{"a": 1, "b": 2, "c": 3}', "error: add: no argument 'c' (it takes: a, b)"),
])
def test_arguments_of_the_wrong_type_name_or_number_are_refused_not_coerced(arguments, text):
    out = outcome(call("add", arguments))
    assert (out.kind, out.text) == ("bad_arguments", text)


def test_an_unknown_tool_is_named_with_the_tools_there_are():
    out = outcome(call("mul", '{"a": 1}'))
    assert (out.kind, out.text) == ("unknown_tool", "error: no tool named 'mul' (tools: add, boom, hang, flood, leave)")


def test_a_tool_that_raises_or_exits_is_an_error_observation():
    out = outcome(call("boom", '{"x": 1}'))
    assert (out.kind, out.text) == ("error", "error: boom raised ZeroDivisionError: division by zero")
    out = outcome(call("leave", '{"x": 1}'))
    assert out.kind == "error" and "SystemExit" in out.text


def test_a_tool_that_hangs_is_abandoned_at_its_time_limit():
    t0 = time.perf_counter()
    out = outcome(call("hang", '{"x": 1}'), timeout_s=0.2)
    assert time.perf_counter() - t0 < 2.0  # the 30 s sleep is left on its daemon thread
    assert (out.kind, out.text) == ("timeout", "error: hang did not return within 0.2 s")


def test_megabytes_of_output_are_cut_to_the_limit():
    out = outcome(call("flood", '{"x": 1}'), max_chars=100)
    assert out.kind == "ok" and out.truncated
    assert out.text == "a" * 100 + "… [4999900 more characters cut]"  # 5,000,000 − 100


def test_malformed_and_nested_calls_become_observations():
    assert outcome("<tool_call>{oops</tool_call>").kind == "malformed"
    out = outcome('<tool_call>{"q": "<tool_call></tool_call>"}</tool_call>')
    assert (out.kind, out.text) == ("nested", "error: nested: a <tool_call> inside a tool call is not run")
