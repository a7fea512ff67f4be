"""Partial rollouts (trainer.partial_rollouts, rlvr/rollout/partial.py): a row's tokens do not depend on where its
sampling was cut; a run repeats bit for bit; every trained token is at most k updates old; what cannot be combined
with them is refused at start. (A run killed and continued: tests/test_resume.py, variant `partial`.)"""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from composing import MIXED, OVERLAP, compose_config
from rlvr.config_check import config_problems
from rlvr.distributed import ONE_PROCESS
from rlvr.engine import pytorch as pytorch_engine
from rlvr.engine.pytorch import PyTorchEngine, buckets
from rlvr.model.tiny import TinyLlama
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.overlap import Job
from rlvr.rollout.partial import Group, Partial, PartialRollouts
from rlvr.types import Example, SamplingParams, Segment

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
BASE = [f"trainer.max_steps={STEPS}", "trainer.eval_every=0", "trainer.log_every=1", "data.eval_size=16", "threads=1",
        *MIXED, *OVERLAP, "trainer.partial_rollouts=true", "trainer.sampling.max_tokens=20", "trainer.group_size=2"]
"""The untrained policy (no warm-up) samples an EOS one time in ~15: groups of 2 end anywhere in 20 tokens, the
lengths of a long tail."""


def engine_and_prompts(tokenizer_too=False):
    cfg = compose_config([]).model
    module, tokenizer = TinyLlama(**{k: v for k, v in cfg.items() if k not in {"_target_", "lora"}},
                                  lora=None).load(seed=0)
    engine = PyTorchEngine(module, [tokenizer.eos_token_id], tokenizer.pad_token_id, max_batch_rows=64,
                           merge_lora=False)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("12+34=", "56+07=", "99+99=")]
    return (engine, prompts, tokenizer) if tokenizer_too else (engine, prompts)


def segment(prompts, tokens, need, forced, rows=(0, 1, 2), lengths=(4, 8, 12), quotas=None):
    """Rows `rows` (each prompt's one row, a group of one) continued from `tokens`; row n ends at `lengths[n]`
    tokens if not at an EOS before (the untrained model seldom samples one). A forced row must end (its quota is
    its budget); `quotas`, when given, are the rows' own."""
    budgets = [lengths[n] - len(tokens[n]) for n in rows]
    return Segment(contexts=[prompts[n] + tokens[n] for n in rows], budgets=budgets,
                   offsets=[len(tokens[n]) for n in rows], seeds=[(11, 22, 33)[n] for n in rows],
                   groups=list(range(len(rows))), need=need,
                   quotas=quotas or [b if f else 0 for b, f in zip(budgets, forced, strict=True)],
                   params=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max(lengths)))


def test_a_rows_tokens_do_not_depend_on_where_its_sampling_was_cut():
    engine, prompts = engine_and_prompts()
    whole = engine.continue_rows(segment(prompts, [[], [], []], need=3, forced=[True] * 3))
    first = engine.continue_rows(segment(prompts, [[], [], []], need=1, forced=[False] * 3))  # ends at the 1st done
    assert first.ended == [True, False, False] and [len(t) for t in first.tokens] == [4, 4, 4]  # cut mid-way
    rest = engine.continue_rows(segment(prompts, first.tokens, need=2, forced=[True] * 2, rows=(1, 2)))
    assert [len(t) for t in rest.tokens] == [4, 8] and rest.ended == [True, True]
    for n, tail in ((0, []), (1, rest.tokens[0]), (2, rest.tokens[1])):  # the rest's keys and values came from a
        assert first.tokens[n] + tail == whole.tokens[n]                  # prefill: the same draws, log-probs ~equal
    assert first.logprobs[2] + rest.logprobs[1] == pytest.approx(whole.logprobs[2], abs=1e-5)
    nothing = engine.continue_rows(segment(prompts, first.tokens, need=0, forced=[False] * 2, rows=(1, 2)))
    assert nothing.tokens == [[], []]  # enough groups were complete already: no decoding at all


