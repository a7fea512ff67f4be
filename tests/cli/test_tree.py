"""`rlvr tree`: a tech tree of multiruns, each node judged by a `rlvr compare` metric, its outcome unlocking children.

One real tree of three 2-step grids on the tiny model (python train.py --multirun, as `run` launches it), walked
through every command; the file's checks without any run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlvr.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FAST = "trainer.max_steps=2 trainer.warmup.steps=0 trainer.eval_every=0 data.eval_size=16 threads=1"
TREE = f"""\
overrides: {FAST}
nodes:
  baseline:
    description: GRPO, two seeds
    overrides: seed=0,1
    success: mean_reward >= 0
    on_success: [contrast]
    on_failure: [never]
  contrast:
    overrides:
      - condition=grpo,maxrl
      - seed=0
    success: {{metric: mean_reward, condition: maxrl+none, vs: grpo+none, op: ">", value: 1}}
    on_success: [never]
    on_failure: [rescue]
  rescue:
    overrides: seed=2
    success: {{metric: eval/accuracy, op: "<=", value: 1}}
  never:
    overrides: seed=3
    success: mean_reward >= 0
"""


def tree(file: Path, capfd, *args: str) -> tuple[int, str, str]:
    code = main(["tree", str(file), *args])
    out, err = capfd.readouterr()
    return code, out, err


def view(file: Path, capfd) -> dict:
    code, out, _ = tree(file, capfd, "--json")
    assert code == 0
    return {n["id"]: n for n in json.loads(out)["nodes"]}


def final_mean_reward(run: Path) -> float:
    """The last training row's mean_reward, read here without rlvr's readers."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/accuracy" not in r][-1]["mean_reward"]


def algorithm(run: Path) -> str:
    return yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["algorithm"]["_target_"].rsplit(".", 1)[-1]


def test_a_three_node_tree_runs_judges_and_unlocks_over_real_grids(tmp_path, capfd):
    file = tmp_path / "demo.yaml"
    file.write_text(TREE)
    train = ["--train", str(ROOT / "train.py")]
    nodes = view(file, capfd)
    assert {k: n["state"] for k, n in nodes.items()} == {
        "baseline": "ready", "contrast": "locked", "rescue": "locked", "never": "locked"}
    code, out, _ = tree(file, capfd, "next")
    assert code == 0 and out.startswith("baseline (root): rlvr tree demo.yaml run baseline")
    code, _, err = tree(file, capfd, "run", "contrast", *train)
    assert code == 2 and "contrast is locked: it runs once baseline succeeded" in err
    assert tree(file, capfd, "note", "baseline", "first try")[0] == 0

    code, out, err = tree(file, capfd, "run", "baseline", *train)
    assert code == 0, (out + err)[-3000:]
    runs = sorted((tmp_path / "outputs" / "demo" / "baseline").glob("[0-9]*"))
    assert [r.name for r in runs] == ["0", "1"]  # the grid seed=0,1 in the node's folder
    expected = (final_mean_reward(runs[0]) + final_mean_reward(runs[1])) / 2
    assert f"baseline: succeeded: mean_reward >= 0: {expected:.4f} (2 seeds, 2 finished runs); unlocks contrast" in out
    record = json.loads((tmp_path / "demo.state.json").read_text())["nodes"]["baseline"]
    assert record["value"] == pytest.approx(expected) and record["seeds"] == [0, 1]
    assert record["command"][2:] == ["--multirun", *FAST.split(), "seed=0,1",
                                     f"hydra.sweep.dir={tmp_path / 'outputs' / 'demo' / 'baseline'}"]
    assert [n["state"] for n in view(file, capfd).values()] == ["succeeded", "ready", "locked", "locked"]

    # contrast: maxrl − grpo on seed 0 cannot exceed 1 (rewards in [0, 1]) → failed → unlocks rescue, not never
    code, out, _ = tree(file, capfd, "run", "contrast", *train)
    by_algorithm = {algorithm(r): r for r in (tmp_path / "outputs" / "demo" / "contrast").glob("[0-9]*")}
    delta = final_mean_reward(by_algorithm["MaxRL"]) - final_mean_reward(by_algorithm["GRPO"])
    assert code == 0 and f"contrast: failed: Δ mean_reward of maxrl+none vs grpo+none > 1: {delta:.4f} " \
                         "(1 seed, 2 finished runs); unlocks rescue" in out
    assert tree(file, capfd, "next", "--json")[1].count('"id"') == 1 and "rescue" in tree(file, capfd, "next")[1]
    code, out, _ = tree(file, capfd, "run", "rescue", *train)
    assert code == 0 and "rescue: succeeded: eval/accuracy <= 1:" in out
    nodes = view(file, capfd)
    assert {k: n["state"] for k, n in nodes.items()} == {
        "baseline": "succeeded", "contrast": "failed", "rescue": "succeeded", "never": "locked"}
    assert nodes["rescue"]["unlocked_by"] == "contrast failed" and nodes["never"]["unlocked_by"] is None
    code, out, _ = tree(file, capfd)
    lines = out.splitlines()
    assert lines[0].startswith("demo.yaml: 2 succeeded, 1 failed, 1 locked")
    assert [line.split()[:2] for line in lines[1:7]] == [
        ["baseline", "succeeded"], ["·", "note"], ["✓", "contrast"], ["✓", "never"], ["✗", "rescue"], ["✗", "never"]]
    assert lines[2].endswith("first try") and lines[6].endswith("(above)") and lines[-1].endswith("next: none")
    code, _, err = tree(file, capfd, "run", "baseline", *train)
    assert code == 2 and "baseline already succeeded" in err  # a finished node is not run again by accident

    # reset keeps the notes and locks what its outcome unlocked (contrast keeps its own outcome, and so still
    # unlocks rescue); eval judges it again from its folders
    assert tree(file, capfd, "reset", "baseline")[0] == 0
    nodes = view(file, capfd)
    assert nodes["baseline"]["state"] == "ready" and nodes["baseline"]["notes"][0]["text"] == "first try"
    assert nodes["baseline"]["record"].keys() == {"notes"} and nodes["contrast"]["unlocked_by"] is None
    assert (nodes["contrast"]["state"], nodes["rescue"]["unlocked_by"]) == ("failed", "contrast failed")
    code, out, _ = tree(file, capfd, "eval", "--json")
    judged = {j["node"]: j for j in json.loads(out)}
    assert code == 0 and set(judged) == {"baseline", "contrast", "rescue"}  # never has no runs
    assert judged["baseline"]["value"] == pytest.approx(expected) and judged["contrast"]["outcome"] == "failed"
    assert view(file, capfd)["contrast"]["unlocked_by"] == "baseline succeeded"
    assert not list(tmp_path.glob(".*.tmp"))  # every state write was a whole file moved into place

    # the same real runs through rlvr serve-status's scan: throughput and memory gauges are there
    from rlvr.cli.serve_status import prometheus, snapshot

    scan = snapshot(tmp_path / "outputs" / "demo", 1800.0)
    assert len(scan["runs"]) == 5 and scan["counts"] == {"finished": 5}
    assert all(r["latest"]["tokens_per_second"] > 0 and r["latest"]["process_max_rss_mb"] > 0 for r in scan["runs"])
    text = prometheus(scan)
    for gauge in ("tokens_per_second", "sample_share", "train_share", "max_token_hit_rate", "step_time_seconds"):
        assert f'rlvr_latest_{gauge}{{run="baseline/0",condition="grpo+none",seed="0"}} ' in text, gauge


