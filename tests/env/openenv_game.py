"""A small seeded OpenEnv environment for the tests, run in process (`env.environment=tests.env.openenv_game.Game`)
and served (`python -m tests.env.openenv_server PORT`).

The secret is `random.Random(seed).randint(0, 9)`; a guess (`GuessAction.message`, a number) is answered
"higher", "lower" or, on the secret, done with reward 1; the fourth wrong guess ends the game with reward 0.
Directives: "sleep:S" sleeps S seconds before answering (a hung step); "raise" raises (the server answers an
error); "reward:nan" answers a NaN reward.
"""

from __future__ import annotations

import random
import time

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    message: str


class Game(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self.turns = 0, 0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self.secret, self.turns = random.Random(seed).randint(0, 9), 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=f"guess a number from 0 to 9 (seeded game {seed % 1000})")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        text = action.message.strip()
        if text.startswith("sleep:"):
            time.sleep(float(text.split(":")[1]))
        if text == "raise":
            raise RuntimeError("the game broke")
        if text == "reward:nan":
            return GuessObservation(message="?", reward=float("nan"))
        self.turns += 1
        self._state.step_count = self.turns
        guess = int(text) if text.isdigit() else -1
        if guess == self.secret:
            return GuessObservation(message="right", reward=1.0, done=True)
        if self.turns >= 4:
            return GuessObservation(message="out of guesses", reward=0.0, done=True)
        return GuessObservation(message="higher" if guess < self.secret else "lower", reward=0.0)

    @property
    def state(self) -> State:
        return self._state
