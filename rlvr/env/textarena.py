"""`env=textarena`: a single-player TextArena game (textarena 0.7.4) by its registry id, e.g. GuessTheNumber-v0,
Mastermind-v0, TowerOfHanoi-v0, FrozenLake-v0, Minesweeper-v0, Sudoku-v0.

The game is the registry's class with the id's settings, without TextArena's wrappers: those re-send the whole
history every turn, for agents that see one prompt per turn, while here each observation is appended to the
policy's context. So `reset` answers the game's opening messages and each `step` the messages the game sent since
(the game's echo of the action left out, as the action is already in the context), one per line. With
`bracket_actions` an action holding no square bracket is sent as `[action]` (TextArena's ActionFormattingWrapper,
which the registry's default versions apply): most games read only a bracketed move.

Reward. TextArena scores a game once, when it ends: that score (`rewards[0]` of the game's `close()`) is the final
step's reward, every other step's is 0. It is the game's own: 1 for a win, and depending on the game a partial
score for a loss (GuessTheNumber: how close the last guess was) or −1 for repeated invalid moves; the final step's
info holds the game's reason. A game still going after `env.max_turns` actions is the rollout loop's to truncate
(set it at least to the game's own turn limit, which ends the game itself).

Seeding. `reset(num_players=1, seed=seed)`: TextArena seeds Python's *global* `random` with it and games draw from
it (the secret number, the code, the mines). So that concurrent episodes neither disturb each other nor anything
else in the process, every call into a game runs under a process-wide lock with the episode's own global-random
state swapped in and the process's restored afterwards: an episode's play is a function of its seed and actions
alone, whatever runs beside it. Calls run on the episode's `SyncCalls` thread (rlvr/env/guarded.py); a call that
times out is abandoned holding the lock, so the lock is then replaced and later calls take the new one (if the
abandoned call ever returns, it leaves the global state alone). Episodes fork (a deep copy of the game and of its
random state).

Refused at construction, with the game and the reason: an id not in the registry (close matches named); games that
read nltk's word lists (Hangman, Wordle, WordLadder, WordSearch: nltk downloads its `words` corpus when the game is
imported) while that corpus is not on this machine; games that ask a remote model through OpenRouter every turn
(GuessWho, TwentyQuestions) while $OPENROUTER_API_KEY is unset; and any game that cannot start for one player (a
two-player game; Klondike, whose module does not import on Python 3.11) — the constructor plays `reset` once to
find out. Found by reading the game module's source before importing it, so a refused game downloads nothing.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import importlib.util
import os
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.calls import describe
from rlvr.env.guarded import SyncCalls
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra
from rlvr.types import Example, Step

TEXTARENA_PACKAGE = Package("textarena", pip_extra("envs"), ("textarena",))
WORD_LISTS = ("nltk", "word_lists")
REMOTE_MODEL = ("OpenRouter", "OPENROUTER_API_KEY")


class GlobalRandom:
    """Python's global `random` state, lent to one game call at a time (module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holder: object | None = None

    def run(self, holder: object, state: tuple[Any, ...] | None, fn) -> tuple[Any, tuple[Any, ...]]:
        """fn() with `state` as the global random state (None: as it is; reset seeds it itself) → (result, the
        state after)."""
        lock = self.lock
        with lock:
            self.holder = holder
            outer = random.getstate()
            try:
                if state is not None:
                    random.setstate(state)
                result = fn()
                return result, random.getstate()
            finally:
                if self.lock is lock:  # not abandoned meanwhile
                    random.setstate(outer)
                    self.holder = None

    def abandon(self, holder: object) -> None:
        """`holder`'s call timed out: if it holds the lock, later calls take a new one."""
        if self.holder is holder:
            self.lock, self.holder = threading.Lock(), None


GLOBAL_RANDOM = GlobalRandom()


