"""The import graph of rlvr/ has no cycle (type-only imports and imports inside functions included), neither between
modules nor between folders, and the seams (rlvr/protocols.py, rlvr/types.py) import no implementation module.

A folder is a subpackage of rlvr/ (its subpackages included: rlvr/cli/doctor/ is rlvr/cli/); a top-level module is a
node of its own at the root. The root as one node would be a loop by construction: it holds both the seams every
folder imports (types, protocols) and the entry points that import every folder (run, build)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlvr"

SEAMS = {"rlvr.protocols", "rlvr.types"}
SEAM_MAY_IMPORT = SEAMS
"""What the seams may import of rlvr: each other only (not even rlvr.lazy: the seams hold no code that loads a
library, so they have nothing to load lazily)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every rlvr module `name` imports, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    resolved = set()
    for module in found:
        if module.split(".")[0] != "rlvr":
            continue
        while module not in known and "." in module:  # `import rlvr.x.y` of a name that is not a module
            module = module.rsplit(".", 1)[0]
        if module in known and module != name:
            resolved.add(module)
    return resolved


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components of more than one module (a module does not import itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def a_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, by breadth-first search inside the component."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def folder(module: str) -> str:
    """`rlvr.<sub>` for a module anywhere under the subpackage rlvr/<sub>/; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def folder_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folder imports which other folder (module docstring)."""
    folders: dict[str, set[str]] = {}
    for module, imported in edges.items():
        folders.setdefault(folder(module), set()).update(folder(i) for i in imported)
    return {name: imported - {name} for name, imported in folders.items()}


def test_the_import_graph_has_no_cycle():
    edges = graph()
    cycles = [" → ".join(a_cycle(edges, component)) + f"   (component: {', '.join(component)})"
              for component in strongly_connected(edges)]
    assert not cycles, "import cycles in rlvr/:\n" + "\n".join(cycles)


def test_no_import_loop_between_folders():
    edges = folder_graph(graph())
    loops = [" → ".join(a_cycle(edges, component)) + f"   (folders: {', '.join(component)})"
             for component in strongly_connected(edges)]
    assert not loops, "import loops between folders of rlvr/:\n" + "\n".join(loops)


def test_the_seams_import_no_implementation():
    edges = graph()
    for seam in sorted(SEAMS):
        assert edges[seam] <= SEAM_MAY_IMPORT, f"{seam} imports {sorted(edges[seam] - SEAM_MAY_IMPORT)}"


def test_the_cycle_finder_finds_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert a_cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_the_folder_graph_finds_a_loop_through_a_top_level_module():
    edges = {"rlvr.tools.render": {"rlvr.rollout.chat_turns"}, "rlvr.rollout.chat_turns": {"rlvr.telemetry"},
             "rlvr.rollout.episodes": {"rlvr.tools.render", "rlvr.types"}, "rlvr.telemetry": {"rlvr.env.guarded"},
             "rlvr.env.guarded": {"rlvr.types"}, "rlvr.types": set(), "rlvr.cli.doctor.machine": {"rlvr.cli.main"},
             "rlvr.cli.main": set()}
    folders = folder_graph(edges)
    assert folders["rlvr.cli"] == set() and folders["rlvr.rollout"] == {"rlvr.tools", "rlvr.telemetry", "rlvr.types"}
    assert strongly_connected(folders) == [["rlvr.rollout", "rlvr.tools"]]
