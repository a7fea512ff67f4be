import json
from pathlib import Path

import pytest

from rlvr.data.gsm8k import GSM8K, final_answer

ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 more than $34. Price?", "answer": "1200 + 34 = 1234\n#### 1,234"},
    {"question": "No final line here", "answer": "the answer is 5"},
    {"question": "Owes 3 dollars?", "answer": "#### -3 "},
]


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make(tmp_path: Path, **kw) -> GSM8K:
    args = dict(seed=0, path=write(tmp_path / "train.jsonl", ROWS), split="train",
                eval_path=write(tmp_path / "test.jsonl", ROWS), eval_split="test", eval_size=0, max_examples=0,
                prompt_template="{question}\nPut your final answer within \\boxed{{}}.", shuffle=True)
    return GSM8K(**(args | kw))


@pytest.mark.parametrize("answer,expected", [("x\n#### 7", "7"), ("#### 1,234", "1234"), ("#### -3 ", "-3"),
                                             ("no marker", ""), ("#### 1\n#### 2", "2")])
def test_final_answer(answer, expected):
    assert final_answer(answer) == expected


def test_rows_become_prompts_with_the_final_number(tmp_path):
    source = make(tmp_path)
    refs = sorted(e.reference for e in source.eval_examples())
    assert refs == ["-3", "1234", "7"]  # the row without '####' is dropped
    prompt = next(e.prompt for e in source.eval_examples() if e.reference == "7")
    assert prompt == "Tom has 3 apples and buys 4. How many?\nPut your final answer within \\boxed{}."
    assert {e.reference for step in range(3) for e in source.batch(step, 1)} == {"-3", "1234", "7"}


def test_missing_column_and_missing_file_name_the_key(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="data.path"):
        make(tmp_path, path=str(bad))
    with pytest.raises(FileNotFoundError, match="data.eval_path"):
        make(tmp_path, eval_path=str(tmp_path / "nope.jsonl"))


def test_a_template_without_its_field_is_refused(tmp_path):
    with pytest.raises(ValueError, match="question"):
        make(tmp_path, prompt_template="{problem}")
