"""`rlvr serve-status PATH`: the runs under PATH as a live HTTP endpoint, for Prometheus and for scripts.

    GET /metrics       Prometheus text format 0.0.4: `rlvr_*` gauges, one sample per run, labelled
                       run (its folder under PATH), condition and seed
    GET /status.json   the same scan as JSON: `rlvr status --json`'s rows, each with its latest values

Every request scans PATH again (`rlvr.cli.runs.load_runs`, the state rule of `rlvr status`), as the predecessor's
exporter did: a run started after the endpoint appears on the next scrape, and nothing is cached between two.
A "latest" gauge is the metric's value at the newest step that logged it (a skipped step logs no `loss`), absent
for a run that has not logged it yet. `rlvr_process_resident_memory_bytes` is read from /proc/<pid>/status of a
running run on this host (Linux; absent elsewhere), where `rlvr_latest_process_max_rss_megabytes` is the peak the
run wrote itself.

The endpoint binds to a loopback address only: it shows folder names and configs' labels to whoever connects,
and has no authentication. Scrape it from this machine, or forward the port (`ssh -L`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import resource
import signal
import socket
import sys
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rlvr.cli.runs import CliError, Run, load_runs
from rlvr.cli.status import manifest_rows, run_row

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format."""
LATEST = {
    "mean_reward": ("rlvr_latest_mean_reward", "mean reward of the newest step's completions"),
    "correct_rate": ("rlvr_latest_correct_rate", "share of the newest step's completions scored correct"),
    "loss": ("rlvr_latest_loss", "policy loss of the newest step that trained"),
    "step_time_s": ("rlvr_latest_step_time_seconds", "wall time of the newest step"),
    "tokens_per_second": ("rlvr_latest_tokens_per_second", "tokens per second of the newest step"),
    "sample_share": ("rlvr_latest_sample_share", "share of the newest step spent sampling"),
    "train_share": ("rlvr_latest_train_share", "share of the newest step spent training"),
    "max_token_hit_rate": ("rlvr_latest_max_token_hit_rate", "share of the newest step's completions cut at the "
                           "token limit"),
    "process_max_rss_mb": ("rlvr_latest_process_max_rss_megabytes", "peak resident memory the run reported (MB)"),
    "eval/accuracy": ("rlvr_latest_eval_accuracy", "held-out accuracy of the newest evaluation"),
}
"""metrics.jsonl name → (gauge, help) of the per-run "latest" gauges."""


def _rss_bytes(pid) -> int | None:
    """VmRSS of `pid` from /proc (Linux), None when it cannot be read."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # in kB
    return None


def own_rss_bytes() -> int:
    """This process's resident memory: /proc where there is one, else its peak (resource's ru_maxrss, in kB on
    Linux, in bytes on macOS)."""
    live = _rss_bytes(os.getpid())
    if live is not None:
        return live
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _entry(run: Run, root: Path, now: float, stale_after_s: float) -> dict:
    row = run_row(run, root, now, stale_after_s)
    row["latest"] = {name: series[-1][1] for name in LATEST if (series := run.series(name))}
    here = run.status.get("host") == socket.gethostname()
    row["pid"] = run.status.get("pid")
    row["rss_bytes"] = _rss_bytes(row["pid"]) if here and row["state"] == "running" else None
    return row


def snapshot(root: Path, stale_after_s: float) -> dict:
    """One scan of `root`: every run's status row and latest values, the count per state, and what the scan
    cost. A folder with no runs (yet) is an empty scan, not an error."""
    started = time.perf_counter()
    now = time.time()
    note: str | None = None
    try:
        runs = load_runs(root)
    except CliError as err:
        runs, note = [], str(err)
    rows = [_entry(r, root, now, stale_after_s) for r in runs]
    rows += [{**row, "latest": {}, "pid": None, "rss_bytes": None} for row in manifest_rows(root, rows)]
    counts = Counter(r["state"] for r in rows)
    return {"root": str(root), "scanned_at": now, "note": note, "runs": rows,
            "counts": dict(sorted(counts.items())), "active_runs": counts.get("running", 0),
            "scan_seconds": time.perf_counter() - started, "exporter_rss_bytes": own_rss_bytes()}


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}" if labels else ""


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, bool | int) else repr(float(value))


class _Exposition:
    """Gauges in Prometheus' text format: each family's HELP and TYPE once, then its samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def add(self, name: str, help_text: str, value: float | None, labels: dict | None = None) -> None:
        samples = self.families.setdefault(name, (help_text, []))[1]
        if value is not None:
            samples.append(f"{name}{_labels(labels or {})} {_number(value)}")

    def text(self) -> str:
        lines = []
        for name, (help_text, samples) in self.families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples]
        return "\n".join(lines) + "\n"


