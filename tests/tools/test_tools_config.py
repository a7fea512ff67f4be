"""`env.tools` on any environment's config: the config check accepts the harness's keys, and rlvr/run.py builds
the environment without them, wrapped in the tool harness (rlvr/tools/harness.py)."""

import pytest

from composing import compose_config
from rlvr.build import build_env
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.tools.harness import ToolEnvironment

TOOLS = ["+env.tools=[{_target_:rlvr.tools.calculator.calculate}]", "+env.max_tool_calls=2",
         "+env.tool_timeout_s=1.5"]


def test_env_tools_pass_the_check_and_wrap_the_environment():
    cfg = compose_config(["env=guess", *TOOLS])
    check(cfg)
    env = build_env(cfg)
    assert isinstance(env, ToolEnvironment) and list(env.tools) == ["calculate"]
    assert (env.max_turns, env.step_timeout_s) == (3 + 2, 5.0 + 2 * 1.5)  # guess: 3 guesses, 5 s a step
    assert type(build_env(compose_config(["env=guess"]))).__name__ == "GuessEnvironment"


def test_tools_without_a_budget_are_refused_naming_the_keys():
    with pytest.raises(ConfigError, match="tools need both env.tools and env.max_tool_calls"):
        build_env(compose_config(["env=guess", TOOLS[0]]))
