"""Synthetic run folders in the exact formats `rlvr/outputs.py` and Hydra write, for the CLI tests."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlvr.labels import names

TARGETS = {name: target for target, name in names().items()
           if target.startswith(("rlvr.algorithm.", "rlvr.transform."))}


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make_run(
    folder: Path,
    *,
    seed: int,
    algorithm: str,
    transform: str,
    condition_choice: str | None,
    steps_done: int,
    max_steps: int = 10,
    evals: dict[int, float] | None = None,
    state: str | None = "finished",
    host: str | None = None,
    pid: int | None = None,
    reason: str | None = None,
    half_written: bool = False,
    age_s: float = 0.0,
    config: dict | None = None,
    write_config: bool = True,
) -> Path:
    """A run folder: .hydra/, metrics.jsonl (rewards 0.1·seed + 0.01·step; step 3 skipped), status.json and,
    when finished, summary.json. `evals` maps step → eval/accuracy; `age_s` backdates every file.

    .hydra/config.yaml builds `algorithm` and `transform` (a built-in's class, else a target named as given,
    which rlvr/labels.py names by itself), so the run's label is `<algorithm>+<transform>`; `config` is merged
    over it (nested dicts key by key); `write_config=False` leaves it out (a run folder without a config).
    `condition_choice` is written as Hydra's `condition` choice, which no reader may trust."""
    (folder / ".hydra").mkdir(parents=True)
    composed = {"seed": seed, "threads": 1,
                "trainer": {"_target_": "rlvr.trainer.Trainer", "max_steps": max_steps, "lr": 0.001},
                "algorithm": {"_target_": TARGETS.get(algorithm, algorithm)},
                "transform": {"_target_": TARGETS.get(transform, transform)},
                "backend": {"_target_": "rlvr.backend.local.LocalBackend"}}
    if write_config:
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(_merged(composed, config or {})))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}"]))
    choices = {"condition": condition_choice, "algorithm": algorithm, "transform": transform, "model": "tiny"}
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"run": {"dir": str(folder)}, "runtime": {"choices": choices}}}))
    evals = evals or {}
    lines = []
    for step in range(steps_done + 1):
        if step in evals:
            lines.append({"step": step, "eval/accuracy": evals[step], "eval/mean_reward": evals[step],
                          "eval_time_s": 0.5})
        if step == steps_done:
            break
        row = {"step": step, "condition": f"{algorithm}+{transform}", "mean_reward": 0.1 * seed + 0.01 * step,
               "correct_rate": 0.1 * seed, "step_time_s": 1.0}
        if step == 3:
            row["skipped"] = True
        else:
            row["loss"] = 0.5
        lines.append(row)
    text = "".join(json.dumps(row) + "\n" for row in lines)
    if half_written:
        text += json.dumps({"step": steps_done, "condition": "x", "mean_reward": 0.5})[:30]  # cut mid-write
    (folder / "metrics.jsonl").write_text(text)
    if state is not None:
        (folder / "status.json").write_text(json.dumps({
            "state": state, "max_steps": max_steps, "reason": reason, "updated": "2026-01-01T00:00:00+00:00",
            "host": host or socket.gethostname(), "pid": pid or 12345, "slurm_job_id": None,
            "slurm_array_task_id": None,
        }))
    if state == "finished":
        accs = [evals[s] for s in sorted(evals)]
        (folder / "summary.json").write_text(json.dumps({
            "condition": f"{algorithm}+{transform}", "steps": steps_done,
            "eval_accuracy_initial": accs[0] if accs else None, "eval_accuracy_final": accs[-1] if accs else None,
            "eval_accuracy_best": max(accs) if accs else None, "wall_seconds": 10.0, "seeds": {"root": seed},
        }))
    if age_s:
        then = time.time() - age_s
        for path in folder.rglob("*"):
            os.utime(path, (then, then))
    return folder


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


GRPO_FINAL = {0: 0.40, 1: 0.50, 2: 0.30}
SEPA_FINAL = {0: 0.55, 1: 0.60, 2: 0.50}


@pytest.fixture
def campaign(tmp_path) -> Path:
    """outputs/<campaign>/<condition>/seed=<s>/ with every state a reader must tell apart:

    grpo+none       (no Hydra `condition` choice)
        seed 0, 1   finished, 10/10
        seed 2      killed at step 7: status still says running, pid gone on this host, half-written line
    maxrl+sepa      (in folders maxrl_gtpo_sepa/, chosen as condition=maxrl_gtpo_sepa: named by its config)
        seed 0, 2   finished
        seed 1      preempted at 6/10
    gtpo+hicra
        seed 0      running, pid = this test process (alive)
        seed 1      running on another host, files untouched for 2 h → stale; no .hydra/config.yaml:
                    named by its metrics rows
    """
    root = tmp_path / "camp"
    for seed in (0, 1, 2):
        killed = seed == 2
        make_run(root / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=7 if killed else 10,
                 evals={0: 0.1, 5: GRPO_FINAL[seed] - 0.05 if not killed else GRPO_FINAL[seed],
                        10: GRPO_FINAL[seed]},
                 state="running" if killed else "finished", pid=dead_pid() if killed else None,
                 half_written=killed)
        preempted = seed == 1
        make_run(root / "maxrl_gtpo_sepa" / f"seed={seed}", seed=seed, algorithm="maxrl", transform="sepa",
                 condition_choice="maxrl_gtpo_sepa", steps_done=6 if preempted else 10,
                 evals={0: 0.1, 5: SEPA_FINAL[seed]} if preempted else {0: 0.1, 5: 0.3, 10: SEPA_FINAL[seed]},
                 state="preempted" if preempted else "finished", reason="SIGTERM" if preempted else None)
    make_run(root / "hicra" / "seed=0", seed=0, algorithm="gtpo", transform="hicra", condition_choice=None,
             steps_done=4, evals={0: 0.2}, state="running", pid=os.getpid())
    make_run(root / "hicra" / "seed=1", seed=1, algorithm="gtpo", transform="hicra", condition_choice=None,
             steps_done=2, evals={0: 0.2}, state="running", host="some-other-node", pid=1, age_s=7200,
             write_config=False)
    return root
