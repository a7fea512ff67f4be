"""`env.tools`: any environment's episodes with tools the policy may call between its answers.

    env:
      _target_: rlvr.env.guess.GuessEnvironment   # any environment
      ...
      tools:                                      # rlvr/tools/schema.py: functions with a JSON schema
        - _target_: rlvr.tools.calculator.calculate
      max_tool_calls: 2                           # per episode
      tool_timeout_s: 5.0                         # per call (default 10)
      tool_output_chars: 500                      # a result longer than this is cut (default 2000)
      tool_call_format: hermes                    # how calls are written: hermes (default) | json | marker (parse.py)
      tool_call_marker: "?"                       # the marker format's call marker (default "?")

rlvr/run.py builds the environment from `env` less these keys (`rlvr.tools.TOOL_KEYS`) and wraps it in a
`ToolEnvironment`. An action

  with no `<tool_call>`       → the wrapped episode's step, as without tools;
  with tool calls (parse.py)  → each call is run in order (run.py: checked, bounded, its result a text) and the
                                Step is (the results, reward 0, done=False, info {"tool_calls": [{name, outcome,
                                truncated}, …], "tool_results": [text, …]}); the wrapped episode does not see
                                the action, and any text beside the calls is not an answer (verl's agent loop
                                and TRL's do the same).

The rollout loop encodes a Step with `tool_results` as one tool-role turn (rlvr/chat/tools.py) instead of a
user message, so the row is: prompt (with the tools' schemas), action, tool turn, action, …; the policy's tokens
alone are trained, as for every observation.

Budget. Every `<tool_call>` block counts against `max_tool_calls`, run or refused. Calls past the budget are not
run (outcome "over_budget", text "error: … tool calls are spent"); an action whose every call is past the budget
goes to the wrapped episode as an ordinary answer (a policy that keeps calling is then judged, not looped). So an
episode takes at most `env.max_turns` answers plus `max_tool_calls` tool-calling actions: the harness's
`max_turns` is their sum, and its `step_timeout_s` (the guard's bound on one step, rlvr/env/guarded.py) is the
wrapped one's plus `max_tool_calls × tool_timeout_s`, so a tool timing out never reads as the environment's.

Warm-up. When the wrapped environment plays its own demonstrations (`demonstrations(count, seed)`, transcripts
[prompt, action, observation, …], env=calculator), the harness marks them for the warm-up (rlvr/warmup.py) to
encode as the rollout loop encodes episodes: the prompt as a `ToolPrompt` (shown with the tools' schemas) and each
observation that follows an action holding a call (this harness's format) as a `ToolTurn` (a tool-role turn, the
observation its one result).

A failure of the tool or the call (outcomes other than "ok") is the policy's observation and counted in the
`env/tool_*` metrics (docs/metrics.md); it never ends the episode. The episode still fails, as any does, when
the results together are longer than the guard's `max_observation_chars`: keep `tool_output_chars` × the calls of
one action below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self, cast

from rlvr.errors import ConfigError
from rlvr.optional import CarriesTools, ConcurrencyBound, OffersTools, PlaysDemonstrations
from rlvr.protocols import Environment, Episode
from rlvr.tools.parse import ParsedCall, call_parser
from rlvr.tools.run import Outcome, run_call
from rlvr.tools.schema import build_tools
from rlvr.types import Example, Step, Tool


class ToolEnvironment:
    """`env`'s episodes with tools (module docstring). Has `max_turns`, `max_context_tokens`, `step_timeout_s`
    (widened as described), `tool_schemas` (for the prompt), `parse` (the `tool_call_format`'s parser) and the
    wrapped one's `max_concurrent`; over an environment that plays demonstrations, `ToolGames`."""

    def __init__(self, env: Environment, tools: list[Tool], max_tool_calls: int, tool_timeout_s: float = 10.0,
                 tool_output_chars: int = 2000, tool_call_format: str = "hermes", tool_call_marker: str = "?") -> None:
        if not tools:
            raise ConfigError("invalid config:\n  env.tools is empty: list at least one tool, or leave env.tools out")
        if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 1:
            raise ConfigError(f"invalid config:\n  env.max_tool_calls={max_tool_calls!r} must be an integer >= 1")
        if not tool_timeout_s > 0 or tool_output_chars < 1:
            raise ConfigError(f"invalid config:\n  env.tool_timeout_s={tool_timeout_s} and env.tool_output_chars="
                              f"{tool_output_chars} must be > 0")
        self.env = env
        self.tools = {t.name: t for t in tools}
        self.tool_schemas = [t.schema for t in tools]
        self.max_tool_calls, self.tool_timeout_s, self.tool_output_chars = (max_tool_calls, tool_timeout_s,
                                                                            tool_output_chars)
        self.max_turns = env.max_turns + max_tool_calls
        self.max_context_tokens = env.max_context_tokens
        self.step_timeout_s = env.step_timeout_s + max_tool_calls * tool_timeout_s
        self.max_concurrent = env.max_concurrent if isinstance(env, ConcurrencyBound) else None
        self.parse = call_parser(tool_call_format, tool_call_marker, self.tool_schemas)
        self.call_format = tool_call_format

    def episode(self, example: Example, seed: int) -> ToolEpisode:
        return ToolEpisode(self, self.env.episode(example, seed))


class ToolGames(ToolEnvironment):
    """A `ToolEnvironment` over an environment that plays its own demonstrations (rlvr/optional.py
    `PlaysDemonstrations`): they are marked for the warm-up (module docstring)."""

    def __init__(self, env: PlaysDemonstrations, *args: Any, **kwargs: Any) -> None:
        super().__init__(cast(Environment, env), *args, **kwargs)
        self.games = env

    def demonstrations(self, count: int, seed: int) -> list[list[str]]:
        """The wrapped environment's demonstrations, marked for the warm-up (module docstring)."""
        marked = []
        for game in self.games.demonstrations(count, seed):
            turns: list[str] = [ToolPrompt(game[0], self.tool_schemas)]
            for k, text in enumerate(game[1:], 1):
                calls = k % 2 == 0 and self.parse(game[k - 1])  # an observation after an action with a call
                turns.append(ToolTurn(text, [text]) if calls else text)
            marked.append(turns)
        return marked


def with_tools(env: Environment, settings: Mapping[str, Any]) -> Environment:
    """`env` itself when `settings` (the `TOOL_KEYS` of the `env` config) name no tools and `env` offers none, else
    wrapped with the tools of `env.tools` and those `env` offers itself (`offered_tools`: env=verifiers, its
    taskset's toolsets, rlvr/env/verifiers_tools.py; an environment with that attribute may leave it empty and
    still carry the other keys)."""
    offers = isinstance(env, OffersTools)
    offered = list(env.offered_tools or []) if isinstance(env, OffersTools) else []
    if not offered and (not settings or ("tools" not in settings and offers)):
        return env
    if ("tools" not in settings and not offered) or "max_tool_calls" not in settings:
        if offered:
            raise ConfigError(f"invalid config:\n  the environment offers tools {[t.name for t in offered]}: set "
                              "env.max_tool_calls (tool-calling actions per episode)")
        raise ConfigError(f"invalid config:\n  env.{', env.'.join(sorted(settings))} set: tools need both env.tools "
                          "and env.max_tool_calls")
    tools = offered + build_tools(list(settings.get("tools") or []))
    clash = sorted({t.name for t in tools if sum(u.name == t.name for u in tools) > 1})
    if clash:
        raise ConfigError(f"invalid config:\n  env.tools: {clash} also name tools the environment offers itself")
    optional = ("tool_timeout_s", "tool_output_chars", "tool_call_format", "tool_call_marker")
    knobs = {k: settings[k] for k in optional if k in settings}
    if isinstance(env, PlaysDemonstrations):
        return ToolGames(env, tools, settings["max_tool_calls"], **knobs)
    return ToolEnvironment(env, tools, settings["max_tool_calls"], **knobs)


class _Marked(str):
    """A demonstration's text that carries what the warm-up needs to encode it, under the subclass's `field`."""

    field = ""

    def __new__(cls, text: str, value: list) -> Self:
        marked = super().__new__(cls, text)
        setattr(marked, cls.field, value)
        return marked


class ToolPrompt(_Marked):
    """A demonstration's prompt, shown with the tools' `schemas` (rlvr/chat/tools.py's tool_prompt_ids)."""

    field = "schemas"
    schemas: list[dict]


class ToolTurn(_Marked):
    """A demonstration's observation that is a tool-role turn with `results` (rlvr/chat/tools.py's tool_turn_ids)."""

    field = "results"
    results: list[str]


@dataclass
class ToolEpisode:
    env: ToolEnvironment
    inner: Episode
    calls: int = 0
    """Tool-call blocks this episode has sent (run or refused), against `max_tool_calls`."""
    own: CarriesTools | None = field(init=False)
    """The wrapped episode where it holds its own instances of the environment's offered tools (env=verifiers)."""

    def __post_init__(self) -> None:
        self.own = self.inner if isinstance(self.inner, CarriesTools) else None

    async def reset(self) -> str:
        return await self.inner.reset()

    async def step(self, action: str) -> Step:
        parsed = self.env.parse(action)
        budget = self.env.max_tool_calls - self.calls
        if not parsed or budget <= 0:
            step = await self.inner.step(action)
            if not parsed:
                return step
            spent = [self._spent().record(c.name) for c in parsed]
            return Step(step.observation, step.reward, step.done, {**step.info, "tool_calls": spent})
        self.calls += len(parsed)
        outcomes = [await self._run(c) if i < budget else self._spent() for i, c in enumerate(parsed)]
        return Step("\n".join(o.text for o in outcomes), 0.0, False,
                    {"tool_calls": [o.record(c.name) for c, o in zip(parsed, outcomes, strict=True)],
                     "tool_results": [o.text for o in outcomes]})

    async def _run(self, call: ParsedCall) -> Outcome:
        tools = {**self.env.tools, **(self.own.tools if self.own is not None else {})}
        return await run_call(call, tools, self.env.tool_timeout_s, self.env.tool_output_chars)

    def _spent(self) -> Outcome:
        return Outcome("over_budget", f"error: this episode's {self.env.max_tool_calls} tool calls are spent; "
                       "answer without tools")

    def fork(self) -> ToolEpisode:
        return ToolEpisode(self.env, self.inner.fork(), self.calls)

    def legal_actions(self) -> list[str]:
        return self.inner.legal_actions()

    async def close(self) -> None:
        await self.inner.close()


OUTCOME_METRICS = {"error": "env/tool_errors", "timeout": "env/tool_timeouts", "malformed": "env/tool_malformed",
                   "nested": "env/tool_malformed", "unknown_tool": "env/tool_unknown",
                   "bad_arguments": "env/tool_bad_arguments", "over_budget": "env/tool_over_budget"}


def tool_metrics(infos_PG: list[list[dict]]) -> dict[str, float]:
    """A step's `env/tool_*` metrics from its episodes' Step infos (docs/metrics.md): calls per episode, the
    fraction of episodes that called a tool, and the calls of each failing outcome in the step."""
    records_PG = [[r for info in infos for r in info.get("tool_calls", [])] for infos in infos_PG]
    records = [r for rs in records_PG for r in rs]
    n = max(1, len(infos_PG))
    out = {"env/tool_calls_mean": len(records) / n,
           "env/tool_call_frac": sum(1 for rs in records_PG if rs) / n,
           "env/tool_truncated": float(sum(r["truncated"] for r in records))}
    for name in OUTCOME_METRICS.values():
        out.setdefault(name, 0.0)
    for r in records:
        if r["outcome"] in OUTCOME_METRICS:
            out[OUTCOME_METRICS[r["outcome"]]] += 1
    return out
