"""env=verifiers with tools (rlvr/env/verifiers_tools.py): a verifiers taskset's `vf.Toolset` (tests/env/
verifiers_lookup.py, written with verifiers 0.4.0's own classes over a local dataset: the package ships no taskset
with tools that runs offline) offered to the policy with the schema verifiers' harnesses show, called through rlvr's
tool harness by a scripted engine in rlvr's episode loop, the episode scored by the taskset's rubric (which reads the
state the tool wrote); toolsets that need a server rlvr does not start are refused, naming what is missing."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
from chat.test_chat_turns import qwen
from openai_compatible_server import conf_values

from rlvr.chat.turns import end_of_turn_id
from rlvr.env.guarded import GuardedEnvironment
from rlvr.rollout.episodes import play
from rlvr.tools.harness import tool_metrics, with_tools
from rlvr.types import Example, SamplingParams

pytest.importorskip("verifiers")  # in the envs and dev extras (pip install -e ".[dev]")

from rlvr.env.verifiers import VerifiersEnvironment  # noqa: E402
from rlvr.env.verifiers_tools import refusal  # noqa: E402

LOOKUP = "tests.env.verifiers_lookup"
CALL = '<tool_call>\n{"name": "lookup_toolset_lookup", "arguments": {"key": "k1"}}\n</tool_call>'


@contextlib.contextmanager
def environment(name: str = LOOKUP, **overrides):
    env = VerifiersEnvironment(**conf_values("env/verifiers", environment=name, **overrides))
    try:
        yield env
    finally:
        env.shutdown()


class Scripted:
    """An engine that samples each turn's scripted text for every row, ended with <|im_end|>."""

    def __init__(self, tok, turns: list[str]):
        self.tok, self.turns, self.turn = tok, turns, 0

    def sample(self, contexts, n, sampling, seeds, with_entropy=False):
        ids = self.tok.encode(self.turns[self.turn], add_special_tokens=False) + [end_of_turn_id(self.tok)]
        self.turn += 1
        rows = len(contexts)
        return SimpleNamespace(tokens_PG_T=torch.tensor([ids] * rows), mask_PG_T=torch.ones(rows, len(ids), dtype=bool),
                               logprobs_PG_T=torch.full((rows, len(ids)), -0.5), entropy_PG_T=None)


def test_a_toolset_is_offered_with_verifiers_schema_called_through_the_harness_and_scored_by_the_rubric():
    with environment() as vf_env:
        assert [t.schema for t in vf_env.offered_tools] == [{"type": "function", "function": {
            "name": "lookup_toolset_lookup",  # {server_name}_{tool}: the snake-cased class name, then the method
            "description": "The code filed under a key.",
            "parameters": {"properties": {"key": {"title": "Key", "type": "string"}}, "required": ["key"],
                           "title": "lookupArguments", "type": "object"}}}]
        env = GuardedEnvironment(with_tools(vf_env, {"max_tool_calls": 2}))
        assert env.max_turns == 4 + 2  # conf/env/verifiers.yaml's max_turns + the tool calls
        tok = qwen()
        played = play(Scripted(tok, [CALL, "902"]), tok, env, [Example("", "")], 2, SamplingParams(1.0, 1.0, 64),
                      seeds=[1], sample_seeds=[0])  # task 1: key k1, code 902
    assert '"name": "lookup_toolset_lookup"' in tok.decode(played.rollouts.prompt_ids_P[0])  # the prompt's tools
    # the tool's result is the tool turn; the rubric: correct (1) + looked_up (0.5, from the state the tool wrote)
    assert [t["role"] for t in played.transcripts[0]] == ["env", "policy", "tool", "policy"]
    assert played.infos[0][0]["tool_results"] == ["902"]
    assert played.rewards_P_G.tolist() == [[1.5, 1.5]]
    assert played.infos[0][-1]["rewards"] == {"correct": 1.0, "looked_up": 0.5}
    metrics = tool_metrics([list(played.infos[0])])
    assert (metrics["env/tool_calls_mean"], metrics["env/tool_call_frac"], metrics["env/tool_errors"]) == (1, 1, 0)


def test_a_taskset_with_tools_needs_max_tool_calls_and_a_toolless_one_ignores_it():
    from rlvr.errors import ConfigError

    with environment() as vf_env:
        with pytest.raises(ConfigError, match=r"offers tools \[.lookup_toolset_lookup.\]: set env.max_tool_calls"):
            with_tools(vf_env, {})
    with environment("tests.env.verifiers_game") as toolless:  # conf/env/verifiers.yaml's max_tool_calls: unused
        assert toolless.offered_tools == [] and with_tools(toolless, {"max_tool_calls": 4}) is toolless


def test_toolsets_whose_servers_cannot_run_here_are_refused_naming_what_is_missing():
    import verifiers.v1 as vf
    from verifiers.v1.tasksets.harbor.toolset import HarborMCPConfig, HarborMCPToolset
    from verifiers.v1.tasksets.nemo_gym.toolset import NeMoGymToolset

    with pytest.raises(ValueError, match=r"LookupToolset is a remote MCP server at http://tools.example/mcp "
                                         r"\(needs the network\)"):
        VerifiersEnvironment(**conf_values("env/verifiers", environment=LOOKUP,
                                           settings={"taskset": {"task": {"url": "http://tools.example/mcp"}}}))
    # verifiers' own tasksets with tools: both forward servers that do not run here
    harbor = HarborMCPToolset(HarborMCPConfig(server={"name": "fs", "transport": "stdio", "command": "fs-server"}))
    assert "HarborMCPToolset forwards another server's tools" in (refusal(harbor) or "")
    assert "NeMoGymToolset forwards another server's tools" in (refusal(NeMoGymToolset(vf.SharedToolsetConfig())) or "")
    from verifiers.v1.runtimes import DockerConfig

    sandboxed = vf.Toolset(vf.ToolsetConfig(runtime=DockerConfig()))
    assert refusal(sandboxed) == "Toolset runs in a 'docker' runtime (a sandbox), which rlvr does not start"