BAD = """\
overrides: [hydra.sweep.dir=x]
colour: blue
nodes:
  a:
    overrides: [seed=0,1]
    success: {metric: mean_reward, op: "=>", value: high, at: best}
    on_success: [b, nowhere]
  b:
    success: mean_reward >= 0
    on_failure: [a]
    retries: 2
  "c d":
    overrides: seed=0
"""


def test_every_problem_of_a_tree_file_is_named_at_once(tmp_path, capfd):
    file = tmp_path / "bad.yaml"
    file.write_text(BAD)
    code, _, err = tree(file, capfd)
    assert code == 2
    for problem in (
        "colour: unknown key (expected root, overrides, nodes)",
        "nodes.a.overrides must be a list of strings, got ['seed=0', 1]: YAML splits a flow list",
        "nodes.a.success.value must be a number, got 'high'",
        "nodes.a.success.op must be one of > >= < <= ==, got '=>'",
        "nodes.a.success.at must be final or last-k, got 'best'",
        "nodes.a unlocks 'nowhere', which is not a node",
        "nodes.b.retries: unknown key",
        "nodes.c d: a node id names its folder",
        "nodes.c d.success is missing",
        "'hydra.sweep.dir=x' is set by rlvr tree",
        "the nodes unlock each other in a cycle: a → b → a",
    ):
        assert problem in err, problem
    assert not (tmp_path / "bad.state.json").exists()


def test_a_multirun_that_fails_is_an_error_and_unlocks_nothing(tmp_path, capfd):
    file = tmp_path / "t.yaml"
    file.write_text("nodes:\n  a:\n    overrides: trainer.no_such_key=1\n    success: mean_reward >= 0\n"
                    "    on_success: [b]\n    on_failure: [b]\n  b:\n    success: mean_reward >= 0\n")
    code, out, err = tree(file, capfd, "run", "a", "--train", str(ROOT / "train.py"))
    assert code == 1 and "a: error: the multirun exited with status 2" in out  # train.py's config-error status
    assert "no_such_key" in err  # train.py's own message reached the terminal
    nodes = view(file, capfd)
    assert nodes["a"]["state"] == "error" and nodes["b"]["state"] == "locked"


def test_ctrl_c_lets_the_multirun_checkpoint_and_records_the_node_as_interrupted(tmp_path):
    """Ctrl-C reaches the whole process group: `rlvr tree` waits for train.py to checkpoint and exit (130)."""
    file = tmp_path / "t.yaml"
    file.write_text(f"nodes:\n  long:\n    overrides: {FAST.replace('max_steps=2', 'max_steps=100000')} seed=0\n"
                    "    success: mean_reward >= 0\n")
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli.main", "tree", str(file), "run", "long", "--train",
                             str(ROOT / "train.py")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    metrics = tmp_path / "outputs" / "t" / "long" / "0" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.read_text().count('"loss"') >= 1) and time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "long: interrupted; `rlvr tree t.yaml run long --force` continues it" in out
    record = json.loads((tmp_path / "t.state.json").read_text())["nodes"]["long"]
    assert record["outcome"] == "error" and record["exit_status"] == 130 and "interrupted" in record["reason"]
    assert (metrics.parent / "checkpoints" / "latest").exists()  # the run saved its step before it exited
