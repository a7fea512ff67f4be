"""Docs that cannot rot: docs/configuration.md's tables are what conf/ and the components give
(tools/readme_table.py, tools/needs_table.py), code cites docs/ rather than the spec or notes its readers do not
have, every docs/<page>.md#<anchor> cited and every relative link of README.md and docs/ resolves, README.md stays a
manual (short, a table of contents, a map naming every folder and module of rlvr/), and each measured figure has one
page saying its machine and the command that remeasures it."""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MEASURED = ROOT / "docs" / "measured"


@pytest.fixture(scope="module")
def readme_table():
    spec = importlib.util.spec_from_file_location("tools_readme_table", ROOT / "tools" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_options_table_is_the_one_conf_gives(readme_table):
    current = readme_table.PAGE.read_text()
    wanted = readme_table.rewrite(current)
    diff = "\n".join(difflib.unified_diff(current.split("\n"), wanted.split("\n"), "docs/configuration.md",
                                          "generated", lineterm="", n=0))
    assert wanted == current, f"docs/configuration.md's options table is stale: run `{readme_table.COMMAND}`\n{diff}"


def test_the_table_lists_every_option_file_of_conf(readme_table):
    table = readme_table.table()
    conf = ROOT / "conf"
    missing = [f"{p.parent.relative_to(conf).as_posix()}={p.stem}" for p in conf.rglob("*.yaml")
               if p.parent != conf and f"`{p.stem}`" not in table]
    assert not missing
    assert "| `env` |" in table and "| `turn_credit` |" in table and "| `hydra/launcher` |" in table


def test_aliases_are_files_that_only_name_a_sibling(readme_table):
    assert readme_table.alias_of("transform", "gtpo_sepa") == "sepa"
    assert readme_table.alias_of("transform", "gtpo_hicra") == "hicra"
    assert readme_table.alias_of("transform", "sepa_amp") is None        # extends sepa, sets its own _target_
    assert readme_table.alias_of("model", "qwen3_0_6b") is None          # extends pretrained with a hub id
    assert "(+ aliases `gtpo_hicra` = `hicra`, `gtpo_sepa` = `sepa`)" in readme_table.table()


def test_code_cites_docs_not_the_spec_or_notes():
    """Readers of the repository have docs/, not the spec or the notes: a fact the code leans on lives in docs/."""
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "rlvr").rglob("*.py"))
             for n, line in enumerate(path.read_text().split("\n"), 1)
             if re.search(r"spec §|notes/", line)]
    assert not cited, "cite docs/<page>.md#<anchor> instead:\n" + "\n".join(cited)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercased, punctuation but `-` and `_` dropped, spaces → `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_docs_anchor_cited_exists():
    anchors = {page.name: {github_anchor(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}
               for page in (ROOT / "docs").glob("*.md")}
    sources = [*(ROOT / "rlvr").rglob("*.py"), *(ROOT / "conf").rglob("*.yaml"), *DOCS]
    broken = []
    for path in sources:
        text = path.read_text()
        for page, anchor in re.findall(r"docs/([\w-]+\.md)#([\w-]+)", text):
            if anchor not in anchors.get(page, ()):
                broken.append(f"{path.relative_to(ROOT)}: docs/{page}#{anchor}")
        if path.parent.name == "docs":  # a page's links to its own headings: ](#anchor)
            broken += [f"{path.relative_to(ROOT)}: #{a}" for a in re.findall(r"\]\(#([\w-]+)\)", text)
                       if a not in anchors[path.name]]
    assert not broken, "no such heading:\n" + "\n".join(broken)


def test_needs_table_is_what_the_components_declare():
    """docs/configuration.md's table of what each backend and engine honours and refuses is the start-up rule's own
    answer (tools/needs_table.py composes each cell and asks the rule)."""
    spec = importlib.util.spec_from_file_location("tools_needs_table", ROOT / "tools" / "needs_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    current = (ROOT / "docs" / "configuration.md").read_text()
    wanted = module.rewrite(current)
    diff = "\n".join(difflib.unified_diff(current.split("\n"), wanted.split("\n"), "docs/configuration.md",
                                          "generated", lineterm="", n=0))
    assert wanted == current, f"docs/configuration.md's needs table is stale: run `{module.COMMAND}`\n{diff}"
    assert "| update capture (`trainer.capture_steps=[0]`) | refused | yes |" in current  # fsdp refuses, local not


def _headings(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # a code block's `# comment`: no heading
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_resolves():
    """Every `[text](target)` of README.md and docs/ that is not a URL names a file that exists, and its `#anchor`,
    if any, a heading of that file."""
    broken = []
    for page in DOCS:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _headings(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_is_a_manual_with_a_table_of_contents():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split("\n")) <= 300, "README.md is a manual of at most ~300 lines: move the details to docs/"
    sections = [github_anchor(h) for h in re.findall(r"^## (.+)$", readme, re.M) if h != "Contents"]
    contents = readme.split("## Contents", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"\]\(#([\w-]+)\)", contents) == sections, "the contents list every ## section, in order"


