"""data=reasoning_gym: examples generated from seeds (training from the run's data seed, the held-out set from
the fixed eval_seed, disjoint), references that regenerate their entry, the messages of a wrong task, config or
template, and one short real run with the tiny model on the default task."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from composing import FAST, compose_config  # noqa: E402
from rlvr.data.order import batch_indices  # noqa: E402
from rlvr.data.reasoning_gym import EntryKey, ReasoningGym, train_seed  # noqa: E402
from rlvr.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ADDITION = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+"], allow_parentheses=False,
                allow_negation=False)
SMALL = ADDITION | dict(max_digits=1)  # a + b with a, b in 0..10: 11 × 11 = 121 distinct prompts


def source(seed=0, **kw):
    args = dict(seed=seed, task="basic_arithmetic", config={"basic_arithmetic": ADDITION}, size=200, eval_size=50,
                eval_seed=0, prompt_template="{metadata[expression]} =", shuffle=True, demonstrations="{answer}") | kw
    return ReasoningGym(**args)


def test_same_seed_same_examples_other_seed_other_examples():
    a, b, other = source(seed=1), source(seed=1), source(seed=2)
    assert [a.batch(step, 8) for step in range(3)] == [b.batch(step, 8) for step in range(3)]
    assert a.batch(0, 8) != other.batch(0, 8)
    assert a.demonstrations() == b.demonstrations() != other.demonstrations()


def test_training_order_is_batch_indices_over_the_generated_examples():
    data = source(seed=3, shuffle=False)
    in_order = data.batch(0, 200)  # shuffle off: position i is training example i
    for step in (0, 7, 30):  # step 30 is in the third epoch
        indices = batch_indices(step, 16, 200, 3)
        assert source(seed=3).batch(step, 16) == [in_order[i] for i in indices]


def test_held_out_is_the_same_for_every_seed_and_never_a_training_prompt():
    runs = [source(seed=s, config={"basic_arithmetic": SMALL}, eval_size=40) for s in (0, 1)]
    held = [e.prompt for e in runs[0].eval_examples()]
    assert held == [e.prompt for e in runs[1].eval_examples()] and len(held) == 40
    for data in runs:
        train = data.batch(0, 200)
        assert not {e.prompt for e in train} & set(held)
        # 121 prompts, about a third held out (40 draws, some repeated): redraws happened, from the next seeds
        seeds = {EntryKey.parse(e.reference).seed for e in train}
        assert train_seed(data.seed, 0) in seeds and train_seed(data.seed, 1) in seeds


def test_a_held_out_set_that_covers_the_task_fails_at_construction():
    with pytest.raises(ValueError, match=r"too few distinct prompts for data.eval_size=2000"):
        source(config={"basic_arithmetic": SMALL}, eval_size=2000)


def test_the_reference_names_the_entry_and_regenerates_it():
    example = source(seed=4).batch(0, 1)[0]
    key = EntryKey.parse(example.reference)
    entry = key.entry()
    a, b = entry["metadata"]["expression"].split(" + ")
    assert example.prompt == f"{a} + {b} ="
    assert key.answer == entry["answer"] == str(int(a) + int(b))
    assert (key.task, key.config, key.size) == ("basic_arithmetic", ADDITION, 200)
    assert json.loads(example.reference)["answer"] == key.answer  # readable in samples/
    with pytest.raises(ValueError, match="not a reasoning-gym entry reference"):
        EntryKey.parse("42")


def test_the_question_template_and_demonstrations():
    data = source(prompt_template="Q: {question}", demonstrations="<answer>{answer}</answer>")
    demo = data.demonstrations()[0]
    key = EntryKey.parse(data.batch(0, 1)[0].reference)  # not demonstration 0's example: the order is shuffled
    assert key.entry()["question"].startswith("Calculate ")
    assert demo.prompt.startswith("Q: Calculate ") and demo.completion.startswith("<answer>")
    assert len(data.demonstrations()) == 200
    assert source(demonstrations=None).demonstrations() == []


def test_a_task_without_answers_cannot_give_demonstrations():
    data = source(task="graph_color", size=3, eval_size=2, prompt_template="{question}")
    with pytest.raises(ValueError, match="no answer to demonstrate .* set data.demonstrations=null"):
        data.demonstrations()


@pytest.mark.parametrize("changes,message", [
    (dict(task="chain_sun"), "data.task=chain_sun is not a reasoning-gym task (close: chain_sum, decimal_chain_sum)"),
    (dict(task="xyzzy"), "data.task=xyzzy is not a reasoning-gym task (106 tasks: python -c"),
    (dict(task="composite"),
     "data.task=composite with data.config.composite={}: reasoning-gym refuses it: AssertionError: Must specify at "
     "least one dataset"),
    (dict(config={"basic_arithmetic": ADDITION | dict(min_terms=3)}),
     "reasoning-gym refuses it: AssertionError: max_terms must be >= min_terms"),
    (dict(config={"basic_arithmetic": ADDITION, "gcd": dict(max_terms=3)}, task="gcd"),
     "data.config.gcd sets ['max_terms'], which gcd does not take (it takes ['min_numbers', 'max_numbers', "
     "'min_value', 'max_value']"),
    (dict(config={"chain_sun": {}}), "data.config.chain_sun: chain_sun is not a reasoning-gym task (close: chain_sum"),
    (dict(config={"basic_arithmetic": 2}), "data.config.basic_arithmetic=2 must be a dict of basic_arithmetic's"),
    (dict(config={"basic_arithmetic": ADDITION | dict(seed=1)}), "data.config.basic_arithmetic sets ['seed']"),
    (dict(prompt_template="{metadata[digits]} ="),
     "data.prompt_template='{metadata[digits]} =' does not fit data.task=basic_arithmetic's entries (KeyError: "
     "'digits'); their metadata holds ['difficulty', 'expression', 'num_digits', 'num_terms', 'source_dataset', "
     "'source_index']"),
    (dict(prompt_template="{answer} ="), "data.prompt_template='{answer} =' must use {metadata} or {question}"),
    (dict(demonstrations="{question}"), "data.demonstrations='{question}' must use {answer}"),
    (dict(size=0), "data.size=0 must be in [1, 2**31)"),
    (dict(eval_size=-1), "data.eval_size=-1 must be in [0, 2**31)"),
])
def test_mistakes_name_the_key(changes, message):
    with pytest.raises(ValueError) as err:
        source(**changes)
    assert message in str(err.value)


def test_no_held_out_set():
    assert source(eval_size=0).eval_examples() == []


def test_another_task_leaves_the_default_tasks_knobs_alone():
    """data.task=chain_sum with the YAML's basic_arithmetic knobs in data.config: chain_sum gets its defaults."""
    data = source(task="chain_sum", prompt_template="{question}")
    key = EntryKey.parse(data.batch(0, 1)[0].reference)
    assert key.task == "chain_sum" and key.config == {}


