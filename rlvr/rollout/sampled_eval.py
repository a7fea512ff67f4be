"""Sampled held-out evaluation (`trainer.eval_samples` = k ≥ 2): k completions (single turn) or k episodes of
each held-out example at `trainer.eval_temperature` (top_p 1), each example's k reduced to one number, averaged
over the examples. With n = k samples of an example, c of them correct (reward > CORRECT_THRESHOLD, 0.5):

    eval/avg@k   mean over examples of c / n                              (prime-rl's avg@k, verl's mean@k)
    eval/pass@j  mean over examples of 1 − C(n − c, j) / C(n, j)          j = 1, 2, 4, … < k, and k itself
    eval/maj@k   mean over examples of [the majority answer is correct]   rewards that can read an answer only

pass@j is the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
(arXiv:2107.03374, §2.1): the probability that at least one of j samples drawn without replacement from the n
is correct. It is computed in the paper's numerically stable product form, with no large binomials:

    1 − C(n − c, j) / C(n, j) = 1 − ∏_{i = n − c + 1}^{n} (1 − j / i)     (1 when n − c < j)

So pass@1 = avg@k (c / n), and pass@k = the fraction of examples with at least one correct sample. prime-rl
reports avg@k and pass@k by this estimator; verl reports mean@k, best@k and maj@k by bootstrap over subsets.
Here every number is exact for the k samples drawn (no bootstrap), and pass@j at the powers of two below k
replaces verl's best@j curve.

maj@k (majority voting, verl's maj@k): each sample's answer as the reward reads it, `reward.answer(completion)`
(reward=exact: the stripped completion; match and math: the last `\\boxed{}`; reasoning_gym: what its scorer is
given). The answer given by the most samples wins; a tie goes to the answer whose first sample comes first (the
sample order: the engine's, row p·k + g), as verl's `max` over a dict in insertion order does. The example counts
as correct when that first sample is correct. Samples without an answer (None) do not vote; an example where
none has one counts as wrong. Answers are compared as strings: two equivalent forms (`\\frac12`, `0.5`) vote
apart (verl does the same with its `pred`). A reward with no `answer` (function, judge) and episodes (an
environment's reward has no answer to compare) get no maj@k.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlvr.telemetry import CORRECT_THRESHOLD


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are correct (module docstring)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_sizes(k: int) -> list[int]:
    """The j of the eval/pass@j keys for k samples: the powers of two below k, and k (k=6: 1, 2, 4, 6)."""
    sizes, j = [], 1
    while j < k:
        sizes.append(j)
        j *= 2
    return [*sizes, k]


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the majority answer of one example's samples is correct (ties: the answer seen first; None does
    not vote; no answer at all: False)."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
            first.setdefault(answer, i)
    if not counts:
        return False
    winner = max(counts, key=counts.__getitem__)  # the first of the tied maxima in insertion (sample) order
    return bool(correct[first[winner]])


def sampled_metrics(rewards_P_G: Sequence[Sequence[float]]) -> dict[str, float]:
    """`eval/avg@k` and `eval/pass@j` from each example's k rewards (one row per example)."""
    k = len(rewards_P_G[0])
    counts = [sum(r > CORRECT_THRESHOLD for r in row) for row in rewards_P_G]
    P = len(counts)
    return {f"eval/avg@{k}": sum(counts) / (P * k),
            **{f"eval/pass@{j}": sum(pass_at_k(k, c, j) for c in counts) / P for j in pass_sizes(k)}}


def majority_metric(answers_PG: Sequence[str | None], rewards_PG: Sequence[float], k: int) -> dict[str, float]:
    """`eval/maj@k` from every sample's answer and reward, example p's k samples at rows p·k … p·k + k − 1."""
    P = len(rewards_PG) // k
    hits = sum(majority_correct(answers_PG[p * k:(p + 1) * k],
                                [r > CORRECT_THRESHOLD for r in rewards_PG[p * k:(p + 1) * k]]) for p in range(P))
    return {f"eval/maj@{k}": hits / P}