def test_readme_keeps_the_two_commands():
    """.ci/run runs the second line exactly as written; the first is a new user's first run."""
    readme = (ROOT / "README.md").read_text()
    assert 'pip install torch==2.13.0 -e . && python train.py        # the embedded default' in readme
    assert 'pip install torch==2.13.0 -e ".[dev]" && pytest          # the tests' in readme
    assert 'pip install torch==2.13.0 -e ".[dev]" && pytest' in (ROOT / ".ci" / "run").read_text()


def test_readme_file_map_names_every_folder_and_module_of_rlvr():
    readme = (ROOT / "README.md").read_text()
    the_map = readme.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w.]+/?)`", the_map))
    rlvr = ROOT / "rlvr"
    present = {f"{p.name}/" for p in rlvr.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    present |= {p.name for p in rlvr.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(present - named)
    assert not missing, f"README.md's map of rlvr/ (\"Where the code lives\") lacks: {missing}"


def test_each_measured_page_says_its_machine_and_command_and_is_listed():
    index = (MEASURED / "README.md").read_text()
    pages = sorted(p for p in MEASURED.glob("*.md") if p.name != "README.md")
    assert len(pages) >= 10
    for page in pages:
        text = page.read_text()
        assert re.search(r"^\*\*Machine:\*\* \S", text, re.M), f"{page.name} does not say which machine measured it"
        assert re.search(r"^\*\*Remeasure:\*\* \S", text, re.M), f"{page.name} does not give the command to remeasure"
        assert f"]({page.name})" in index, f"docs/measured/README.md does not list {page.name}"


def _maze_rows(text: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in text.split("\n") if line.startswith("| GRPO") or line.startswith("| PKPO")
            or line.startswith("| MaxRL") or line.startswith("| RLOO")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}


def test_readme_maze_table_is_the_measured_pages():
    """README.md shows the maze table short: rlvr's pass@1, pass@32 and Δ pass@32, copied from the one page that
    holds the measurement (columns 4, 5 and 7 of its first table: an earlier run's follows under a heading)."""
    readme = _maze_rows((ROOT / "README.md").read_text())
    measured = _maze_rows((MEASURED / "maze-passk.md").read_text().split("\n## ")[0])
    assert len(readme) == 5 and readme.keys() == measured.keys()
    for method, cells in readme.items():
        assert cells == [measured[method][3], measured[method][4], measured[method][6]], method


def test_stage_table_is_what_the_stages_declare():
    """docs/metrics.md's table of the step's stages and their row fields is the stages' own declaration
    (tools/stage_table.py; tests/test_trainer.py holds a real run's rows to it)."""
    spec = importlib.util.spec_from_file_location("tools_stage_table", ROOT / "tools" / "stage_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    current = (ROOT / "docs" / "metrics.md").read_text()
    assert module.rewrite(current) == current, f"docs/metrics.md's stage table is stale: run `{module.COMMAND}`"
