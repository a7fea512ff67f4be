"""Honest answers keep their verdicts under `reward=math`'s guards, CPU budgets and scheduling: every GSM8K and
MATH item of tests/reward/honest.py gets the reward math-verify 0.9.0 gives it on its own, and none of them is
a timeout or an error. (The equivalence table is graded with the same settings in test_math_equivalence.py.)"""

from reward.honest import GSM8K, MATH
from reward.hostile import math_reward

ALL = GSM8K + MATH


def test_honest_items_keep_their_verdicts() -> None:
    assert len(GSM8K) >= 90 and len(MATH) >= 250
    reward = math_reward()
    try:
        scores = reward.score([completion for _, completion, _ in ALL], [reference for reference, _, _ in ALL])
        replaced = reward.pool.replaced
    finally:
        reward.close()
    changed = [(reference, completion, expected, value)
               for (reference, completion, expected), value in zip(ALL, scores.values) if value != expected]
    assert not changed, f"(reference, completion, math-verify's verdict, now): {changed}"
    assert scores.timeouts == scores.errors == replaced == 0
    # No box (GSM8K "I think it is ...") and math-verify's text-only readings (a percent, a repeating decimal)
    unboxed = sum("\\boxed{" not in completion for _, completion, _ in ALL)
    assert unboxed <= scores.parse_failures <= unboxed + 10
