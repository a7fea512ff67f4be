"""trainer.eval_samples=4 on a real tiny run (one RL step, 16 held-out prompts): the evaluation rows carry avg@4 and
pass@1 ≤ pass@2 ≤ pass@4, the same numbers twice, and `rlvr eval` of the checkpoint gives them again (with maj@4
once the reward reads answers); single-turn and episodes alike. Greedy rows stay as they were
(tests/test_multiturn_run.py compares them with a stored fixture). An evaluation streamed in parts
(trainer.eval_rows) gives the row of one unsplit evaluation, and trainer.final_eval_samples sets the last one's k."""

import json
from types import SimpleNamespace

import pytest

from composing import FAST, MIXED, compose_config
from rlvr.cli.eval_checkpoint import output_name
from rlvr.cli.main import main
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run
from rlvr.telemetry import eval_line

SAMPLED = FAST + MIXED + ["trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=2", "data.eval_size=16",
                          "trainer.eval_samples=4", "trainer.eval_temperature=1.0"]
KEYS = {"eval/accuracy", "eval/mean_reward", "eval/mean_completion_length", "eval/examples", "eval/avg@4",
        "eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/reward_timeout_frac", "eval/reward_error_frac",
        "eval/reward_parse_fail_frac", "eval_time_s", "step"}


def eval_rows(folder) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/accuracy" in r]


def numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in NONDETERMINISTIC_KEYS}


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sampled") / "run"
    run(compose_config(SAMPLED), folder)
    return SimpleNamespace(path=folder, evals=eval_rows(folder))


def test_sampled_rows_carry_pass_at_k_and_avg_at_k(sampled_run):
    before, after = sampled_run.evals  # at the start and after the one step
    for row in (before, after):
        assert set(row) == KEYS  # reward=function reads no answers: no maj@4
        assert row["eval/examples"] == 16
        assert row["eval/pass@1"] <= row["eval/pass@2"] <= row["eval/pass@4"]
        assert row["eval/pass@1"] == pytest.approx(row["eval/avg@4"])  # 1 − C(n−c,1)/C(n,1) = c/n
        assert row["eval/accuracy"] == row["eval/avg@4"]  # the mean over all 16 × 4 samples
        assert 0 < row["eval/avg@4"] < row["eval/pass@4"] <= 1  # parity pays about half the samples
    assert "pass@4" in eval_line(after) and "16 prompts × 4 samples" in eval_line(after)


def test_rlvr_eval_repeats_the_sampled_row_and_its_samples(sampled_run, capsys):
    assert main(["eval", str(sampled_run.path)]) == 0
    out = capsys.readouterr().out
    assert "4 samples each at temperature 1" in out and "the same numbers" in out
    checkpoint = sampled_run.path / "checkpoints" / "step_1"
    record = json.loads((checkpoint / "eval.json").read_text())
    assert record["same_as_logged"] is True and numbers(record["metrics"]) == numbers(sampled_run.evals[-1])
    lines = [json.loads(line) for line in (checkpoint / "eval.completions.jsonl").read_text().splitlines()]
    assert [line["sample"] for line in lines] == [0, 1, 2, 3] * 16
    # avg@4 = the mean of the 64 samples' correctness (reward > 0.5)
    assert sum(line["reward"] > 0.5 for line in lines) / 64 == record["metrics"]["eval/avg@4"]
    # pass@4 = the examples with a correct sample among their 4
    solved = sum(any(line["reward"] > 0.5 for line in lines[4 * p:4 * p + 4]) for p in range(16))
    assert solved / 16 == record["metrics"]["eval/pass@4"]
    assert main(["eval", str(sampled_run.path)]) == 0  # the same row again
    assert numbers(json.loads((checkpoint / "eval.json").read_text())["metrics"]) == numbers(record["metrics"])


def test_an_evaluation_in_parts_gives_the_whole_ones_numbers(sampled_run):
    """trainer.eval_rows=12: the 16 examples × 4 samples in parts of 3 examples (3, 3, 3, 3, 3, 1), each reduced
    before the next is sampled. Each example keeps its seed, so the same 64 samples are drawn: every count is
    equal, and each mean is the parts' means weighted by their examples (equal up to float rounding: the mean
    completion length is a float32 mean)."""
    checkpoint = sampled_run.path / "checkpoints" / "step_1"
    assert main(["eval", str(sampled_run.path), "trainer.eval_rows=12", "--json"]) == 0
    tagged = checkpoint / f"{output_name(['trainer.eval_rows=12'])}.json"
    parts = json.loads(tagged.read_text())["metrics"]
    whole = numbers(sampled_run.evals[-1])
    assert set(parts) == set(sampled_run.evals[-1]) and parts["eval/examples"] == 16
    assert {k: pytest.approx(v, rel=1e-6) for k, v in whole.items()} == numbers(parts)
    assert round(parts["eval/avg@4"] * 64) == round(whole["eval/avg@4"] * 64)  # the same correct samples
    lines = (checkpoint / tagged.name.replace(".json", ".completions.jsonl")).read_text().splitlines()
    assert lines == (checkpoint / "eval.completions.jsonl").read_text().splitlines()  # sample for sample


def test_a_reward_that_reads_answers_adds_maj_at_k(sampled_run):
    assert main(["eval", str(sampled_run.path), "reward=exact", "--json"]) == 0
    tagged = sampled_run.path / "checkpoints" / "step_1" / f"{output_name(['reward=exact'])}.json"
    row = json.loads(tagged.read_text())["metrics"]
    assert set(row) == KEYS | {"eval/maj@4"}
    assert 0 <= row["eval/maj@4"] <= row["eval/pass@4"]  # a correct majority is a correct sample


def test_episodes_sample_k_per_game_and_the_last_evaluation_its_own_k(tmp_path):
    """One step: the start's evaluation at k = 2, the end's at trainer.final_eval_samples = 4, in parts of
    trainer.eval_rows = 12 rows (3 games × 4 episodes)."""
    run(compose_config(FAST + ["env=guess", "trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=2",
                               "data.eval_size=8", "trainer.eval_samples=2", "trainer.final_eval_samples=4",
                               "trainer.eval_rows=12", "trainer.sampling.max_tokens=2",
                               "trainer.eval_max_tokens=2"]), tmp_path)
    start, end = eval_rows(tmp_path)
    assert {"eval/avg@2", "eval/pass@1", "eval/pass@2", "eval/turns_mean"} <= start.keys()
    assert {"eval/avg@4", "eval/pass@4"} <= end.keys() and "eval/pass@2" in end and "eval/avg@2" not in end
    for row in (start, end):
        assert "eval/maj@2" not in row and row["eval/examples"] == 8
    assert start["eval/pass@1"] <= start["eval/pass@2"] and end["eval/pass@2"] <= end["eval/pass@4"]
