import json
import logging
import re
from pathlib import Path

import pytest

from rlvr.data.jsonl import JSONL
from rlvr.types import Example


def write_jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def make(tmp_path: Path, rows: list[object], eval_rows: list[object] | None = None, **kw: object) -> JSONL:
    args: dict[str, object] = dict(
        seed=0,
        path=write_jsonl(tmp_path / "train.jsonl", rows),
        eval_path=None if eval_rows is None else write_jsonl(tmp_path / "eval.jsonl", eval_rows),
        prompt_key="prompt",
        reference_key="reference",
        eval_size=500,
        prompt_template="{prompt}",
        shuffle=True,
    )
    return JSONL(**(args | kw))  # type: ignore[arg-type]


ROWS = [{"prompt": f"{i}+{i}=", "reference": str(2 * i)} for i in range(10)]


def test_batches_follow_the_seeded_order(tmp_path: Path) -> None:
    source = make(tmp_path, ROWS, seed=3)
    # One epoch in 5 steps of 2 sees every row once.
    seen = [e for step in range(5) for e in source.batch(step, 2)]
    assert sorted(seen, key=lambda e: int(e.reference)) == [Example(**r) for r in ROWS]
    assert source.batch(1, 2) == make(tmp_path, ROWS, seed=3).batch(1, 2)
    assert source.batch(0, 10) != make(tmp_path, ROWS, seed=4).batch(0, 10)
    assert source.demonstrations() == []


def test_keys_template_and_integer_references(tmp_path: Path) -> None:
    rows = [{"q": "What is 6*7?", "a": 42, "extra": None}]
    source = make(tmp_path, rows, prompt_key="q", reference_key="a", prompt_template="Q: {prompt}\nA:")
    assert source.batch(0, 1) == [Example("Q: What is 6*7?\nA:", "42")]


def test_held_out_set_is_fixed_and_independent_of_seed(tmp_path: Path) -> None:
    eval_rows = [{"prompt": f"e{i}", "reference": str(i)} for i in range(20)]
    held = make(tmp_path, ROWS, eval_rows, eval_size=5, seed=0).eval_examples()
    assert len(held) == 5
    assert held == make(tmp_path, ROWS, eval_rows, eval_size=5, seed=99).eval_examples()
    assert [int(e.reference) for e in held] == sorted(int(e.reference) for e in held)  # source order kept
    assert len(make(tmp_path, ROWS, eval_rows, eval_size=0).eval_examples()) == 20  # 0 = all
    assert len(make(tmp_path, ROWS, eval_rows, eval_size=500).eval_examples()) == 20
    assert make(tmp_path, ROWS).eval_examples() == []  # no eval_path, no held-out set


def test_empty_references_are_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [*ROWS[:3], {"prompt": "p", "reference": ""}, {"prompt": "q", "reference": "  "}]
    with caplog.at_level(logging.WARNING):
        source = make(tmp_path, rows)
    assert len(source.batch(0, 3)) == 3 and all(e.reference for e in source.batch(0, 6))
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        f"data.path={str(tmp_path / 'train.jsonl')!r}: dropped 2 of 5 rows with an empty 'reference'"
    ]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('\n{"prompt": "a", "reference": "1"}\n\n', encoding="utf-8")
    source = JSONL(0, str(path), None, "prompt", "reference", 0, "{prompt}", True)
    assert source.batch(0, 1) == [Example("a", "1")]


def test_missing_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data\.path='.*nope\.jsonl': no such file"):
        JSONL(0, str(tmp_path / "nope.jsonl"), None, "prompt", "reference", 0, "{prompt}", True)
    with pytest.raises(FileNotFoundError, match=r"data\.eval_path="):
        make(tmp_path, ROWS, eval_path=str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a", "reference": "1"}', "{not json"], r"line 2: not valid JSON"),
        (['{"prompt": "a", "reference": "1"}', "", "[1, 2]"], r"line 3: expected a JSON object, got list"),
        (['{"prompt": "a"}'], r"line 1: missing key\(s\) \['reference'\]"),
        (['{"prompt": 1, "reference": "1"}'], r"line 1: expected a string 'prompt'"),
        (['{"prompt": "a", "reference": true}'], r"line 1: .*got str and bool"),
        (['{"prompt": "a", "reference": 0.5}'], r"line 1: .*got str and float"),
    ],
)
def test_bad_rows_name_key_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"data.path='{path}' ") + message):
        JSONL(0, str(path), None, "prompt", "reference", 0, "{prompt}", True)


def test_empty_after_filtering_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.path=.*no rows with a non-empty 'reference'"):
        make(tmp_path, [{"prompt": "a", "reference": ""}])
    with pytest.raises(ValueError, match=r"data\.eval_path=.*no rows"):
        make(tmp_path, ROWS, [])


@pytest.mark.parametrize("template", ["no field", "{problem}", "{prompt} {0}"])
def test_bad_template_names_the_key(tmp_path: Path, template: str) -> None:
    with pytest.raises(ValueError, match=r"data\.prompt_template="):
        make(tmp_path, ROWS, prompt_template=template)


def test_demonstrations_file_goes_through_the_prompt_template(tmp_path: Path) -> None:
    demos = write_jsonl(tmp_path / "demos.jsonl", [{"prompt": "2+2", "completion": "4"},
                                                   {"prompt": "3+4", "completion": "7", "note": "extra keys are fine"}])
    source = make(tmp_path, ROWS, prompt_template="Q: {prompt}=", demonstrations_path=demos)
    assert [(d.prompt, d.completion) for d in source.demonstrations()] == [("Q: 2+2=", "4"), ("Q: 3+4=", "7")]


@pytest.mark.parametrize("row, expected", [
    ({"prompt": "2+2"}, "missing key(s) ['completion']"),
    ({"prompt": "2+2", "completion": ""}, "non-empty string 'completion'"),
    ({"prompt": 5, "completion": "4"}, "expected a string 'prompt'"),
])
def test_a_bad_demonstrations_file_names_the_key_and_line(tmp_path: Path, row, expected) -> None:
    demos = write_jsonl(tmp_path / "demos.jsonl", [{"prompt": "1+1", "completion": "2"}, row])
    with pytest.raises(ValueError) as err:
        make(tmp_path, ROWS, demonstrations_path=demos)
    assert f"data.demonstrations_path={demos!r} line 2" in str(err.value) and expected in str(err.value)
