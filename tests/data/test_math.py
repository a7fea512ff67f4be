import json
import logging
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.data.math import MATH
from rlvr.types import Example

SPEC_SUBJECTS = [
    "intermediate_algebra",
    "precalculus",
    "number_theory",
    "counting_and_probability",
    "geometry",
]

ROWS = [
    {"problem": f"What is {i}+{i}?", "solution": f"It is $\\boxed{{{2 * i}}}$.", "level": "1"}
    for i in range(8)
]
EVAL_ROWS = [{"problem": f"Eval {i}", "solution": f"\\boxed{{\\frac{{{i}}}{{2}}}}"} for i in range(30)]


def write(path: Path, rows: list[dict]) -> str:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def make(tmp_path: Path, rows: list[dict] = ROWS, suffix: str = ".jsonl", **kw: object) -> MATH:
    args: dict[str, object] = dict(
        seed=0,
        path=write(tmp_path / f"train{suffix}", rows),
        subjects=SPEC_SUBJECTS,
        split="train",
        max_examples=0,
        eval_path=write(tmp_path / f"eval{suffix}", EVAL_ROWS),
        eval_split="test",
        eval_size=10,
        prompt_template="{problem}",
        shuffle=True,
    )
    return MATH(**(args | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_local_file_gives_raw_problem_and_boxed_reference(tmp_path: Path, suffix: str) -> None:
    source = make(tmp_path, suffix=suffix)
    seen = sorted((e for step in range(4) for e in source.batch(step, 2)), key=lambda e: int(e.reference))
    assert seen == [Example(f"What is {i}+{i}?", str(2 * i)) for i in range(8)]  # one epoch, each once
    assert source.eval_examples()[0].reference.startswith(r"\frac{")
    assert source.demonstrations() == []


def test_order_is_seeded(tmp_path: Path) -> None:
    assert make(tmp_path, seed=1).batch(2, 3) == make(tmp_path, seed=1).batch(2, 3)
    assert make(tmp_path, seed=1).batch(0, 8) != make(tmp_path, seed=2).batch(0, 8)


def test_held_out_set_is_fixed_across_seeds(tmp_path: Path) -> None:
    held = make(tmp_path, seed=0).eval_examples()
    assert len(held) == 10 and held == make(tmp_path, seed=12345).eval_examples()
    assert len(make(tmp_path, eval_size=0).eval_examples()) == 30  # 0 = all


def test_max_examples_keeps_the_first_usable_rows(tmp_path: Path) -> None:
    rows = [{"problem": "no answer", "solution": "none"}, *ROWS]
    source = make(tmp_path, rows, max_examples=3)
    assert sorted(e.reference for e in source.batch(0, 3)) == ["0", "2", "4"]


def test_template(tmp_path: Path) -> None:
    source = make(tmp_path, prompt_template="Solve: {problem} Put the answer in \\boxed{{}}.")
    assert source.batch(0, 1)[0].prompt.startswith("Solve: What is ")
    assert source.batch(0, 1)[0].prompt.endswith(r"Put the answer in \boxed{}.")


def test_rows_without_boxed_answer_are_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [*ROWS[:2], {"problem": "a", "solution": "no box"}, {"problem": "b", "solution": r"\boxed{}"}]
    with caplog.at_level(logging.WARNING):
        source = make(tmp_path, rows)
    assert sorted(e.reference for e in source.batch(0, 2)) == ["0", "2"]
    messages = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    where = f"data.path={str(tmp_path / 'train.jsonl')!r}"
    assert messages == [f"{where}: dropped 2 of 4 rows whose solution has no \\boxed{{}} answer"]


def test_nested_boxed_reference(tmp_path: Path) -> None:
    rows = [{"problem": "p", "solution": r"So \boxed{1} is wrong; it is $\boxed{\dfrac{\sqrt{3}}{2}}$."}]
    assert make(tmp_path, rows).batch(0, 1) == [Example("p", r"\dfrac{\sqrt{3}}{2}")]


def test_missing_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data\.path='.*missing\.parquet': no such file"):
        make(tmp_path, path=str(tmp_path / "missing.parquet"))
    with pytest.raises(FileNotFoundError, match=r"data\.eval_path='.*missing\.jsonl'"):
        make(tmp_path, eval_path=str(tmp_path / "missing.jsonl"))


def test_wrong_suffix_names_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.path='.*train\.csv': expected a \.jsonl or \.parquet file"):
        make(tmp_path, path=str(tmp_path / "train.csv"))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_missing_column_names_key_file_and_columns(tmp_path: Path, suffix: str) -> None:
    path = write(tmp_path / f"bad{suffix}", [{"problem": "p", "answer": "1"}])
    with pytest.raises(ValueError, match=re.escape(f"data.path={path!r}") + r".*missing .*\['solution'\]"):
        make(tmp_path, path=path)


def test_non_string_cell_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", [ROWS[0], {"problem": "p", "solution": 3}])
    with pytest.raises(ValueError, match=re.escape(f"data.path={path!r} line 2: expected strings")):
        make(tmp_path, path=path)


def test_empty_after_filtering_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.path=.*no rows with a \\boxed\{\} answer"):
        make(tmp_path, [{"problem": "p", "solution": "no box"}])


def test_hub_reads_subjects_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    calls = []

    def load_dataset(name: str, subject: str, split: str) -> list[dict]:
        calls.append((name, subject, split))
        return [{"problem": f"{subject} {split}", "solution": r"\boxed{1}", "type": subject}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    source = make(tmp_path, path=None, eval_path=None, subjects=["geometry", "precalculus"], eval_size=0)
    assert calls == [
        ("EleutherAI/hendrycks_math", "geometry", "train"),
        ("EleutherAI/hendrycks_math", "precalculus", "train"),
        ("EleutherAI/hendrycks_math", "geometry", "test"),
        ("EleutherAI/hendrycks_math", "precalculus", "test"),
    ]
    assert [e.prompt for e in source.eval_examples()] == ["geometry test", "precalculus test"]


def test_hub_failure_names_data_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=r"data\.path is null.*'intermediate_algebra'.*set data\.path"):
        make(tmp_path, path=None)
    with pytest.raises(RuntimeError, match=r"data\.eval_path is null"):
        make(tmp_path, eval_path=None)


def test_missing_datasets_package_names_data_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(RuntimeError, match=r"data\.path is null.*`datasets` package is missing"):
        make(tmp_path, path=None)


def test_spec_yaml_lists_the_spec_subjects_in_order() -> None:
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).parents[2] / "conf" / "data" / "math.yaml")
    assert list(conf.subjects) == SPEC_SUBJECTS
    assert conf.path is None and conf.eval_size == 500


def test_shuffle_false_keeps_the_sources_order_round_robin(tmp_path: Path) -> None:
    # the predecessor's order: rows in file order, wrapping around; the seed plays no part
    source = make(tmp_path, shuffle=False)
    n = len(source._train)
    order = [e.prompt for step in range(3) for e in source.batch(step, 2)]
    assert order == [source._train[k % n].prompt for k in range(6)]
    assert make(tmp_path, shuffle=False, seed=5).batch(1, 2) == source.batch(1, 2)
