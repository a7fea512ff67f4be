"""env=calculator (rlvr/env/calculator.py) with the marker call format (rlvr/tools/parse.py) and model=tiny_tools: the
problem is a function of the seed, only the product is rewarded, the demonstrations call the calculator in the format
the harness parses, and a short run plays the tool through the harness end to end (not that it learns: README)."""

import asyncio
import json

import pytest

from composing import FAST, compose_config
from rlvr.build import build_env
from rlvr.env.calculator import CalculatorEnvironment
from rlvr.errors import ConfigError
from rlvr.run import run
from rlvr.tools.calculator import calculate
from rlvr.tools.harness import ToolEnvironment, ToolPrompt, ToolTurn
from rlvr.tools.parse import MarkerCalls, ParsedCall, call_parser, parse_tool_calls
from rlvr.tools.schema import tool_schema
from rlvr.types import Example

NOTHING = Example("", "")
CALCULATE = tool_schema(calculate)


def play(env, seed: int, actions: list[str]) -> tuple[str, list]:
    async def go():
        episode = env.episode(NOTHING, seed)
        return await episode.reset(), [await episode.step(a) for a in actions]
    return asyncio.run(go())


def test_the_marker_format_passes_the_text_after_the_marker_as_the_one_argument():
    parse = call_parser("marker", "?", [CALCULATE])
    assert parse == MarkerCalls("?", "calculate", "expression")
    assert parse("?12*34") == [ParsedCall("calculate", {"expression": "12*34"}, None, "12*34")]
    assert parse("5?1+1") == [ParsedCall("calculate", {"expression": "1+1"}, None, "1+1")]  # text before: no answer
    assert parse("408") == [] and parse("?") == [ParsedCall("calculate", {"expression": ""}, None, "")]
    (nested,) = parse("?1?2")
    assert nested.name is None and nested.problem.startswith("nested:")
    assert call_parser("hermes", "?", [CALCULATE]) is parse_tool_calls  # the default format


def test_the_marker_format_needs_one_tool_with_one_string_parameter():
    def pair(a: int, b: int) -> int:
        """Add.

        Args:
            a: one
            b: other
        """
        return a + b
    for schemas in ([CALCULATE, CALCULATE], [tool_schema(pair)]):
        with pytest.raises(ConfigError, match="tool_call_format=marker needs exactly one tool"):
            call_parser("marker", "?", schemas)
    with pytest.raises(ConfigError, match=r"tool_call_format='xml': expected one of \['hermes', 'json', 'marker'\]"):
        call_parser("xml", "?", [CALCULATE])
    with pytest.raises(ConfigError, match="tool_call_marker=''"):
        call_parser("marker", "", [CALCULATE])


def test_only_the_product_is_rewarded_and_the_problem_is_a_function_of_the_seed():
    env = build_env(compose_config(["env=calculator"]))
    assert isinstance(env, ToolEnvironment) and env.max_turns == 2  # one answer + one tool call
    inner: CalculatorEnvironment = env.env  # type: ignore[assignment]
    a, b = inner.factors(3)
    assert inner.factors(3) == (a, b) and 32 <= min(a, b) and max(a, b) <= 99 and a * b >= 1000
    prompt, (step,) = play(env, 3, [f" {a * b}\n"])
    assert prompt == f"{a}*{b}=" and (step.reward, step.done, step.info["solved"]) == (1.0, True, True)
    _, (call, answer) = play(env, 3, [f"?{a}*{b}", str(a * b + 1)])
    assert call.observation == str(a * b) and call.info["tool_calls"][0]["outcome"] == "ok" and not call.done
    assert (answer.reward, answer.done) == (0.0, True)
    _, (call, answer) = play(env, 3, ["?1/0", "?2*2"])  # an error is an observation; a second call is over budget
    assert call.observation.startswith("error: calcula") and answer.info["tool_calls"][0]["outcome"] == "over_budget"
    assert (answer.reward, answer.done) == (0.0, True)


def test_demonstrations_call_the_calculator_sometimes_and_are_marked_for_the_warm_up():
    env = build_env(compose_config(["env=calculator", "env.call_fraction=0.25"]))
    games = env.demonstrations(400, 0)
    calls = [g for g in games if len(g) == 4]
    assert 60 < len(calls) < 140 and all(len(g) in (2, 4) for g in games)
    for g in games:
        a, b = map(int, g[0].rstrip("=").split("*"))
        assert isinstance(g[0], ToolPrompt) and g[0].schemas == [CALCULATE] and g[-1] == str(a * b)
        if len(g) == 4:
            assert g[1] == f"?{a}*{b}" and isinstance(g[2], ToolTurn) and g[2] == g[2].results[0] == str(a * b)
    assert env.demonstrations(400, 0) == games and env.demonstrations(400, 1) != games


def test_a_short_run_plays_the_tool_through_the_harness(tmp_path):
    """Warm-up on the marked demonstrations, then RL and greedy evaluation with tool turns: the rows, the tool
    metrics and the transcripts' tool turns are there. Learning takes minutes (README "A tool"): not asserted."""
    summary = run(compose_config(FAST + [
        "env=calculator", "trainer.warmup.steps=40", "trainer.warmup.batch_size=32", "env.call_fraction=0.5",
        "trainer.max_steps=2", "trainer.batch_size=4", "trainer.eval_every=2", "data.eval_size=16",
        "echo=on"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps, evals = [r for r in rows if "loss" in r], [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    for r in steps:
        assert {"env/tool_call_frac", "env/tool_calls_mean", "env/tool_errors", "env/tool_malformed"} <= r.keys()
        assert "echo/loss" in r
    assert all("eval/tool_call_frac" in r for r in evals)
    assert sum(r["env/tool_call_frac"] for r in steps) > 0 and sum(r["eval/tool_call_frac"] for r in evals) > 0
    warmup = [json.loads(line) for line in (tmp_path / "warmup.jsonl").read_text().splitlines()]
    assert warmup[-1]["loss"] < warmup[0]["loss"]
    groups = [json.loads(line) for f in sorted((tmp_path / "samples").iterdir()) for line in f.read_text().splitlines()]
    tool_turns = [(e[1]["text"], e[2]["text"]) for g in groups for e in g["transcripts"] if len(e) > 2
                  and e[2]["role"] == "tool"]
    assert tool_turns, "some sampled episode called the calculator"
    for call, result in tool_turns:  # the harness ran what the policy wrote
        try:
            expected = calculate(call[call.index("?") + 1:])
        except Exception:  # noqa: BLE001 - whatever the calculator refuses is an error observation
            expected = None
        assert result.startswith(expected[:16]) if expected is not None else result.startswith("error")
