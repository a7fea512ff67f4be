"""reward=reasoning_gym: the task's own score_answer on the answer extracted from a completion (tag or whole
completion), parse failures and grading errors counted, and the run's check refusing it without data=reasoning_gym
before anything is imported."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from composing import compose_config  # noqa: E402
from rlvr.config_check import check  # noqa: E402
from rlvr.data.reasoning_gym import EntryKey, ReasoningGym  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.reward.reasoning_gym import ReasoningGymScore  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example():
    """One chain_sum example whose answer has 3 digits (chain_sum scores with compute_decimal_reward)."""
    three_digits = dict(min_terms=2, max_terms=2, min_digits=3, max_digits=3)
    data = ReasoningGym(seed=0, task="chain_sum", config={"chain_sum": three_digits}, size=50, eval_size=1,
                        eval_seed=0, prompt_template="{question}", shuffle=True, demonstrations=None)
    return next(e for e in data.batch(0, 50) if len(EntryKey.parse(e.reference).answer) == 3)


def test_whole_completion_right_wrong_partial_and_unparsable(example):
    answer = EntryKey.parse(example.reference).answer  # e.g. "345"
    completions = [answer, f" {answer}\n", f"+0{answer}.00", f"{answer}0", "7", "", "   "]
    scores = ReasoningGymScore("completion").score(completions, [example.reference] * len(completions))
    # exact → 1; whitespace stripped → 1; "+0345.00": Decimal equal → 1;
    # "3450": not equal, the answer is a substring → len("345") / len("3450") = 3/4; "7" → 0;
    # "" and "   " have nothing to parse → 0, two parse failures
    assert scores.values == [1.0, 1.0, 1.0, 0.75, 0.0, 0.0, 0.0]
    assert (scores.parse_failures, scores.errors, scores.timeouts) == (2, 0, 0)


def test_the_last_answer_tag(example):
    answer = EntryKey.parse(example.reference).answer
    completions = [
        f"<think>a guess: 1</think><answer>{answer}</answer>",
        f"<answer>1</answer> no wait <answer> {answer} </answer>",  # the last tag, stripped
        f"<answer>1{answer}</answer>",  # "1345": the answer is a substring → 3/4
        answer,  # no tag: nothing to parse
        "<answer></answer>",  # an empty tag: nothing to parse
    ]
    scores = ReasoningGymScore("tag").score(completions, [example.reference] * len(completions))
    assert scores.values == [1.0, 1.0, 0.75, 0.0, 0.0]
    assert (scores.parse_failures, scores.errors) == (2, 0)


def test_a_reference_that_names_no_entry_or_another_answer_is_an_error(example):
    key = EntryKey.parse(example.reference)
    moved = dataclasses.replace(key, answer="-1").reference()  # regenerates an entry whose answer is not -1
    scores = ReasoningGymScore("completion").score([key.answer, key.answer, key.answer],
                                                   ["42", moved, example.reference])
    assert scores.values == [0.0, 0.0, 1.0] and (scores.errors, scores.parse_failures) == (2, 0)


def test_completions_and_references_must_pair_up(example):
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        ReasoningGymScore("completion").score(["1", "2"], [example.reference])


def test_an_unknown_extract_names_the_key():
    with pytest.raises(ValueError, match=r"reward.extract='boxed': expected tag or completion"):
        ReasoningGymScore("boxed")


def test_the_check_refuses_it_with_another_data_source():
    with pytest.raises(ConfigError) as err:
        check(compose_config(["reward=reasoning_gym"]))  # data=arithmetic
    assert ("  reward <rlvr.reward.reasoning_gym.ReasoningGymScore> needs references that name each example's "
            "reasoning-gym entry (reward=reasoning_gym scores with the task's own score_answer, which reads each "
            "example's entry), which no chosen component gives: choose data=reasoning_gym"
            ) in str(err.value).splitlines()
    check(compose_config(["data=reasoning_gym", "reward=reasoning_gym"]))


def test_the_refusal_comes_before_reasoning_gym_or_torch_is_imported(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run([sys.executable, "train.py", "reward=reasoning_gym", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "which no chosen component gives: choose data=reasoning_gym" in proc.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & {"reasoning_gym", "torch", "transformers"}
