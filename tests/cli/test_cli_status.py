"""`rlvr status`: one row per run, states told apart by the rule in rlvr/cli/runs.py."""

import json
import re
import subprocess
import sys
from pathlib import Path

from rlvr.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def status_json(path, capsys, *extra) -> dict:
    assert main(["status", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_rows_are_sorted_by_condition_then_seed_with_their_states(campaign, capsys):
    out = status_json(campaign, capsys)
    got = [(r["condition"], r["seed"], r["state"]) for r in out["runs"]]
    assert got == [
        ("grpo+none", 0, "finished"), ("grpo+none", 1, "finished"),
        ("grpo+none", 2, "dead"),  # status.json says running; its pid is gone on this host
        ("gtpo+hicra", 0, "running"),  # pid alive (this process)
        ("gtpo+hicra", 1, "stale"),  # another host, silent for 2 h > 1800 s
        ("maxrl+sepa", 0, "finished"), ("maxrl+sepa", 1, "preempted"),
        ("maxrl+sepa", 2, "finished"),
    ]
    assert out["counts"] == {"dead": 1, "finished": 4, "preempted": 1, "running": 1, "stale": 1}


def test_progress_reward_and_accuracy_come_from_the_last_rows(campaign, capsys):
    rows = {(r["condition"], r["seed"]): r for r in status_json(campaign, capsys)["runs"]}
    killed = rows[("grpo+none", 2)]
    # last complete training row is step 6 → 7/10; the half-written step-7 line is skipped and counted
    assert (killed["step"], killed["max_steps"], killed["bad_lines"]) == (7, 10, 1)
    assert abs(killed["reward"] - (0.1 * 2 + 0.01 * 6)) < 1e-12
    assert (killed["eval_accuracy"], killed["eval_step"]) == (0.30, 5)
    preempted = rows[("maxrl+sepa", 1)]
    assert (preempted["step"], preempted["reason"], preempted["eval_accuracy"]) == (6, "SIGTERM", 0.60)


def test_a_long_stale_threshold_keeps_a_quiet_run_running(campaign, capsys):
    rows = status_json(campaign, capsys, "--stale-after", "100000")["runs"]
    assert [r["state"] for r in rows if r["condition"] == "gtpo+hicra"] == ["running", "running"]


def test_text_table_has_a_row_per_run_and_a_footer(campaign, capsys):
    assert main(["status", str(campaign)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["condition", "seed", "step"]
    assert len(lines) == 1 + 8 + 1
    assert "7/10" in lines[3] and "0.300 @5" in lines[3] and "dead" in lines[3]
    assert "preempted (SIGTERM)" in lines[7]
    assert lines[-1] == "8 runs: 1 running, 1 stale, 1 dead, 1 preempted, 4 finished"


def test_a_single_run_folder_is_a_path_too(campaign, capsys):
    rows = status_json(campaign / "grpo" / "seed=1", capsys)["runs"]
    assert [(r["condition"], r["seed"], r["step"]) for r in rows] == [("grpo+none", 1, 10)]


def test_status_as_a_command_does_not_import_torch(campaign):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlvr.cli.main", "status", str(campaign)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "8 runs:" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "rlvr" in imported
    assert not imported & {"torch", "transformers", "hydra", "numpy", "matplotlib"}


def test_runs_listed_in_a_campaign_manifest_but_not_started_are_pending(tmp_path):
    import json as _json

    from rlvr.cli import status as status_cmd

    manifest = {"campaign": "c", "num_runs": 2, "max_steps": 50, "runs": [
        {"condition": "grpo", "seed": "0", "folder": str(tmp_path / "grpo/seed=0"), "state": "pending"},
        {"condition": "maxrl", "seed": "0", "folder": str(tmp_path / "maxrl/seed=0"), "state": "pending"},
    ]}
    (tmp_path / "manifest.json").write_text(_json.dumps(manifest))
    out = _json.loads(status_cmd.run(tmp_path, as_json=True))
    assert [(r["condition"], r["state"], r["max_steps"]) for r in out["runs"]] == [
        ("grpo", "pending", 50), ("maxrl", "pending", 50)]


def test_a_run_in_its_warm_up_shows_the_warm_up_progress(tmp_path, capsys):
    """A real run stopped in its SFT warm-up: the step column says how far the warm-up is, not `0/N`."""
    import os
    import signal
    import time

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "train.py", "trainer.warmup.steps=400", "trainer.warmup.batch_size=8",
         "trainer.warmup.cache_dir=null", "trainer.max_steps=5", "threads=1", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            warm = run_dir / "warmup.jsonl"
            if warm.exists() and warm.read_text().count("\n") >= 5:
                break
            time.sleep(0.05)
        row = status_json(run_dir, capsys)["runs"][0]
        assert row["state"] == "running" and row["step"] == 0 and row["max_steps"] == 5
        assert row["warmup_steps"] == 400 and 5 <= row["warmup_step"] < 400
        assert main(["status", str(run_dir)]) == 0
        assert re.search(r"\bwarm-up \d+/400\b", capsys.readouterr().out.splitlines()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_a_multi_line_failure_reason_shows_its_first_line_in_the_table(tmp_path, capsys):
    from rlvr.cli.status import REASON_WIDTH
    from tests.cli.conftest import make_run

    config_error = ("ConfigError: the config cannot run:\n  trainer.lr=-1: must be positive\n"
                    "  data.eval_size=0: must be at least 1")
    traceback_reason = "RuntimeError: " + "x" * 200 + "\nTraceback (most recent call last):\n  File \"a.py\""
    for seed, reason in enumerate((config_error, traceback_reason)):
        make_run(tmp_path / f"seed={seed}", seed=seed, algorithm="grpo", transform="none", condition_choice=None,
                 steps_done=2, state="failed", reason=reason)
    assert main(["status", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 + 1  # header, one line per run, footer: the reasons' newlines stay out
    assert "failed (ConfigError: the config cannot run: …)" in lines[1] and "trainer.lr" not in lines[1]
    cut = lines[2][lines[2].index("failed (") + len("failed ("):lines[2].index(")")]
    assert cut.endswith("…") and len(cut) == REASON_WIDTH and cut.startswith("RuntimeError: xxx")
    assert lines[1].endswith("seed=0") and lines[2].endswith("seed=1")  # the folder column is still last
    rows = status_json(tmp_path, capsys)["runs"]
    assert [r["reason"] for r in rows] == [config_error, traceback_reason]  # --json keeps them whole
