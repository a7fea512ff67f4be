"""What a component may do beyond its config group's protocol (rlvr/protocols.py), declared as Protocols.

Each is checked once, with `isinstance`, where the component is wrapped or the rollout is built (the environment
guard, the tool harness, the episode loop's player), never looked up at each use:

    TurnSampling        an engine that keeps each episode's KV cache between its turns (engine=pytorch)
    ConcurrencyBound    an environment whose calls in flight are bounded (a server's session limit)
    PlaysDemonstrations an environment that plays its own games for the SFT warm-up (env=guess, env=calculator)
    ToolUse             an environment whose episodes call tools (`env.tools`, rlvr/tools/harness.py)
    OffersTools         an environment that brings tools of its own (env=verifiers' toolsets)
    CarriesTools        an episode that holds its own instances of those tools (env=verifiers)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlvr.protocols import TurnSampler
    from rlvr.types import Tool


@runtime_checkable
class TurnSampling(Protocol):
    """An engine that samples a played batch's turns through a `TurnSampler` of its own, which keeps each episode's
    KV cache from its last turn (rlvr/engine/pytorch.py "Turns"); every other engine samples each turn with one
    `Engine.sample` call on the whole context."""

    def turn_sampler(self) -> TurnSampler:
        """A sampler for one played batch (closed once the batch is played)."""
        ...


@runtime_checkable
class ConcurrencyBound(Protocol):
    """An environment whose calls may not all be in flight at once."""

    max_concurrent: int | None
    """Episodes whose calls may be in flight at once; None: all of them."""


@runtime_checkable
class PlaysDemonstrations(Protocol):
    """An environment that plays its own games for the SFT warm-up (rlvr/warmup.py)."""

    def demonstrations(self, count: int, seed: int) -> list[list[str]]:
        """`count` transcripts [prompt, action, observation, action, …] from `seed`."""
        ...


@runtime_checkable
class ToolUse(Protocol):
    """An environment whose episodes call tools: their schemas are shown in the prompt (rlvr/chat/tools.py) and the
    calls are read in `call_format` (rlvr/tools/parse.py)."""

    tool_schemas: list[dict]
    call_format: str


@runtime_checkable
class OffersTools(Protocol):
    """An environment that brings tools of its own, which the tool harness offers beside `env.tools`."""

    offered_tools: list[Tool]


@runtime_checkable
class CarriesTools(Protocol):
    """An episode that holds its own instances of its environment's offered tools, by name (set up at its reset)."""

    @property
    def tools(self) -> dict[str, Tool]: ...
