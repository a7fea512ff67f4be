"""algorithm.loss.aggregation (rlvr/algorithm/loss.py, docs/algorithms.md#loss-aggregation): the weight of each
token's ℓ in the step's loss Σ w·ℓ, from the whole step's tokens with A ≠ 0, worked by hand."""

import pytest
import torch

from rlvr.algorithm.loss import AGGREGATIONS, PolicyLoss

# 2 prompts × G = 2, T = 4. Tokens with A ≠ 0: row 0 three, row 1 one, row 2 none (a row without signal), row 3 two.
SIGNAL = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
PROMPT = torch.tensor([0, 0, 1, 1])


def weights(aggregation, norm=0):
    return PolicyLoss(0.0, 0.0, 0.0, aggregation=aggregation, aggregation_norm=norm).token_weights(SIGNAL, PROMPT)


def per_row(w):
    """Each row's weight (the same on each of its signal tokens), 0 for a row without any."""
    return [float(w[i][SIGNAL[i]].unique()) if SIGNAL[i].any() else 0.0 for i in range(4)]


def test_token_mean_is_divided_by_the_count_not_weighted():
    assert weights("token_mean") is None  # Σ ℓ / 6 (the backends divide, as before)


@pytest.mark.parametrize(("aggregation", "norm", "expected", "total"), [
    # S = 3 rows with signal, n = (3, 1, 0, 2): w_i = 1/(S·n_i) = 1/9, 1/3, -, 1/6; a mean of row means: Σ w = 3/3
    ("seq_mean_token_mean", 0, [1 / 9, 1 / 3, 0.0, 1 / 6], 1.0),
    # w = 1/S = 1/3 on every token: a mean of row sums; Σ w = 6/3 = 2
    ("seq_mean_token_sum", 0, [1 / 3, 1 / 3, 0.0, 1 / 3], 2.0),
    # Dr. GRPO: w = 1/(S·norm) = 1/(3·4) = 1/12; Σ w = 6/12
    ("seq_mean_token_sum_norm", 4, [1 / 12, 1 / 12, 0.0, 1 / 12], 0.5),
    # P = 2 prompts with signal: prompt 0 has n_p = 3 + 1 = 4, prompt 1 n_p = 0 + 2 = 2: w = 1/(2·4), 1/(2·2)
    ("prompt_mean", 0, [1 / 8, 1 / 8, 0.0, 1 / 4], 1.0),
])
def test_each_aggregation_weighs_tokens_as_its_formula(aggregation, norm, expected, total):
    w = weights(aggregation, norm)
    assert per_row(w) == pytest.approx(expected, abs=1e-7)
    assert float(w.sum()) == pytest.approx(total, abs=1e-6)
    assert bool((w[~SIGNAL] == 0).all())  # tokens without signal weigh nothing


@pytest.mark.parametrize("aggregation", AGGREGATIONS[1:])
def test_a_step_without_signal_weighs_nothing(aggregation):
    none = torch.zeros_like(SIGNAL)
    w = PolicyLoss(0.0, 0.0, 0.0, aggregation=aggregation, aggregation_norm=4).token_weights(none, PROMPT)
    assert bool((w == 0).all())


def test_bad_aggregations_name_the_key():
    with pytest.raises(ValueError, match=r"algorithm.loss.aggregation='seq_mean' must be one of token_mean, "):
        PolicyLoss(0.0, 0.0, 0.0, aggregation="seq_mean")
    with pytest.raises(ValueError, match=r"algorithm.loss.aggregation_norm, which must be > 0 \(now 0\)"):
        PolicyLoss(0.0, 0.0, 0.0, aggregation="seq_mean_token_sum_norm")