def test_a_segment_goes_on_until_every_row_has_sampled_its_quota():
    engine, prompts = engine_and_prompts()
    cut = engine.continue_rows(segment(prompts, [[], [], []], need=1, forced=[False] * 3, quotas=[0, 6, 3]))
    # row 0 ends at its 4 tokens (a group complete: `need` met), but row 1 must sample 6; row 2 decodes beside it
    assert cut.ended == [True, False, False] and [len(t) for t in cut.tokens] == [4, 6, 6]


def test_a_prefill_is_cut_into_buckets_of_like_length_where_padding_costs_more_than_a_pass():
    # 64 rows of 5 tokens and 8 of 26, a pass worth 64 positions: one batch pads every row to 26,
    # 64 + 72·26 = 1936 positions; two buckets cost 64 + 64·5 + 64 + 8·26 = 656. Rows of 5 and 6 tokens stay
    # together: 64 + 2·6 = 76 against 64 + 5 + 64 + 6 = 139.
    assert [len(b) for b in buckets([26] * 8 + [5] * 64, call=64)] == [64, 8]
    assert buckets([26] * 8 + [5] * 64, call=64)[1] == list(range(8))  # indices into the lengths, shortest first
    assert buckets([6, 5], call=64) == [[1, 0]]
    assert buckets([5, 40, 6, 39, 41], call=10) == [[0, 2], [3, 1, 4]]  # 10 + 2·6 + 10 + 3·41 = 155, the fewest
    assert buckets([], call=64) == []


@pytest.mark.parametrize("call", [None, 0])
def test_each_row_continues_as_it_would_alone_whatever_else_is_prefilled_beside_it(call, monkeypatch):
    # rows of unlike lengths (a prompt alone, cut after 9 and after 2 tokens) and a copy of the first: the prefill
    # feeds the copies once and cuts the rest into buckets (at call = 0 a bucket per length: three, whose caches are
    # joined), and each row must finish as it does in a segment of its own (the same draws: noise per row), its
    # log-probabilities equal up to float summation order
    if call is not None:
        monkeypatch.setattr(pytorch_engine, "buckets", lambda lengths: buckets(lengths, call=call))
    engine, prompts = engine_and_prompts()
    first = engine.continue_rows(segment(prompts, [[], [], []], need=3, forced=[True] * 3, lengths=(9, 9, 9)))
    contexts = [[], first.tokens[1], first.tokens[2][:2], []]
    rows = [prompts[0], prompts[1], prompts[2], prompts[0]]
    budgets = [12 - len(t) for t in contexts]
    seeds = [11, 22, 33, 11]

    def alone(n):
        return Segment(contexts=[rows[n] + contexts[n]], budgets=[budgets[n]], offsets=[len(contexts[n])],
                       seeds=[seeds[n]], groups=[0], quotas=[budgets[n]], need=0,
                       params=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=12))

    together = engine.continue_rows(Segment(
        contexts=[r + c for r, c in zip(rows, contexts, strict=True)], budgets=budgets,
        offsets=[len(c) for c in contexts], seeds=seeds, groups=[0, 1, 2, 3], quotas=budgets, need=0,
        params=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=12)))
    assert len({len(r + c) for r, c in zip(rows, contexts, strict=True)}) == 3
    for n in range(4):
        own = engine.continue_rows(alone(n))
        assert together.tokens[n] == own.tokens[0] and together.ended[n] == own.ended[0]
        assert together.logprobs[n] == pytest.approx(own.logprobs[0], abs=1e-5)
    assert together.tokens[0] == together.tokens[3]


