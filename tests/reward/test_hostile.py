"""Every reward against the hostile corpus (tests/reward/hostile.py), through the trainer's `guarded_score`:
nothing raises, every completion gets one finite reward in [0, 1], the rules' outcomes hold, the counts add
up, and grading the whole corpus stays within a time bound."""

import math
import time
from collections import Counter

import pytest
from openai_compatible_server import OpenAICompatibleServer, chat_judge
from reward.hostile import CORPUS, POOL_WORKERS, math_reward

from rlvr.reward.exact import ExactMatch
from rlvr.reward.function import FunctionReward
from rlvr.reward.guarded import guarded_score
from rlvr.reward.match import BoxedMatch
from rlvr.types import Scores

COMPLETIONS = [h.completion for h in CORPUS]
REFERENCES = [h.reference for h in CORPUS]


def check(name: str, scores: Scores, expected: list[float | None]) -> None:
    assert len(scores.values) == len(CORPUS)
    bad = [(h.id, v) for h, v in zip(CORPUS, scores.values) if not (math.isfinite(v) and 0.0 <= v <= 1.0)]
    assert not bad, f"{name}: rewards outside [0, 1]: {bad}"
    wrong = [(h.id, v, e) for h, v, e in zip(CORPUS, scores.values, expected) if e is not None and v != e]
    assert not wrong, f"{name}: (item, reward, expected): {wrong}"
    counts = (scores.timeouts, scores.errors, scores.parse_failures)
    assert min(counts) >= 0 and sum(counts) <= len(CORPUS), f"{name}: counts {counts}"


def test_the_corpus_covers_every_category() -> None:
    sizes = Counter(h.category for h in CORPUS)
    assert len(CORPUS) >= 200 and min(sizes.values()) >= 10, sizes
    assert len({h.id for h in CORPUS}) == len(CORPUS), "ids name one item each"


@pytest.mark.parametrize(
    ("name", "reward", "bound_s"),
    [
        # Measured: match 0.3 s (extract_boxed walks each 1 MB text in Python), exact and contains < 0.01 s.
        ("exact", ExactMatch(), 2.0),
        ("match", BoxedMatch(), 5.0),
        ("contains", FunctionReward("examples_rewards.contains_answer"), 2.0),
    ],
)
def test_string_rewards(name: str, reward, bound_s: float) -> None:
    start = time.monotonic()
    scores = guarded_score(reward, COMPLETIONS, REFERENCES)
    elapsed = time.monotonic() - start
    if name == "contains":  # the user's own rule; what is under test is that the text reaches it intact
        expected = [float(h.reference in h.completion) for h in CORPUS]
    else:
        expected = [h.expected.get(name) for h in CORPUS]
    check(name, scores, expected)
    assert scores.timeouts == scores.errors == 0
    assert elapsed < bound_s, f"{name} took {elapsed:.1f} s on {len(CORPUS)} items"


def test_math_verify() -> None:
    reward = math_reward()  # the defaults: guards, CPU budgets, one item at a time
    try:
        guarded_score(reward, ["\\boxed{1}"], ["1"])  # start the workers outside the clock
        start = time.monotonic()
        scores = guarded_score(reward, COMPLETIONS, REFERENCES)
        elapsed = time.monotonic() - start
    finally:
        reward.close()
    check("math", scores, [h.expected.get("math") for h in CORPUS])
    # Measured with 2 workers on a 2-core machine at load 5: 15-25 s, a handful of budget timeouts, no worker
    # killed (before the guards and budgets: 635 s, 227 of math-verify's 5 s alarms). The slack is for
    # sharing the cores.
    assert reward.pool.replaced == 0, "a hostile item got past the guards and the budgets into the hard bound"
    assert scores.timeouts <= 20, f"{scores.timeouts} timeouts: the guards let slow items through"
    assert elapsed < 90.0, f"math took {elapsed:.0f} s on {len(CORPUS)} items ({scores.timeouts} timeouts)"


def test_judge(monkeypatch) -> None:
    """Through a real HTTP round trip (a loopback OpenAI-compatible server): NUL bytes, surrogates and 1 MB
    texts are sent as valid JSON; the server's verdict is "yes" iff the reference is inside the response."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-hostile")
    with OpenAICompatibleServer(api_key="sk-fake-hostile") as server:
        reward = chat_judge(base_url=server.base_url, timeout_s=10.0, max_concurrency=16)
        start = time.monotonic()
        scores = guarded_score(reward, COMPLETIONS, REFERENCES)
        elapsed = time.monotonic() - start
    check("judge", scores, [None] * len(CORPUS))
    assert scores.timeouts == scores.errors == 0 and len(server.requests) == len(CORPUS)
    assert 0 < sum(scores.values) < len(CORPUS)  # verdicts of both kinds came back
    assert elapsed < 30.0, f"judge took {elapsed:.1f} s on {len(CORPUS)} items"


@pytest.mark.parametrize("reward", ["match", "math"])
def test_the_trainer_survives_hostile_text(tmp_path, reward: str) -> None:
    """The trainer's real step and eval paths (guarded_score → rewards → advantages → update) with the
    policy's completions swapped for the corpus; a short run that must finish with finite metrics."""
    import json

    import hostile_rewards
    from omegaconf import open_dict

    from composing import FAST, compose_config
    from rlvr.run import run

    overrides = FAST + [f"reward={reward}", "trainer.max_steps=2", "trainer.batch_size=32"]
    if reward == "math":
        overrides += [f"reward.pool_workers={POOL_WORKERS}"]
    cfg = compose_config(overrides)
    with open_dict(cfg):
        cfg.reward = {"_target_": "hostile_rewards.HostileText", "reward": cfg.reward}
    hostile_rewards.SCORED.clear()
    assert run(cfg, tmp_path)["steps"] == 2
    # Two evaluations (start and end) of 64 prompts and two steps of 32x8 completions: the whole corpus.
    assert set(hostile_rewards.SCORED) == {h.id for h in CORPUS}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))
