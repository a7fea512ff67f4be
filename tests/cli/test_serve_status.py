"""`rlvr serve-status`: the runs as Prometheus gauges and JSON over loopback HTTP, rescanned per request.

The server is the real command in a subprocess on port 0 (the port it got is read from its first line); the run
folders are the `campaign` fixture's (tests/cli/conftest.py), whose running run's pid is this test process."""

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cli.conftest import make_run

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = re.compile(r'^(rlvr_\w+)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[dict, dict]:
    """(metric, labels as a sorted tuple) → value, and metric → its TYPE; every line must be a comment or a sample."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in types, f"{name} typed twice"
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        assert name in types, f"{name} sampled before its TYPE"
        key = (name, tuple(sorted(LABEL.findall(labels or ""))))
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(value)
    return samples, types


def of_run(samples: dict, name: str, run: str) -> float | None:
    found = [v for (n, labels), v in samples.items() if n == name and ("run", run) in labels]
    assert len(found) <= 1
    return found[0] if found else None


def get(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.headers["Content-Type"], response.read().decode()


@pytest.fixture
def server(campaign):
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli.main", "serve-status", str(campaign), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", first)
        assert match, first + proc.stderr.read() if proc.poll() is not None else first
        yield int(match.group(1)), proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_gauges_and_json_of_every_run_rescanned_per_request(server, campaign):
    port, proc = server
    content_type, text = get(port, "/metrics")
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    samples, types = parse(text)
    assert set(types.values()) == {"gauge"}
    # 8 runs: grpo 0, 1 finished, 2 dead (pid gone); hicra 0 running (this process), 1 stale; maxrl+sepa 0, 2
    # finished, 1 preempted
    assert samples[("rlvr_active_runs", ())] == 1
    assert {labels[0][1]: v for (n, labels), v in samples.items() if n == "rlvr_runs"} == {
        "dead": 1, "finished": 4, "preempted": 1, "running": 1, "stale": 1}
    info = {dict(labels)["run"]: dict(labels) for (n, labels), _ in samples.items() if n == "rlvr_run_info"}
    assert info["grpo/seed=2"] == {"run": "grpo/seed=2", "condition": "grpo+none", "seed": "2", "state": "dead"}
    assert info["maxrl_gtpo_sepa/seed=1"]["state"] == "preempted" and len(info) == 8
    # grpo seed 0: 10 steps of rewards 0.1·seed + 0.01·step, loss 0.5 (not at the skipped step 3), 1 s a step
    assert of_run(samples, "rlvr_latest_step", "grpo/seed=0") == 10
    assert of_run(samples, "rlvr_max_steps", "grpo/seed=0") == 10
    assert of_run(samples, "rlvr_latest_mean_reward", "grpo/seed=1") == pytest.approx(0.1 + 0.09)
    assert of_run(samples, "rlvr_latest_loss", "grpo/seed=0") == 0.5
    assert of_run(samples, "rlvr_latest_step_time_seconds", "grpo/seed=0") == 1.0
    assert of_run(samples, "rlvr_latest_eval_accuracy", "grpo/seed=1") == 0.50
    assert of_run(samples, "rlvr_run_completed", "grpo/seed=0") == 1 and of_run(samples, "rlvr_run_active",
                                                                                "grpo/seed=0") == 0
    assert of_run(samples, "rlvr_latest_tokens_per_second", "grpo/seed=0") is None  # never logged: no sample
    assert of_run(samples, "rlvr_metrics_present", "grpo/seed=0") == 1
    # live memory only for the running run on this host: its pid is this test's, read from /proc by the server
    assert of_run(samples, "rlvr_process_resident_memory_bytes", "hicra/seed=0") > 10e6
    assert of_run(samples, "rlvr_process_resident_memory_bytes", "grpo/seed=0") is None
    assert of_run(samples, "rlvr_metrics_age_seconds", "hicra/seed=1") > 7000  # backdated 2 h
    assert samples[("rlvr_exporter_resident_memory_bytes", ())] > 10e6

    # the running run logs a step with throughput and memory, and a new run appears: both on the next scrape
    with open(campaign / "hicra" / "seed=0" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "mean_reward": 0.75, "loss": 0.25, "tokens_per_second": 123.5,
                            "process_max_rss_mb": 456.0, "step_time_s": 2.5}) + "\n")
    make_run(campaign / "grpo" / "seed=3", seed=3, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=2, state="running", pid=os.getpid())
    samples, _ = parse(get(port, "/metrics")[1])
    assert of_run(samples, "rlvr_latest_step", "hicra/seed=0") == 5
    assert of_run(samples, "rlvr_latest_tokens_per_second", "hicra/seed=0") == 123.5
    assert of_run(samples, "rlvr_latest_process_max_rss_megabytes", "hicra/seed=0") == 456.0
    assert of_run(samples, "rlvr_latest_mean_reward", "hicra/seed=0") == 0.75
    assert of_run(samples, "rlvr_latest_step", "grpo/seed=3") == 2
    assert samples[("rlvr_active_runs", ())] == 2

    content_type, body = get(port, "/status.json")
    scan = json.loads(body)
    assert content_type == "application/json" and scan["active_runs"] == 2 and len(scan["runs"]) == 9
    row = next(r for r in scan["runs"] if r["folder"] == "hicra/seed=0")
    assert row["state"] == "running" and row["pid"] == os.getpid() and row["rss_bytes"] > 10e6
    assert row["latest"]["tokens_per_second"] == 123.5 and row["step"] == 5
    with pytest.raises(urllib.error.HTTPError) as missing:
        get(port, "/nothing")
    assert missing.value.code == 404
    proc.terminate()  # SIGTERM: a clean stop, exit status 0
    assert proc.wait(timeout=30) == 0 and "stopped" in proc.stdout.read()


def test_an_empty_folder_is_served_as_no_runs(tmp_path):
    from rlvr.cli.serve_status import prometheus, snapshot

    samples, _ = parse(prometheus(snapshot(tmp_path, 1800.0)))
    assert samples[("rlvr_active_runs", ())] == 0 and not any(n == "rlvr_run_info" for n, _ in samples)


@pytest.mark.parametrize("host", ["0.0.0.0", "8.8.8.8"])
def test_only_a_loopback_address_is_served(tmp_path, host):
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli.main", "serve-status", str(tmp_path), "--host", host],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"--host {host} is not a loopback address" in proc.stderr