def test_a_rows_quota_shares_max_tokens_over_its_jobs():
    # k = 4, max_tokens 27. Batch 5 is admitted by job 5 − 4 + 1 = 2 and due at job 5: four jobs, so by the end of
    # jobs 2, 3, 4, 5 a row holds at least ⌈27·1/4⌉ = 7, ⌈27·2/4⌉ = 14, ⌈27·3/4⌉ = 21 tokens, then all 27.
    # Batch 1 is admitted by job 0 (the first admits batches 0 … 3) and due at job 1: ⌈27/2⌉ = 14, then 27.
    rollout = SimpleNamespace(world=ONE_PROCESS)
    pool = PartialRollouts(rollout, batch_size=1, group_size=1, sampling=SamplingParams(1.0, 1.0, 27), k=4)
    five, one = (Group(b, Example("1+1=", "2"), [1], [0], [[0] * n], [], [], [], [False], [False]) for b, n in
                 ((5, 0), (1, 0)))
    assert [pool.quota(five, 0, job) for job in (2, 3, 4, 5)] == [7, 14, 21, 27]
    five.tokens = [[0] * 9]  # 9 so far: 14 − 9 = 5 more by the end of job 3; the rest, 18, at job 5
    assert [pool.quota(five, 0, job) for job in (3, 5)] == [5, 18]
    five.tokens = [[0] * 16]
    assert pool.quota(five, 0, 3) == 0  # ahead of its share: nothing this job
    assert [pool.quota(one, 0, job) for job in (0, 1)] == [14, 27]


def test_groups_unfinished_at_an_update_go_on_under_the_next_version():
    # batch_size 1, groups of 2, k = 2, at most 12 tokens. Job 1 (sampled by version 0) finds batch 0's group with
    # 10 tokens a row (due now: its quota is the rest, 2) and admits batch 2's (admitted at job 1, due at job 2: a
    # quota of ⌈12 · 1/2⌉ = 6 tokens now). The untrained model seldom samples an EOS, so batch 0's rows end at 12
    # tokens, 2 decoding steps later, and the job ends when batch 2's rows have 6 (1 group complete, every quota
    # sampled). Job 2 (version 1) finds batch 2's group due: its rows go on to 12.
    engine, _, tokenizer = engine_and_prompts(tokenizer_too=True)
    rollout = SimpleNamespace(engine=engine, tokenizer=tokenizer, seeds=SimpleNamespace(sampler=7), world=ONE_PROCESS,
                              with_entropy=False)
    pool = PartialRollouts(rollout, batch_size=1, group_size=2, sampling=SamplingParams(1.0, 1.0, 12), k=2)
    head = pool._admit(0, [Example("12+34=", "46")], 0)[0]
    head.tokens, head.logprobs, head.versions = ([[v] * 10 for _ in range(2)] for v in (4, -1.0, 0))
    pool.pool, pool.admitted = [head], 2  # as job 0 left it (batches 0 and 1 admitted, batch 1 trained)

    def job(step, version):
        made = Job(step, version, pool.admissions(step, 10, lambda i: ([Example(f"{i}0+00=", f"{i}0")], i)))
        made.sampled = pool.sample(made)
        return made

    first = job(1, 0)
    examples, fields = first.partial.gathered(ONE_PROCESS, 1)
    assert [e.reference for e in examples] == ["46"] and first.sampled.rows.rollouts.mask_PG_T.sum() == 24
    assert fields["async/partial_frac"] == 0.0 and fields["async/staleness_max"] == 1.0
    left = first.partial.pool
    assert [g.batch for g in left] == [2] and [len(t) for t in left[0].tokens] == [6, 6] and not left[0].complete
    second = job(2, 1)
    assert [e.reference for e in second.partial.examples] == ["20"]
    assert second.partial.pool == [] or all(g.batch == 3 for g in second.partial.pool)
    _, fields = second.partial.gathered(ONE_PROCESS, 2)  # 2 rows × (6 tokens of version 0 + 6 of version 1)
    assert fields["async/partial_frac"] == 1.0 and fields["async/version_spread_max"] == 1.0
    assert fields["async/staleness_max"] == 2.0 and fields["async/policy_version"] == 0.0
    assert fields["async/staleness_frac/2"] == pytest.approx(12 / 24) and fields["async/staleness_mean"] == (
        pytest.approx((12 * 2 + 12 * 1) / 24))


