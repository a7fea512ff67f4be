"""trainer.dynamic_sampling on hand-made steps: which groups a step keeps, how many rounds it draws, in which order,
and what its row says (rlvr/rollout/dynamic_sampling.py)."""

import pytest
import torch

from rlvr.rollout.dynamic_sampling import DynamicSampling
from rlvr.types import Example, Rollouts, Scores, StepBatch

G, PAD = 2, 0


def batch(rewards_P_G: list[list[float]], lengths: list[int], start: int) -> tuple[StepBatch, list[Example]]:
    """P groups of G rows; row r of the step holds tokens start+r+1 (so a row is recognisable), `lengths[r]` long."""
    P, T = len(rewards_P_G), max(lengths)
    tokens = torch.full((P * G, T), PAD)
    mask = torch.zeros(P * G, T, dtype=torch.bool)
    for r, n in enumerate(lengths):
        tokens[r, :n], mask[r, :n] = start * G + r + 1, True
    rollouts = Rollouts(prompt_ids_P=[[start + p] for p in range(P)], group_size=G, tokens_PG_T=tokens,
                        logprobs_PG_T=torch.where(mask, -1.0, 0.0), mask_PG_T=mask,
                        finished_PG=torch.tensor([n < T for n in lengths]), temperature=1.0)
    values = [v for group in rewards_P_G for v in group]
    step = StepBatch(rollouts=rollouts, rewards_P_G=torch.tensor(rewards_P_G),
                     completions=[f"c{start * G + r}" for r in range(P * G)], scores=Scores(values=values, errors=1),
                     metrics={"reward/error_frac": 1 / len(values)}, failures={}, what="completions", check="",
                     sample_seconds=1.0, score_seconds=0.5)
    return step, [Example(f"q{start + p}", "") for p in range(P)]


# The data stream: prompts 0, 1, 2, … Their rewards ([1, 1] and [0, 0] tie, [1, 0] differs):
STREAM = [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.5, 0.0], [0.0, 0.0]]


def drawn_from(position: int, calls: list[int]):
    """`more(n)`: the stream's next n prompts from `position` on, rows 3 tokens long up to prompt 5, then 4."""
    at = [position]

    def more(n: int):
        calls.append(n)
        out = batch(STREAM[at[0]: at[0] + n], [3 + (at[0] > 3)] * (n * G), at[0])
        at[0] += n
        return out

    return more


def test_off_leaves_the_step_as_drawn():
    first = batch(STREAM[:3], [3] * 6, 0)
    calls: list[int] = []
    kept, examples, fields = DynamicSampling("off").collect(*first, drawn_from(3, calls), PAD)
    assert kept is first[0] and examples == first[1] and fields == {} and calls == []


def test_filter_drops_the_tied_groups_and_draws_nothing_more():
    calls: list[int] = []
    kept, examples, fields = DynamicSampling("filter").collect(*batch(STREAM[:3], [3] * 6, 0), drawn_from(3, calls),
                                                               PAD)
    # prompts 0 [1, 1] and 2 [0, 0] tie: prompt 1 alone stays, its rows 2 and 3
    assert calls == [] and [e.prompt for e in examples] == ["q1"]
    assert kept.rewards_P_G.tolist() == [[1.0, 0.0]] and kept.completions == ["c2", "c3"]
    assert kept.rollouts.tokens_PG_T[:, 0].tolist() == [3, 4] and kept.scores.values == [1.0, 0.0]
    assert fields == {"dynamic/sample_batches": 1.0, "dynamic/prompts": 3.0, "dynamic/tied_groups": 2.0,
                      "dynamic/kept_groups": 1.0, "dynamic/sampled_completion_tokens": 18.0}


def test_refill_draws_rounds_until_the_step_holds_batch_size_differing_groups_in_stream_order():
    calls: list[int] = []
    kept, examples, fields = DynamicSampling("refill").collect(*batch(STREAM[:3], [3] * 6, 0), drawn_from(3, calls),
                                                               PAD)
    # round 1: prompts 0-2, prompt 1 differs; round 2: prompts 3-5, prompt 4 differs; round 3: 6-8, 6 and 7 differ:
    # 4 differing ≥ 3, the first three in stream order are kept and prompt 7 is dropped with the round's rest
    assert calls == [3, 3]
    assert [e.prompt for e in examples] == ["q1", "q4", "q6"]
    assert kept.rewards_P_G.tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    assert kept.completions == ["c2", "c3", "c8", "c9", "c12", "c13"]
    # rows of rounds 1 and 2 are 3 tokens, round 3's 4: the kept step is padded to 4 with the pad id, unmasked
    assert kept.rollouts.tokens_PG_T.tolist()[:2] == [[3, 3, 3, PAD], [4, 4, 4, PAD]]
    assert kept.rollouts.mask_PG_T.sum(-1).tolist() == [3, 3, 3, 3, 4, 4]
    assert kept.rollouts.prompt_ids_P == [[1], [4], [6]]
    # three rounds' seconds and failure counts summed; their error fraction over all 18 rows
    assert (kept.sample_seconds, kept.score_seconds, kept.scores.errors) == (3.0, 1.5, 3)
    assert kept.metrics["reward/error_frac"] == pytest.approx(3 / 18)
    assert fields == {"dynamic/sample_batches": 3.0, "dynamic/prompts": 9.0, "dynamic/tied_groups": 5.0,
                      "dynamic/kept_groups": 3.0, "dynamic/sampled_completion_tokens": 12 * 3 + 6 * 4.0}


def test_refill_stops_after_max_sample_batches_and_trains_what_it_holds():
    calls: list[int] = []
    kept, examples, fields = DynamicSampling("refill", max_sample_batches=2).collect(
        *batch(STREAM[:3], [3] * 6, 0), drawn_from(3, calls), PAD)
    assert calls == [3] and [e.prompt for e in examples] == ["q1", "q4"]
    assert fields["dynamic/sample_batches"] == 2.0 and fields["dynamic/kept_groups"] == 2.0


def test_a_step_where_every_group_ties_is_returned_as_drawn_and_trains_nothing():
    first = batch([[0.0, 0.0], [1.0, 1.0]], [3] * 4, 0)
    kept, examples, fields = DynamicSampling("filter").collect(*first, drawn_from(2, []), PAD)
    assert kept is first[0] and fields["dynamic/kept_groups"] == 0.0 and fields["dynamic/tied_groups"] == 2.0


@pytest.mark.parametrize(("mode", "rounds", "message"), [("replace", 10, "must be one of off, filter, refill"),
                                                         ("refill", 0, "max_sample_batches=0 must be >= 1")])
def test_bad_settings_name_the_key(mode, rounds, message):
    with pytest.raises(ValueError, match=message):
        DynamicSampling(mode, rounds)
