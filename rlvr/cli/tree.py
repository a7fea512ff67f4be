"""`rlvr tree FILE`: an experiment tech tree. Each node is a multirun (`python train.py --multirun …` with the
node's overrides); its runs are judged by a condition on a `rlvr compare` metric, and the outcome unlocks the
children listed for it. The predecessor's `retrain tree` did this over campaign TOMLs; here a node is Hydra
overrides, so it may name a campaign (`campaign=smoke`) or be any grid (`seed=0,1,2 trainer.lr=1e-4,3e-4`).

The file (YAML):

    root: outputs/my_tree          # where node N's runs go: <root>/<N>/ (relative to this file;
                                   #   default outputs/<file stem> beside it)
    overrides: trainer.max_steps=100     # before every node's own (optional); as typed on the command line,
                                         #   or a YAML list of them
    nodes:
      baseline:
        description: GRPO, three seeds            # optional
        overrides: condition=grpo seed=0,1,2
        success: eval/accuracy >= 0.30            # metric op value; op one of > >= < <= ==
        on_success: [sepa]                        # the nodes this outcome unlocks (optional)
        on_failure: [warmup]
      sepa:
        overrides:                                # a block list: a flow list [seed=0,1] splits at commas
          - condition=grpo,maxrl_gtpo_sepa
          - seed=0,1,2
        success: {metric: eval/accuracy, condition: maxrl+sepa, vs: grpo+none, op: ">", value: 0.0}

`success` as a mapping also takes `at` (final | last-k) and `k` as `rlvr compare` does, `condition` (whose mean;
needed when the node's runs hold several conditions) and `vs` (a baseline condition: the value is then the mean
difference paired by seed, as compare's Δ column), and `ignore_keys` (compare's --ignore-key). Only runs in state
`finished` count (the predecessor averaged over completed runs); the value is compare's mean over their seeds.

Outcomes: `succeeded` or `failed` (the condition held or not), `error` (the multirun exited with a non-zero
status, or no value could be computed: no finished run, an unknown metric, runs compare refuses). A node nothing
unlocks is a root, unlocked from the start; any other is unlocked once a parent has the outcome that lists it.
`locked` and `ready` are derived from the parents' outcomes, never stored, so `reset` of a parent locks its
children again (their own outcomes are kept).

Commands: `view` (default), `next` (ready nodes), `run ID` (launch, then judge), `eval [ID]` (judge again from the
folders: after a resumed or hand-launched run), `note ID TEXT`, `reset ID` (forget the outcome; notes and run
folders stay). The state is `<file stem>.state.json` beside the file (the predecessor wrote `tree_state.json`,
one per folder: here two trees may share a folder), rewritten whole under a lock (rlvr.campaign.locked), so a
reader never sees half of it and two commands at once do not lose each other's changes.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from rlvr.campaign import locked
from rlvr.cli.runs import CliError, find_run_dirs, load_runs
from rlvr.folder_lock import alive

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}
NODE_KEYS = ("description", "overrides", "success", "on_success", "on_failure")
SUCCESS_KEYS = ("metric", "op", "value", "at", "k", "condition", "vs", "ignore_keys")
OUTCOMES = ("succeeded", "failed", "error")
RESULT_KEYS = ("reason", "value", "condition", "seeds", "ci95", "runs", "runs_found", "judged", "exit_status",
               "finished")
"""A record's keys from a previous run or judgement: cleared when the node is launched again."""
_CONDITION = re.compile(r"^\s*(\S+)\s*(>=|<=|==|>|<)\s*(\S+)\s*$")
_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Success:
    """What a node's runs must show: `metric` reduced per run (`at`, `k`), its mean over seeds of `condition`
    (minus `vs`'s, paired by seed, when `vs` is set), `op` `value`."""

    metric: str
    op: str
    value: float
    at: str = "final"
    k: int = 10
    condition: str | None = None
    vs: str | None = None
    ignore_keys: tuple[str, ...] = ()

    def text(self) -> str:
        at = "" if self.at == "final" else f" (mean of last {self.k})"
        if self.vs:
            return f"Δ {self.metric}{at} of {self.condition} vs {self.vs} {self.op} {self.value:g}"
        return f"{self.metric}{at}{f' of {self.condition}' if self.condition else ''} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Node:
    id: str
    overrides: tuple[str, ...]
    success: Success
    on_success: tuple[str, ...] = ()
    on_failure: tuple[str, ...] = ()
    description: str = ""