def prometheus(scan: dict) -> str:
    """The scan as `rlvr_*` gauges."""
    out = _Exposition()
    out.add("rlvr_active_runs", "runs in state running (rlvr status's rule)", scan["active_runs"])
    for state, count in scan["counts"].items():
        out.add("rlvr_runs", "runs per state", count, {"state": state})
    for row in scan["runs"]:
        run = {"run": row["folder"], "condition": row["condition"], "seed": "" if row["seed"] is None else row["seed"]}
        out.add("rlvr_run_info", "one per run; its state in the state label", 1, {**run, "state": row["state"]})
        out.add("rlvr_run_active", "1 while the run is running", row["state"] == "running", run)
        out.add("rlvr_run_completed", "1 once the run has finished", row["state"] == "finished", run)
        out.add("rlvr_metrics_present", "1 once the run has logged a step", row["step"] > 0, run)
        out.add("rlvr_latest_step", "optimizer steps the run has completed", row["step"], run)
        out.add("rlvr_max_steps", "steps the run is to train", row["max_steps"], run)
        for name, (gauge, help_text) in LATEST.items():
            out.add(gauge, help_text, row["latest"].get(name), run)
        out.add("rlvr_process_resident_memory_bytes", "resident memory of a running run's process on this host "
                "(/proc)", row["rss_bytes"], run)
        out.add("rlvr_metrics_age_seconds", "seconds since the run's files last changed", row["age_s"], run)
    out.add("rlvr_scan_seconds", "time this scan of the run folders took", scan["scan_seconds"])
    out.add("rlvr_exporter_resident_memory_bytes", "resident memory of this endpoint", scan["exporter_rss_bytes"])
    return out.text()


def _handler(root: Path, stale_after_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE, prometheus(snapshot(root, stale_after_s)))
            elif path == "/status.json":
                self._send(200, "application/json", json.dumps(snapshot(root, stale_after_s), indent=2) + "\n")
            else:
                self._send(404, "text/plain; charset=utf-8", "not found: /metrics (Prometheus) or /status.json\n")

        def _send(self, code: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
            pass  # a scrape every few seconds is not news

    return Handler


def check_loopback(host: str) -> None:
    """Refuse (CliError) a host that is not a loopback address: the endpoint has no authentication."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror as err:
        raise CliError(f"--host {host}: cannot resolve it ({err})") from err
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise CliError(f"--host {host} is not a loopback address ({', '.join(outside)}); the endpoint has no "
                       "authentication: bind 127.0.0.1 and forward the port (ssh -L) to scrape it from elsewhere")


class _Stopped(Exception):
    pass


def _stop(signum, frame) -> None:
    raise _Stopped


def serve(root: Path, host: str = "127.0.0.1", port: int = 9464, stale_after_s: float = 1800.0) -> str:
    """Serve until SIGINT or SIGTERM; the first line printed names the address (with the port chosen for 0)."""
    root = Path(root)
    if not root.is_dir():
        raise CliError(f"{root}: no such folder")
    check_loopback(host)

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

    try:
        server = Server((host, port), _handler(root, stale_after_s))
    except OSError as err:
        raise CliError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"rlvr serve-status: http://{shown}:{bound}/metrics (Prometheus) and /status.json, scanning {root} "
          "per request; Ctrl-C stops", flush=True)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    return "rlvr serve-status: stopped"
