"""`rlvr doctor [OVERRIDES…]`: what is installed and usable on this machine, and whether the run that the
overrides compose can run here.

Two parts, one line per item, each `ok`, `missing`, `warning` or `error` with the reason:

- this machine (`machine.py`): Python, torch and its devices, transformers, peft, vLLM (CPU or CUDA build),
  the Tinker SDK, the API keys' variables (set or unset, never their values), wandb, math-verify (a real
  `parse`/`verify` in a child process), httpx, SLURM (commands on PATH, and whether `sinfo -h` answers under
  $SLURM_CONF), the hub (HF_HUB_OFFLINE, whether it answers, and whether each conf/model preset's files are
  in the local cache);
- the run (`needs.py`): conf/train.yaml composed with the overrides as `python train.py` composes it (every
  job of a grid), put through rlvr.config_check's checks, then every machine requirement each chosen
  component declares in its `needs` (rlvr/protocols.py) is checked, whether or not a run checks it at start:
  a package (the same finding a run reports at start when it is missing, naming the pip extra), a server's
  model list, vLLM's build, a CUDA device, a hub preset's files, a key. `hydra/launcher=slurm` needs the SLURM
  commands, a cluster, and a partition whose nodes have the GPUs, CPUs and memory the launcher asks for: the
  problems the launcher itself refuses before it submits (rlvr/launcher/slurm.py), from the same `sinfo`.

Exit status 0 when everything the run needs is usable, 1 otherwise: a job script can begin with
`rlvr doctor "$@" || exit 1`. Rows of the machine part do not change the status; only the run's needs do.

Nothing loads a model, and nothing is contacted but engine=openai's own server, logger=wandb online's server
(one HEAD request, at most 3 s, as a run asks at start: rlvr/logger/preflight.py) and the hub (no Tinker, no
judge endpoint): unless HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set, the machine part sends the hub one
HEAD request ($HF_ENDPOINT, else https://huggingface.co), and the run part another when a chosen model's
files are not in the local cache (such a model cannot run when the hub does not answer; a run refuses it at
start too), each waiting at most rlvr.requirements.HUB_PROBE_TIMEOUT_S (3 s). vLLM is imported only when
engine=vllm is chosen, in a child process (it takes 5-10 s). A key variable is reported as set or unset, and
as a second guard every secret variable's value is replaced in the report before it is printed. Not
checked: whether a hub dataset is in the cache (that `datasets` is installed is) and the SFT warm-up's
demonstrations, which need the data built.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlvr.cli.doctor.report import FAILING, Line
from rlvr.cli.runs import CliError

SECRET_VARS = ("TINKER_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", "HF_TOKEN")
"""Variables whose values never appear in the report (besides each config's `api_key_env`)."""


def run(overrides: list[str], conf: Path) -> tuple[str, int]:
    """The report and the exit status (0: the run can run here, 1: it cannot)."""
    from rlvr.cli.doctor.machine import machine_lines, slurm_cluster
    from rlvr.cli.doctor.needs import compose_jobs, run_lines

    if not (conf / "train.yaml").is_file():
        raise CliError(f"{conf}: no train.yaml there (run from the repository root or pass --conf)")
    jobs, compose_error = compose_jobs(overrides, conf)
    error_lines = [] if compose_error is None else [Line("error", "config", compose_error)]
    with ThreadPoolExecutor(max_workers=4) as pool:  # child processes, sinfo and requests run side by side
        slurm = pool.submit(slurm_cluster)  # one `sinfo` for both parts
        needs = pool.submit(run_lines, jobs, pool, slurm) if compose_error is None else None
        machine = machine_lines(pool, conf, slurm)
        lines = needs.result() if needs is not None else error_lines
    command = " ".join(["python train.py", *overrides])
    failing = [line for line in lines if line.status in FAILING]
    grid = f" ({len(jobs)} jobs of the grid checked)" if len(jobs) > 1 else ""
    verdict = (f"rlvr doctor: this run cannot run here: {len(failing)} problem(s) in "
               + ", ".join(dict.fromkeys(line.item for line in failing))) if failing \
        else f"rlvr doctor: this run can run here{grid}"
    report = "\n".join(["rlvr doctor: this machine", *map(str, machine),
                        f"rlvr doctor: what `{command}` needs{grid}", *map(str, lines), verdict])
    return scrub(report, [job.cfg for job in jobs]), 1 if failing else 0


def scrub(text: str, configs: list) -> str:
    """Every secret variable's value replaced, as a guard behind never printing one."""
    names = set(SECRET_VARS)
    for cfg in configs:
        names.update(str(cfg[g].get("api_key_env")) for g in ("engine", "backend", "reward")
                     if cfg[g].get("api_key_env"))
    for name in names:
        value = os.environ.get(name, "").strip()
        if len(value) >= 4:
            text = text.replace(value, f"<${name}>")
    return text