@dataclass
class Tree:
    file: Path
    root: Path
    """Where node N's runs go: root/N."""
    overrides: tuple[str, ...]
    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.file.with_name(f"{self.file.stem}.state.json")

    def folder(self, node: str) -> Path:
        return self.root / node

    def parents(self, node: str) -> list[tuple[str, str]]:
        """(parent, the outcome of it that unlocks `node`)."""
        return [(p.id, outcome) for p in self.nodes.values()
                for outcome, children in (("succeeded", p.on_success), ("failed", p.on_failure)) if node in children]


def _strings(value, where: str, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where} must be a list of strings, got {value!r}")
        return ()
    return tuple(value)


def _overrides(value, where: str, problems: list[str]) -> tuple[str, ...]:
    """Overrides as typed on the command line (one string, split as a shell would) or a YAML list of them."""
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        problems.append(f"{where} must be a list of strings, got {value!r}: YAML splits a flow list [seed=0,1] at "
                        "its comma; write one string (seed=0,1 trainer.lr=1e-4) or a block list (- seed=0,1)")
        return ()
    return _strings(value, where, problems)


def _success(raw, where: str, problems: list[str]) -> Success:
    if isinstance(raw, str):
        match = _CONDITION.match(raw)
        if not match:
            problems.append(f"{where}: {raw!r} is not 'metric op value' (op one of {' '.join(OPS)})")
            return Success("?", ">=", 0.0)
        raw = {"metric": match[1], "op": match[2], "value": match[3]}
    if not isinstance(raw, dict):
        problems.append(f"{where} must be 'metric op value' or a mapping with metric, op, value; got {raw!r}")
        return Success("?", ">=", 0.0)
    problems += [f"{where}.{key}: unknown key (expected {', '.join(SUCCESS_KEYS)})" for key in raw
                 if key not in SUCCESS_KEYS]
    problems += [f"{where}.{key} is missing" for key in ("metric", "op", "value") if key not in raw]
    try:
        value = float(raw.get("value", 0.0))
    except (TypeError, ValueError):
        problems.append(f"{where}.value must be a number, got {raw.get('value')!r}")
        value = 0.0
    op = str(raw.get("op", ">="))
    if op not in OPS:
        problems.append(f"{where}.op must be one of {' '.join(OPS)}, got {op!r}")
    at, k = raw.get("at", "final"), raw.get("k", 10)
    if at not in ("final", "last-k"):
        problems.append(f"{where}.at must be final or last-k, got {at!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        problems.append(f"{where}.k must be an integer of at least 1, got {k!r}")
    if raw.get("vs") is not None and raw.get("condition") is None:
        problems.append(f"{where}.vs needs {where}.condition (the condition compared against {raw['vs']!r})")
    return Success(str(raw.get("metric")), op, value, at, k if isinstance(k, int) else 10, raw.get("condition"),
                   raw.get("vs"), _strings(raw.get("ignore_keys"), f"{where}.ignore_keys", problems))


def _node(node_id: str, raw, problems: list[str]) -> Node:
    where = f"nodes.{node_id}"
    if not _ID.match(node_id):
        problems.append(f"{where}: a node id names its folder: letters, digits, _ . - only")
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping with {', '.join(NODE_KEYS)}; got {raw!r}")
        return Node(node_id, (), Success("?", ">=", 0.0))
    problems += [f"{where}.{key}: unknown key (expected {', '.join(NODE_KEYS)})" for key in raw if key not in NODE_KEYS]
    if "success" not in raw:
        problems.append(f"{where}.success is missing (e.g. 'eval/accuracy >= 0.3')")
    overrides = _overrides(raw.get("overrides"), f"{where}.overrides", problems)
    missing = {"metric": "?", "op": ">=", "value": 0}  # reported above
    return Node(node_id, overrides, _success(raw.get("success", missing), f"{where}.success", problems),
                _strings(raw.get("on_success"), f"{where}.on_success", problems),
                _strings(raw.get("on_failure"), f"{where}.on_failure", problems), str(raw.get("description") or ""))


def _check_graph(tree: Tree, problems: list[str]) -> None:
    for node in tree.nodes.values():
        for child in node.on_success + node.on_failure:
            if child not in tree.nodes:
                problems.append(f"nodes.{node.id} unlocks {child!r}, which is not a node ({', '.join(tree.nodes)})")
    for where, overrides in [("overrides", tree.overrides)] + [(f"nodes.{n.id}.overrides", n.overrides)
                                                                for n in tree.nodes.values()]:
        problems += [f"{where}: {o!r} is set by rlvr tree (node N's runs go to {tree.root}/N)" for o in overrides
                     if o.split("=", 1)[0].lstrip("+~") in ("hydra.sweep.dir", "--multirun", "-m")]
    seen: dict[str, int] = {}  # 1 = on the path being walked, 2 = done

    def walk(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            problems.append(f"the nodes unlock each other in a cycle: {' → '.join(path[path.index(node):] + [node])}")
        if seen.get(node):
            return
        seen[node] = 1
        for child in tree.nodes[node].on_success + tree.nodes[node].on_failure:
            if child in tree.nodes:
                walk(child, path + [node])
        seen[node] = 2

    for node_id in tree.nodes:
        walk(node_id, [])


def load_tree(file: Path) -> Tree:
    """The tree file, checked: every problem is listed in one CliError (exit 2)."""
    file = Path(file).resolve()
    try:
        raw = yaml.safe_load(file.read_text())
    except OSError as err:
        raise CliError(f"{file}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise CliError(f"{file}: not YAML: {err}") from err
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), dict) or not raw["nodes"]:
        raise CliError(f"{file}: expected a mapping with `nodes:` (node id → overrides, success, on_success, "
                       "on_failure)")
    problems = [f"{key}: unknown key (expected root, overrides, nodes)" for key in raw
                if key not in ("root", "overrides", "nodes")]
    root = file.parent / str(raw.get("root") or Path("outputs") / file.stem)
    tree = Tree(file, root.resolve(), _overrides(raw.get("overrides"), "overrides", problems))
    tree.nodes = {str(k): _node(str(k), v, problems) for k, v in raw["nodes"].items()}
    _check_graph(tree, problems)
    if problems:
        raise CliError(f"{file}:" + ("".join(f"\n  {p}" for p in problems) if len(problems) > 1 else f" {problems[0]}"))
    return tree


def read_state(tree: Tree) -> dict:
    """node id → its stored record ({} for a node never touched). Written whole by `locked`: never half a file."""
    if not tree.state_file.is_file():
        return {}
    try:
        return json.loads(tree.state_file.read_text()).get("nodes", {})
    except ValueError as err:
        raise CliError(f"{tree.state_file}: not JSON ({err}); fix or delete it (the runs stay)") from err


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def node_state(tree: Tree, states: dict, node: str) -> str:
    """locked | ready | running | interrupted | succeeded | failed | error."""
    outcome = states.get(node, {}).get("outcome")
    if outcome == "running":
        record = states[node]
        pid = record.get("pid")
        live = record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0 or alive(pid)
        return "running" if live else "interrupted"
    if outcome in OUTCOMES:
        return outcome
    return "ready" if unlocked_by(tree, states, node) is not None else "locked"


def unlocked_by(tree: Tree, states: dict, node: str) -> str | None:
    """Why `node` may run: 'root', or 'parent succeeded|failed'; None while locked."""
    parents = tree.parents(node)
    if not parents:
        return "root"
    for parent, outcome in parents:
        if states.get(parent, {}).get("outcome") == outcome:
            return f"{parent} {outcome}"
    return None


def judge(tree: Tree, node: Node) -> dict:
    """The node's value and outcome from the finished runs in its folder (compare's numbers)."""
    from rlvr.cli.compare import compare  # numpy: only for the commands that judge

    folder = tree.folder(node.id)
    success = node.success
    try:
        found = load_runs(folder)
        runs = [r for r in found if r.state() == "finished"]
        if not runs:
            raise CliError(f"none of the {len(found)} runs under {folder} has finished")
        result = compare(runs, success.metric, success.at, success.k, success.vs, success.ignore_keys)
        by_condition = {row["condition"]: row for row in result["conditions"]}
        condition = success.condition or (next(iter(by_condition)) if len(by_condition) == 1 else None)
        if condition is None:
            raise CliError(f"the runs hold {len(by_condition)} conditions ({', '.join(by_condition)}): name one "
                           f"in nodes.{node.id}.success.condition")
        if condition not in by_condition:
            raise CliError(f"no finished run of {condition} under {folder}; conditions: {', '.join(by_condition)}")
        estimate = by_condition[condition]["diff"] if success.vs else by_condition[condition]
        if estimate["mean"] is None:
            raise CliError(f"no seed has finished runs of both {condition} and {success.vs}")
    except CliError as err:
        return {"outcome": "error", "reason": str(err), "value": None}
    held = OPS[success.op](estimate["mean"], success.value)
    return {"outcome": "succeeded" if held else "failed", "reason": None, "value": estimate["mean"],
            "condition": condition, "seeds": estimate["seeds"], "ci95": estimate["ci95"],
            "runs": len(runs), "runs_found": len(found), "judged": _now()}


def _record(tree: Tree, node: str, **changes) -> dict:
    """Apply `changes` to the node's record (None deletes a key) under the state file's lock; the new record."""
    with locked(tree.state_file) as state:
        state["file"] = tree.file.name
        record = state.setdefault("nodes", {}).setdefault(node, {})
        for key, value in changes.items():
            if value is None:
                record.pop(key, None)
            else:
                record[key] = value
        return dict(record)


def _require(tree: Tree, node: str | None) -> str:
    if node not in tree.nodes:
        raise CliError(f"no node {node!r} in {tree.file.name}; nodes: {', '.join(tree.nodes)}")
    return node


def _unlocks(node: Node, outcome: str) -> tuple[str, ...]:
    return {"succeeded": node.on_success, "failed": node.on_failure}.get(outcome, ())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _judged_line(tree: Tree, node: Node, record: dict) -> str:
    if record["outcome"] == "error":
        return f"{node.id}: error: {record.get('reason')}"
    unlocks = _unlocks(node, record["outcome"])
    return (f"{node.id}: {record['outcome']}: {node.success.text()}: {record['value']:.4f} "
            f"({_count(len(record.get('seeds') or []), 'seed')}, {_count(record['runs'], 'finished run')})"
            + (f"; unlocks {', '.join(unlocks)}" if unlocks else ""))


def command(tree: Tree, node: Node, train: Path) -> list[str]:
    """What `run` launches: the multirun a user would type, its folder pinned to the node's."""
    return [sys.executable, str(train), "--multirun", *tree.overrides, *node.overrides,
            f"hydra.sweep.dir={tree.folder(node.id)}"]


def run_node(tree: Tree, node_id: str, train: Path, force: bool) -> tuple[str, int]:
    states = read_state(tree)
    node = tree.nodes[_require(tree, node_id)]
    state = node_state(tree, states, node_id)
    if state == "running":
        record = states[node_id]
        raise CliError(f"{node_id} is running (pid {record.get('pid')}, since {record.get('started')})")
    if state == "locked" and not force:
        wanted = " or ".join(f"{p} {o}" for p, o in tree.parents(node_id))
        raise CliError(f"{node_id} is locked: it runs once {wanted} (or pass --force)")
    if state in OUTCOMES and not force:
        raise CliError(f"{node_id} already {state}; `rlvr tree {tree.file.name} reset {node_id}` forgets that "
                       "(or pass --force)")
    if not Path(train).is_file():
        raise CliError(f"{train}: no such file; `rlvr tree run` launches `python train.py --multirun …` from the rlvr "
                       "checkout: run it there, or pass --train PATH")
    argv = command(tree, node, train)
    print(f"rlvr tree: {node_id}: {shlex.join(argv)}", flush=True)
    _record(tree, node_id, outcome="running", started=_now(), host=socket.gethostname(), pid=os.getpid(),
            command=argv, overrides=list(tree.overrides + node.overrides), **dict.fromkeys(RESULT_KEYS))
    proc = subprocess.Popen(argv)
    interrupted = False
    while True:
        try:
            status = proc.wait()
            break
        except KeyboardInterrupt:  # the multirun got the Ctrl-C too: it checkpoints and exits; killing it would not
            interrupted = True
    from rlvr.preemption import INTERRUPT_EXIT_CODE

    if interrupted or status == INTERRUPT_EXIT_CODE:  # also a Ctrl-C that reached the multirun alone
        _record(tree, node_id, outcome="error", exit_status=status, finished=_now(),
                reason=f"interrupted (Ctrl-C; the multirun exited with status {status})")
        return f"{node_id}: interrupted; `rlvr tree {tree.file.name} run {node_id} --force` continues it", 130
    if status != 0:
        record = _record(tree, node_id, outcome="error", exit_status=status, finished=_now(),
                         reason=f"the multirun exited with status {status}")
        return _judged_line(tree, node, record), 1
    record = _record(tree, node_id, exit_status=0, finished=_now(), **judge(tree, node))
    return _judged_line(tree, node, record), 1 if record["outcome"] == "error" else 0


def eval_nodes(tree: Tree, node_id: str | None) -> tuple[list[str], list[dict]]:
    """Judge again every node (or `node_id`) whose folder holds runs; a running node is left alone."""
    states = read_state(tree)
    lines, judged = [], []
    for node in [tree.nodes[_require(tree, node_id)]] if node_id else list(tree.nodes.values()):
        if node_state(tree, states, node.id) == "running":
            lines.append(f"{node.id}: running, not judged")
            continue
        try:
            find_run_dirs(tree.folder(node.id))
        except CliError:
            if node_id:
                lines.append(f"{node.id}: no runs under {tree.folder(node.id)}")
            continue
        record = _record(tree, node.id, **judge(tree, node))
        lines.append(_judged_line(tree, node, record))
        judged.append({"node": node.id, **record})
    return lines or ["no node has runs yet"], judged


def describe(tree: Tree) -> dict:
    """Every node with its state, record and children: what `view --json` prints."""
    states = read_state(tree)
    nodes = []
    for node in tree.nodes.values():
        record = states.get(node.id, {})
        ran = record.get("overrides")
        nodes.append({
            "id": node.id, "state": node_state(tree, states, node.id),
            "unlocked_by": unlocked_by(tree, states, node.id),
            "description": node.description, "success": node.success.text(), "overrides": list(node.overrides),
            "on_success": list(node.on_success), "on_failure": list(node.on_failure),
            "folder": str(tree.folder(node.id)), "record": record, "notes": record.get("notes", []),
            "changed_since_run": ran is not None and ran != list(tree.overrides + node.overrides),
        })
    ready = [n["id"] for n in nodes if n["state"] == "ready"]
    return {"file": str(tree.file), "state_file": str(tree.state_file), "root": str(tree.root), "nodes": nodes,
            "next": ready}


def _detail(entry: dict) -> str:
    record = entry["record"]
    if entry["state"] in ("succeeded", "failed"):
        text = f"{entry['success']}: {record['value']:.4f} ({_count(len(record.get('seeds') or []), 'seed')})"
    elif entry["state"] == "error":
        text = str(record.get("reason"))
    elif entry["state"] in ("running", "interrupted"):
        text = f"since {record.get('started')} (pid {record.get('pid')})"
    else:
        text = f"wants {entry['success']}"
    return text + (" [overrides changed since it ran]" if entry["changed_since_run"] else "")


def render(view: dict) -> str:
    """The nodes as a tree from the roots; a child is marked ✓ (unlocked when its parent succeeds) or ✗ (fails);
    a node reached again is named, not repeated."""
    by_id = {n["id"]: n for n in view["nodes"]}
    rows: list[tuple[str, str, str]] = []
    shown: set[str] = set()

    def walk(node_id: str, depth: int, mark: str) -> None:
        entry = by_id[node_id]
        name = "  " * depth + mark + node_id
        if node_id in shown:
            rows.append((name, entry["state"], "(above)"))
            return
        shown.add(node_id)
        rows.append((name, entry["state"], _detail(entry)))
        for note in entry["notes"]:
            rows.append(("  " * (depth + 1) + "· note", "", f"{note['at'][:16].replace('T', ' ')}  {note['text']}"))
        for child in entry["on_success"]:
            walk(child, depth + 1, "✓ ")
        for child in entry["on_failure"]:
            walk(child, depth + 1, "✗ ")

    for entry in view["nodes"]:
        if entry["unlocked_by"] == "root" or not any(entry["id"] in n["on_success"] + n["on_failure"]
                                                     for n in view["nodes"]):
            walk(entry["id"], 0, "")
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    counts = {s: sum(n["state"] == s for n in view["nodes"]) for s in dict.fromkeys(n["state"] for n in view["nodes"])}
    lines = [f"{Path(view['file']).name}: " + ", ".join(f"{c} {s}" for s, c in counts.items())
             + f"; runs under {view['root']}/<node>; state in {Path(view['state_file']).name}"]
    lines += [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}".rstrip() for a, b, c in rows]
    lines.append("✓ unlocked when its parent succeeds, ✗ when it fails; next: " + (", ".join(view["next"]) or "none"))
    return "\n".join(lines)


def next_nodes(tree: Tree) -> list[dict]:
    view = describe(tree)
    return [{"id": n["id"], "unlocked_by": n["unlocked_by"], "success": n["success"],
             "command": f"rlvr tree {tree.file.name} run {n['id']}",
             "overrides": list(tree.overrides) + n["overrides"]} for n in view["nodes"] if n["state"] == "ready"]


def run(args: argparse.Namespace) -> tuple[str, int]:
    """Dispatch `rlvr tree FILE ACTION …`: (what to print, exit status)."""
    tree = load_tree(args.file)
    action = args.action or "view"
    if action == "view":
        view = describe(tree)
        return (json.dumps(view, indent=2) if args.json else render(view)), 0
    if action == "next":
        ready = next_nodes(tree)
        if args.json:
            return json.dumps(ready, indent=2), 0
        return "\n".join(f"{n['id']} ({n['unlocked_by']}): {n['command']}    # wants {n['success']}"
                         for n in ready) or "no node is ready: every unlocked node has run", 0
    if action == "run":
        text, code = run_node(tree, args.node, args.train, args.force)
        return (json.dumps(read_state(tree)[args.node], indent=2) if args.json else text), code
    if action == "eval":
        lines, judged = eval_nodes(tree, args.node)
        return (json.dumps(judged, indent=2) if args.json else "\n".join(lines)), 0
    node = _require(tree, args.node)
    if action == "note":
        with locked(tree.state_file) as state:
            record = state.setdefault("nodes", {}).setdefault(node, {})
            record["notes"] = [*record.get("notes", []), {"at": _now(), "text": args.text}]
        return (json.dumps(record, indent=2) if args.json else f"{node}: {_count(len(record['notes']), 'note')}"), 0
    with locked(tree.state_file) as state:  # reset: everything but the notes
        before = state.setdefault("nodes", {}).get(node, {})
        state["nodes"][node] = {"notes": before["notes"]} if before.get("notes") else {}
    was = before.get("outcome") or "never run"
    kept = _count(len(before.get("notes", [])), "note")
    text = (f"{node}: outcome forgotten (was {was}); {kept} kept; its runs under {tree.folder(node)} stay (delete "
            "them to train from scratch)")
    return (json.dumps(state["nodes"][node], indent=2) if args.json else text), 0
