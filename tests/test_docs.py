"""Docs that cannot rot: README.md's options table is what conf/ gives (tools/readme_table.py), code cites
docs/ rather than the spec or notes its readers do not have, and every docs/<page>.md#<anchor> cited exists."""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def readme_table():
    spec = importlib.util.spec_from_file_location("tools_readme_table", ROOT / "tools" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_readme_options_table_is_the_one_conf_gives(readme_table):
    current = (ROOT / "README.md").read_text()
    wanted = readme_table.rewrite(current)
    diff = "\n".join(difflib.unified_diff(current.split("\n"), wanted.split("\n"), "README.md", "generated",
                                          lineterm="", n=0))
    assert wanted == current, f"README.md's options table is stale: run `{readme_table.COMMAND}`\n{diff}"


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
    sources = [*(ROOT / "rlvr").rglob("*.py"), *(ROOT / "conf").rglob("*.yaml"), ROOT / "README.md",
               *(ROOT / "docs").glob("*.md")]
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


def test_readme_needs_table_is_what_the_components_declare():
    """README.md's table of what each backend and engine honours and refuses is the start-up rule's own answer
    (tools/needs_table.py composes each cell and asks rlvr.config_check.unmet_needs)."""
    spec = importlib.util.spec_from_file_location("tools_needs_table", ROOT / "tools" / "needs_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    current = (ROOT / "README.md").read_text()
    wanted = module.rewrite(current)
    diff = "\n".join(difflib.unified_diff(current.split("\n"), wanted.split("\n"), "README.md", "generated",
                                          lineterm="", n=0))
    assert wanted == current, f"README.md's needs table is stale: run `{module.COMMAND}`\n{diff}"
    assert "| update capture (`trainer.capture_steps=[0]`) | refused | yes |" in current  # fsdp refuses, local not