def test_a_missing_library_fails_at_start_naming_the_extra(tmp_path):
    hider = ROOT / "tests" / "hidden_packages"  # makes reasoning_gym look not installed (tests/test_missing_packages)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLVR_TEST_HIDE": "reasoning_gym",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hider), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "train.py", "data=reasoning_gym", "reward=reasoning_gym",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    for group, target in (("data", "rlvr.data.reasoning_gym.ReasoningGym"),
                          ("reward", "rlvr.reward.reasoning_gym.ReasoningGymScore")):
        assert (f'  {group} <{target}>: reasoning_gym is not installed: pip install -e ".[envs]"'
                in proc.stderr.splitlines()), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_a_short_real_run_on_the_default_task(tmp_path):
    """Smoke only (no learning claim): the tiny model, untrained, two steps and two evaluations."""
    summary = run(compose_config(FAST + ["data=reasoning_gym", "reward=reasoning_gym", "trainer.max_steps=2",
                                         "data.size=64", "data.eval_size=16"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps, evals = [r for r in rows if "loss" in r], [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [0, 1] and [r["step"] for r in evals] == [0, 2]
    assert all(0.0 <= r["mean_reward"] <= 1.0 and r["reward/error_frac"] == 0.0 for r in steps)
    assert all(r["eval/examples"] == 16 and r["eval/reward_error_frac"] == 0.0 for r in evals)
    sample = json.loads((tmp_path / "samples" / "step_000000.jsonl").read_text().splitlines()[0])
    assert EntryKey.parse(sample["reference"]).task == "basic_arithmetic" and sample["prompt"].endswith(" =")
    assert all(0.0 <= v <= 1.0 for v in sample["rewards"]) and summary["steps"] == 2