def refusal(game: str) -> str | None:
    """Why `game` cannot be played here, from the registry and its module's source (nothing imported but
    textarena's registry), or None."""
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(game)
    if spec is None:
        close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=5)
        return f"not a TextArena game id{f' (close: {close})' if close else ''}"
    module = spec.entry_point.split(":")[0] if isinstance(spec.entry_point, str) else spec.entry_point.__module__
    source = module_source(module)
    if any(word in source for word in WORD_LISTS) and not nltk_words_present():
        return ("the game reads nltk's 'words' corpus, which is not on this machine (textarena downloads it when "
                "the game is imported; where there is a network: python -m nltk.downloader words)")
    if any(word in source for word in REMOTE_MODEL) and not os.environ.get("OPENROUTER_API_KEY", "").strip():
        return ("the game asks a remote model through OpenRouter every turn: it needs $OPENROUTER_API_KEY and "
                "the network")
    return None


def module_source(module: str) -> str:
    """The source of textarena's `module`, read from its file without importing it or its package (a word game's
    package imports the game, which downloads its corpus at import)."""
    spec = importlib.util.find_spec("textarena")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("textarena is not installed")
    root = Path(spec.origin).parent
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def nltk_words_present() -> bool:
    try:
        import nltk

        nltk.data.find("corpora/words")
        return True
    except (ImportError, LookupError):
        return False


def unwrapped(env):
    import textarena as ta

    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


class TextArenaEnvironment:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"episodes", "fork"}), machine=(TEXTARENA_PACKAGE,))

    def __init__(self, game: str, bracket_actions: bool, max_turns: int, max_context_tokens: int,
                 step_timeout_s: float) -> None:
        if max_turns < 1 or max_context_tokens < 1 or not step_timeout_s > 0:
            raise ValueError(f"env.max_turns={max_turns}, env.max_context_tokens={max_context_tokens} and "
                             f"env.step_timeout_s={step_timeout_s} must be > 0")
        why = refusal(game)
        if why is None:
            try:
                episode = self._make(game)
                GLOBAL_RANDOM.run(self, None, lambda: episode.reset(num_players=1, seed=0))
            except Exception as err:  # noqa: BLE001 - reported as the game's refusal
                why = f"it cannot start for one player here ({describe(err)})"
        if why is not None:
            raise ValueError(f"env.game={game}: TextArena's {game} cannot be played: {why}")
        self.game = game
        self.bracket_actions = bracket_actions
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.step_timeout_s = step_timeout_s

    @staticmethod
    def _make(game: str):
        import textarena as ta

        return unwrapped(ta.make(game))

    def episode(self, example: Example, seed: int) -> TextArenaEpisode:
        return TextArenaEpisode(self, self._make(self.game), seed)


def observation_text(messages) -> str:
    """The game's messages, one per line, without the echo of the player's own action."""
    from textarena.core import ObservationType

    return "\n".join(text for _, text, kind in messages if kind != ObservationType.PLAYER_ACTION)


@dataclass
class TextArenaEpisode:
    env: TextArenaEnvironment
    game: Any
    """The unwrapped textarena.Env."""
    seed: int
    random_state: tuple[Any, ...] | None = None
    calls: SyncCalls = field(default_factory=lambda: SyncCalls("rlvr-env-textarena"))

    async def _play(self, fn):
        try:
            result, self.random_state = await self.calls(GLOBAL_RANDOM.run, self, self.random_state, fn)
        except asyncio.CancelledError:
            GLOBAL_RANDOM.abandon(self)
            raise
        return result

    async def reset(self) -> str:
        def reset() -> str:
            self.game.reset(num_players=1, seed=self.seed)
            return observation_text(self.game.get_observation()[1])

        self.random_state = None  # reset seeds the global state itself
        return await self._play(reset)

    async def step(self, action: str) -> Step:
        if self.env.bracket_actions and "[" not in action and "]" not in action:
            action = f"[{action.strip()}]"

        def step() -> Step:
            done, info = self.game.step(action)
            text = observation_text(self.game.get_observation()[1])
            if not done:
                return Step(text, 0.0, False, {})
            rewards, game_info = self.game.close()
            reward = float((rewards or {}).get(0, 0.0))
            player = (game_info or {}).get(0, {})
            return Step(text or None, reward, True, {"reason": player.get("reason"),
                                                     "invalid_move": bool(player.get("invalid_move"))})

        return await self._play(step)

    def fork(self) -> TextArenaEpisode:
        return TextArenaEpisode(self.env, copy.deepcopy(self.game), self.seed, copy.deepcopy(self.random_state))

    async def close(self) -> None:
        self.calls.stop()
