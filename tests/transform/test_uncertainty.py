import math

import pytest
import torch

from rlvr.transform.gtpo import GTPO
from rlvr.transform.uncertainty import UNCERTAINTY_KINDS, check_uncertainty, token_uncertainty
from rlvr.types import TokenSignals
from tests.transform.retrain_reference import mask_of, pad


def _signals(logprobs: list[list[float]], entropies: list[list[float]] | None = None) -> TokenSignals:
    length = max(len(r) for r in logprobs)
    return TokenSignals(
        logprobs_PG_T=pad(logprobs, length, torch.float64),
        mask_PG_T=mask_of(logprobs, length),
        group_size=1,
        step=0,
        correct_rate=0.0,
        entropy_PG_T=None if entropies is None else pad(entropies, length, torch.float64),
    )


def test_surprisal_is_negative_logprob_clipped_at_50():
    # logprobs [-0.5, -80, 0] → −logprob [0.5, 80, 0] → clipped [0.5, 50, 0]; second row padded with 0
    u = token_uncertainty("surprisal", _signals([[-0.5, -80.0, 0.0], [-2.0]]))
    assert u.tolist() == [[0.5, 50.0, 0.0], [2.0, 0.0, 0.0]]


def test_predictive_variance_is_p_one_minus_p():
    # lp = log 0.5 → p = 0.5 → 0.25;  lp = log 0.9 → 0.9·0.1 = 0.09
    # lp = −200 → max(lp, −50) → p = e^−50 ≈ 2e-22
    u = token_uncertainty("predictive_variance", _signals([[math.log(0.5), math.log(0.9), -200.0]]))
    expected = [0.25, 0.09, math.exp(-50) * (1 - math.exp(-50))]
    assert u[0].tolist() == pytest.approx(expected, rel=1e-12)


def test_shannon_entropy_reads_the_engines_entropy_clipped_at_50():
    # H = [1.2, 70] → [1.2, 50]; the logprobs play no part
    u = token_uncertainty("shannon_entropy", _signals([[-3.0, -4.0]], entropies=[[1.2, 70.0]]))
    assert u.tolist() == [[1.2, 50.0]]


def test_shannon_entropy_without_entropies_fails_clearly():
    with pytest.raises(ValueError, match="entropy_PG_T"):
        token_uncertainty("shannon_entropy", _signals([[-1.0]]))


def test_padding_is_zero_whatever_it_holds():
    signals = _signals([[-1.0, -2.0], [-3.0]])
    garbage = signals.logprobs_PG_T.clone()
    garbage[1, 1] = float("nan")
    entropies = torch.full_like(garbage, float("inf"))
    for kind in UNCERTAINTY_KINDS:
        s = TokenSignals(garbage, signals.mask_PG_T, 1, 0, 0.0, entropy_PG_T=entropies)
        assert token_uncertainty(kind, s)[1, 1].item() == 0.0


def test_unknown_signal_fails_naming_value_and_allowed():
    with pytest.raises(ValueError, match=r"'varentropy'.*surprisal.*predictive_variance.*shannon_entropy"):
        check_uncertainty("varentropy")
    with pytest.raises(ValueError, match="'nll'"):  # retrain's aliases are not accepted
        GTPO(beta=0.1, uncertainty="nll")


def test_entropy_is_required_exactly_for_the_shannon_signal():
    assert GTPO.needs({"beta": 0.1, "uncertainty": "shannon_entropy"}).requires == {
        "entropy": "transform.uncertainty=shannon_entropy"}
    assert GTPO.needs({"beta": 0.1, "uncertainty": "surprisal"}).requires == {}


def test_float32_stays_float32():
    s = _signals([[-1.0]])
    s32 = TokenSignals(s.logprobs_PG_T.float(), s.mask_PG_T, 1, 0, 0.0)
    for kind in ("surprisal", "predictive_variance"):
        assert token_uncertainty(kind, s32).dtype == torch.float32