def test_a_job_pickled_before_its_fields_were_gathered_still_reports_them():
    """A checkpoint's pending job from before `Partial.gathered` (its row fields worked out in the sampler, one
    process) continues with the fields it holds."""
    old = object.__new__(Partial)
    vars(old).update(examples=[Example("1+1=", "2")], fields={"async/partial_frac": 0.5}, pool=[], admitted=3)
    assert old.gathered(ONE_PROCESS, 4) == ([Example("1+1=", "2")], {"async/partial_frac": 0.5})


def train(run_dir, overrides):
    proc = subprocess.run([sys.executable, "train.py", *BASE, *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("partial")
    rows = {name: train(tmp / name, [f"trainer.off_policy_steps={k}"])
            for name, k in (("k2", 2), ("k2_again", 2), ("k1", 1), ("k4", 4))}
    train(tmp / "k4_longer", ["trainer.off_policy_steps=4", f"trainer.max_steps={STEPS // 2}"])
    rows["k4_longer"] = train(tmp / "k4_longer", ["trainer.off_policy_steps=4"])  # continued to STEPS steps
    return {**rows, "folders": tmp}


def test_a_run_repeats_bit_for_bit(runs):
    def comparable(rows):
        return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows]

    assert comparable(runs["k2"]) == comparable(runs["k2_again"])
    # a finished run continued with more steps (trainer.max_steps may change on a resume) admits the batches its
    # shorter self did not and keeps the bound. Its rows are not the longer run's: a run admits no batch past its
    # last step, so the shorter one's last jobs decoded fewer groups
    longer = runs["k4_longer"]
    assert [r["step"] for r in longer] == list(range(STEPS)) and all(r["num_datums"] == 16 for r in longer)
    assert all(r["async/staleness_max"] <= 4 for r in longer)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_trained_token_is_at_most_k_updates_old(runs, k):
    rows = runs[f"k{k}"]
    assert [r["step"] for r in rows] == list(range(STEPS)) and all(r["num_datums"] == 16 for r in rows)
    assert all(r["async/staleness_max"] <= min(k, r["step"]) for r in rows)
    assert all(r["step"] - r["async/policy_version"] == r["async/staleness_max"] for r in rows)
    assert all(sum(r[f"async/staleness_frac/{d}"] for d in range(k + 1)) == pytest.approx(1.0) for r in rows)
    assert all(r["async/version_spread_max"] <= r["async/staleness_max"] for r in rows)
    if k == 1:  # every group is due at once: none is carried over an update
        assert {r["async/partial_frac"] for r in rows} == {0.0}
        assert all(r["async/staleness_max"] == min(1, r["step"]) for r in rows)


def test_rlvr_plot_draws_the_rows_of_partial_rollouts(runs, tmp_path):
    from rlvr.cli.plot import run as plot

    written = plot(runs["folders"], ["async/partial_frac", "async/staleness_frac/2"], tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["plot_async_partial_frac.png",
                                                                "plot_async_staleness_frac_2.png"], written


@pytest.mark.parametrize("overrides, message", [
    (["trainer.off_policy_steps=0"], "set trainer.off_policy_steps=k >= 1 (the staleness bound)"),
    (["trainer.off_policy_steps=2", "trainer.off_policy_mode=bounded"], "trainer.off_policy_mode=fixed only"),
    (["trainer.off_policy_steps=2", "trainer.partial_rollouts=yes"], "trainer.partial_rollouts='yes' must be bool"),
    (["trainer.off_policy_steps=1", "env=guess"], "with an env set trainer.partial_rollouts=false"),
    (["trainer.off_policy_steps=1", "engine=max"], "needs sequences continued under new weights"),
])
def test_what_partial_rollouts_cannot_do_is_refused_naming_the_setting(overrides, message):
    _, errors = config_problems(compose_config([*OVERLAP, "trainer.partial_rollouts=true", *overrides]),
                                at_start=False)
    assert any(message in e for e in errors), errors
