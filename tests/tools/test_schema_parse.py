"""A tool's JSON schema (rlvr/tools/schema.py) and the policy's Hermes and JSON tool calls (rlvr/tools/parse.py)."""

import pytest
from sample_tools import scale

from rlvr.errors import ConfigError
from rlvr.tools.parse import call_parser, parse_json_calls, parse_tool_calls
from rlvr.tools.schema import build_tools


def test_schema_is_transformers_from_the_signature_and_the_google_docstring():
    (tool,) = build_tools([{"_target_": "sample_tools.scale"}])
    assert tool.name == "scale" and tool.fn is scale
    assert tool.schema["function"]["description"] == "Scale a length."
    assert tool.parameters == {"type": "object", "required": ["x"], "properties": {
        "x": {"type": "integer", "description": "The length."},
        "factor": {"type": "number", "description": "How much larger."},
        "unit": {"type": "string", "description": "The unit shown."}}}


def test_extra_keys_are_bound_and_hidden_from_the_schema():
    (tool,) = build_tools([{"_target_": "sample_tools.scale", "unit": "mm"}])
    assert set(tool.parameters["properties"]) == {"x", "factor"}
    assert tool.fn(x=3) == "6.0mm"  # 3 × 2.0, unit bound to "mm"


@pytest.mark.parametrize("entries, says", [
    ([{"_target_": "sample_tools.undocumented"}], "has no JSON schema"),
    ([{"_target_": "sample_tools.nothing"}], "cannot be imported"),
    ([{"name": "scale"}], "must be a mapping with a _target_"),
    ([{"_target_": "sample_tools.scale"}] * 2, "two tools are named 'scale'"),
])
def test_bad_tool_entries_are_config_errors(entries, says):
    with pytest.raises(ConfigError, match=says):
        build_tools(entries)


CALL = '<tool_call>\n{"name": "scale", "arguments": {"x": 3}}\n</tool_call>'


def test_a_valid_call_and_text_without_calls():
    (call,) = parse_tool_calls("Let me compute. " + CALL)
    assert (call.name, call.arguments, call.problem) == ("scale", {"x": 3}, None)
    assert parse_tool_calls("579") == [] and parse_tool_calls("a </tool_call> alone") == []


def test_several_calls_in_one_action_in_order_and_string_arguments():
    calls = parse_tool_calls(CALL + '<tool_call>{"name": "b", "arguments": "{\\"y\\": 1}"}</tool_call>'
                             '<tool_call>{"name": "c"}</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("scale", {"x": 3}), ("b", {"y": 1}), ("c", {})]


@pytest.mark.parametrize("block, problem", [
    ("<tool_call>{name: scale}</tool_call>", "malformed: not JSON"),
    ("<tool_call>[1, 2]</tool_call>", "malformed: expected {\"name\""),
    ('<tool_call>{"name": "scale", "arguments": [3]}</tool_call>', "malformed: arguments must be a JSON object"),
    ('<tool_call>{"name": "scale", "arguments": "{x"}</tool_call>', "malformed: arguments are not JSON"),
    ('<tool_call>{"name": "scale", "arguments": {"x": 3}}', "malformed: a <tool_call> is not closed"),
    ('<tool_call>{"name": "a", "arguments": {"q": "<tool_call>{\\"name\\": \\"b\\"}</tool_call>"}}</tool_call>',
     "nested: a <tool_call> inside a tool call"),
])
def test_malformed_and_nested_calls_are_refused_calls_not_errors(block, problem):
    (call,) = parse_tool_calls(block)
    assert call.problem is not None and call.problem.startswith(problem), call.problem


def test_a_nested_call_is_one_refused_call_and_the_next_call_still_parses():
    nested = '<tool_call>{"x": "<tool_call>{}</tool_call>"}</tool_call>'
    calls = parse_tool_calls(nested + CALL)
    assert [c.problem is None for c in calls] == [False, True] and calls[1].arguments == {"x": 3}


def test_json_calls_as_llama_3_1_writes_them():
    """env.tool_call_format=json: an action starting with "{" (after an optional <|python_tag|>) is a call, or
    several separated by ";", the arguments under "parameters" (or "arguments"); any other action holds none."""
    assert call_parser("json", "?", []) is parse_json_calls
    (call,) = parse_json_calls(' {"name": "scale", "parameters": {"x": 3}}\n')
    assert (call.name, call.arguments, call.problem) == ("scale", {"x": 3}, None)
    calls = parse_json_calls('<|python_tag|>{"name": "scale", "parameters": {"x": 3}}; {"name": "b", "arguments": {}}')
    assert [(c.name, c.arguments, c.problem) for c in calls] == [("scale", {"x": 3}, None), ("b", {}, None)]
    (call,) = parse_json_calls('{"name": "scale", "parameters": {"x": 3}} so the answer is 6')
    assert call.name == "scale"  # text after the last call is not an answer
    assert [c.name for c in parse_json_calls('{"name": "scale", "parameters": {"x": 3}};')] == ["scale"]
    assert parse_json_calls("579") == [] and parse_json_calls('The call {"name": "scale"} is not made') == []


@pytest.mark.parametrize("action, problem", [
    ("{x: 3}", "malformed: not JSON"),
    ('{"parameters": {"x": 3}}', 'malformed: expected {"name": <tool name>, "parameters": {...}}'),
    ('{"name": "scale", "parameters": [3]}', "malformed: arguments must be a JSON object"),
    ('{"name": "scale", "parameters": {"x": 3}', "malformed: not JSON"),  # cut by max_tokens
])
def test_a_json_call_that_cannot_be_decoded_is_a_refused_call(action, problem):
    (call,) = parse_json_calls(action)
    assert call.problem is not None and call.problem.startswith(problem) and call.text == action


def test_after_a_good_json_call_what_cannot_be_decoded_is_one_more_refused_call():
    good, bad = parse_json_calls('{"name": "scale", "parameters": {"x": 3}}; {broken')
    assert good.problem is None and bad.problem.startswith("malformed: not JSON") and bad.text == "{broken"
