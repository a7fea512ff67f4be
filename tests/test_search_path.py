"""A transform, an environment and a condition of one's own, added without touching the repository: a Python
module on PYTHONPATH and option files in a folder given to Hydra as `hydra.searchpath=[file://...]`. `train.py`
composes, checks, names and trains them like built-in options (rlvr/config_sources.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["trainer.warmup.steps=0", "trainer.warmup.cache_dir=null", "trainer.eval_every=0", "data.eval_size=8",
         "trainer.batch_size=2", "trainer.group_size=2", "trainer.sampling.max_tokens=2", "trainer.max_steps=1",
         "threads=1"]
CONFIG_ERROR = 2

MODULE = '''
"""Throwaway components: a transform that halves every token advantage, a one-coin guessing game."""
from dataclasses import dataclass

from rlvr.protocols import Needs
from rlvr.types import Step


class Halve:
    @classmethod
    def needs(cls, settings):
        return Needs()

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, adv_PG, signals):
        adv = adv_PG[:, None] if adv_PG.dim() == 1 else adv_PG
        return adv * signals.mask_PG_T * self.factor, {"halve/factor": self.factor}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@dataclass
class Coin:
    max_turns: int
    max_context_tokens: int
    step_timeout_s: float

    @classmethod
    def needs(cls, settings):
        return Needs(provides=frozenset({"episodes"}))

    def episode(self, example, seed):
        return Toss(self, seed % 2)


@dataclass
class Toss:
    game: Coin
    side: int
    turns: int = 0

    async def reset(self):
        return "="

    async def step(self, action):
        self.turns += 1
        solved = action.strip() == str(self.side)
        done = solved or self.turns >= self.game.max_turns
        return Step(None if done else "=", float(solved), done, {"solved": solved} if done else {})

    def fork(self):
        raise NotImplementedError("a toss does not fork")

    def legal_actions(self):
        raise NotImplementedError

    async def close(self):
        return None
'''

OPTIONS = {
    "transform/halve.yaml": """
        # a transform of one's own: every token advantage times `factor`
        _target_: throwaway_parts.Halve
        factor: 0.5
        """,
    "env/coin.yaml": """
        # an environment of one's own: guess a coin's side (0 or 1) in up to two turns
        _target_: throwaway_parts.Coin
        max_turns: 2
        max_context_tokens: 32
        step_timeout_s: 5.0
        """,
    "condition/maxrl_halve.yaml": """
        # @package _global_
        # condition=maxrl_halve: algorithm=maxrl transform=halve
        defaults:
          - override /algorithm: maxrl
          - override /transform: halve
        """,
}


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder holding `python/throwaway_parts.py` and `conf/<group>/<option>.yaml`, outside the repository."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "python").mkdir()
    (folder / "python" / "throwaway_parts.py").write_text(MODULE)
    for name, text in OPTIONS.items():
        (folder / "conf" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "conf" / name).write_text(textwrap.dedent(text).lstrip())
    return folder


def train(outside: Path, cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        [str(outside / "python"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *QUICK, f"hydra.searchpath=[file://{outside}/conf]",
                           *overrides], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def test_a_condition_of_ones_own_trains_a_transform_and_an_environment_of_ones_own(outside, tmp_path):
    proc = train(outside, tmp_path, "condition=maxrl_halve", "env=coin")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [folder] = [p.parent for p in (tmp_path / "outputs").rglob("metrics.jsonl")]
    assert folder.parent.relative_to(tmp_path / "outputs") == Path("coin-arithmetic-tiny/maxrl+halve,turn=episode")
    [row] = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert row["condition"] == "maxrl+halve,turn=episode" and row["halve/factor"] == 0.5


def test_a_condition_of_ones_own_is_refused_beside_another_algorithm(outside, tmp_path):
    proc = train(outside, tmp_path, "condition=maxrl_halve", "algorithm=grpo")
    assert proc.returncode == CONFIG_ERROR, proc.stderr[-3000:]
    assert ("condition=maxrl_halve trains algorithm=maxrl, but algorithm=grpo was chosen too: drop one of them, or "
            "say condition=none to train algorithm=grpo") in proc.stderr


def test_an_environment_of_ones_own_is_named_where_its_capability_is_missing(outside, tmp_path):
    """The options that give a missing capability are read from the option files (rlvr/providers.py): echo=on
    needs episodes, and the refusal names every environment that plays them, this folder's own included."""
    proc = train(outside, tmp_path, "echo=on")
    assert proc.returncode == CONFIG_ERROR, proc.stderr[-3000:]
    assert "which no chosen component gives: choose env=calculator, or env=coin, or env=guess" in proc.stderr
