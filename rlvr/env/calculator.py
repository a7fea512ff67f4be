"""`env=calculator`: two-digit multiplication that the tiny model cannot do alone, with a calculator it may call.

The episode's problem is `a*b=` with a and b drawn from [low, high] by the seed alone (`random.Random(sub_seed(seed,
"calculator"))`, rlvr/seeds.py), as env=guess draws its secret; the example is not read (the data source sets the
number of problems per step and `data.eval_size` the held-out ones). The policy answers once:

    the answer (stripped)     Step(None, 1.0, done=True, {"solved": True, "product": …})    the product, in digits
    anything else             Step(None, 0.0, done=True, {"solved": False, "product": …})

The calculator is not this environment's: it is `env.tools` (rlvr/tools/calculator.py) run by the tool harness
(rlvr/tools/harness.py), which conf/env/calculator.yaml sets up. An action holding a call (`?12*34` in the marker
format model=tiny_tools writes) gets the calculator's output as a tool-role turn, then the policy answers; the
reward is this environment's check of that final answer alone (a call is worth nothing by itself, and nothing is
taken from the tool's output but what the policy writes).

`demonstrations(count, seed)`: the warm-up's games (rlvr/warmup.py). A fraction `call_fraction` of them call the
calculator (`tool_call` with the expression, the product as the tool's output, then the product as the answer);
the others answer the product at once. The warm-up therefore teaches the format of both and the model's own
(weak) multiplication; a call is the minority move, so the warm-up's policy mostly answers alone and mostly
wrongly, and RL — rewarded for right answers only — has to raise the tool-call rate (README "A tool").
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.protocols import Needs
from rlvr.seeds import sub_seed
from rlvr.tools.calculator import calculate
from rlvr.types import Example, Step


@dataclass(frozen=True)
class CalculatorEnvironment:
    low: int
    high: int
    """Both factors are drawn uniformly from low..high, both included."""
    max_turns: int
    """Answers per episode: the first one is judged (the harness adds the tool-calling turns)."""
    max_context_tokens: int
    step_timeout_s: float
    call_fraction: float
    """The fraction of warm-up demonstrations that call the calculator."""
    tool_call: str
    """A demonstration's call, `{expression}` replaced (the harness's call format: "?{expression}" for marker)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"episodes"}))

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"env.low={self.low}, env.high={self.high}: need 0 <= low <= high")
        if self.max_turns != 1:
            raise ValueError(f"env.max_turns={self.max_turns}: the calculator task takes one answer (1)")
        if self.max_context_tokens < 1 or not self.step_timeout_s > 0:
            raise ValueError(f"env.max_context_tokens={self.max_context_tokens} and env.step_timeout_s="
                             f"{self.step_timeout_s} must be > 0")
        if not 0.0 <= self.call_fraction <= 1.0 or "{expression}" not in self.tool_call:
            raise ValueError(f"env.call_fraction={self.call_fraction} must be in [0, 1] and env.tool_call="
                             f"{self.tool_call!r} must hold {{expression}}")

    def factors(self, seed: int) -> tuple[int, int]:
        rng = random.Random(sub_seed(seed, "calculator"))
        return rng.randint(self.low, self.high), rng.randint(self.low, self.high)

    def episode(self, example: Example, seed: int) -> CalculatorEpisode:
        return CalculatorEpisode(*self.factors(seed))

    def demonstrations(self, count: int, seed: int) -> list[list[str]]:
        """`count` games (module docstring), as [prompt, answer] or [prompt, call, tool output, answer]."""
        rng = random.Random(sub_seed(seed, "calculator/demonstrations"))
        games = []
        for _ in range(count):
            a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
            expression, product = f"{a}*{b}", str(a * b)
            if rng.random() < self.call_fraction:
                games.append([f"{expression}=", self.tool_call.format(expression=expression), calculate(expression),
                              product])
            else:
                games.append([f"{expression}=", product])
        return games


@dataclass
class CalculatorEpisode:
    a: int
    b: int

    async def reset(self) -> str:
        return f"{self.a}*{self.b}="

    async def step(self, action: str) -> Step:
        solved = action.strip() == str(self.a * self.b)
        return Step(None, float(solved), True, {"solved": solved, "product": self.a * self.b})

    async def close(self) -> None:
        return None
