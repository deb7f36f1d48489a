"""Every relative link and every repository path named in README.md and docs/ exists: a doc
that names a file a newcomer cannot find is a broken doc."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target) with an optional #anchor
# A path in backticks: starts at a top-level directory of the repository and names a file
# (by its extension) or a directory (trailing slash). Env ids (`auturi/Slow-v0`) and log keys
# (`auturi/steps_per_second`) have neither, so they are not taken for paths.
TOP = "auturi|src|bench|tests|docs|examples|\\.ci"
PATH = re.compile(rf"`((?:{TOP})/[\w./-]*?(?:\.(?:py|md|json|png|html|toml|txt|cfg|sh)|/))`")


def _targets(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text()
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        out.append((target, (doc.parent / target).resolve()))
    for m in PATH.finditer(text):
        out.append((m.group(1), ROOT / m.group(1)))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_and_named_path_exists(doc: Path):
    missing = [name for name, path in _targets(doc) if not path.exists()]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_link_leaves_the_repository(doc: Path):
    outside = [name for name, path in _targets(doc) if ROOT not in path.parents and path != ROOT]
    assert not outside, f"{doc.relative_to(ROOT)} links outside the repository: {outside}"


def test_the_checks_see_paths_and_links():
    """The patterns find what they should (so an empty result means no broken path, not no check)."""
    names = [n for doc in DOCS for n, _ in _targets(doc)]
    assert any(n.startswith("bench/") for n in names) and any(n.endswith(".md") for n in names)


def _table_rows(text: str) -> list[list[str]]:
    """The markdown tables of ``text`` (outside code blocks), each as its lines."""
    tables, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            current.append(line)
            continue
        if current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(line: str) -> int:
    """Cells of a table line as a markdown renderer counts them: a `|` in a code span splits a
    cell too, unless escaped as `\\|`."""
    return len(re.split(r"(?<!\\)\|", line.strip().strip("|")))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_table_row_has_its_headers_cells(doc: Path):
    bad = []
    for table in _table_rows(doc.read_text()):
        want = _cells(table[0])
        bad += [line for line in table[1:] if _cells(line) != want]
    assert not bad, f"{doc.relative_to(ROOT)}: rows whose cells do not match their header (unescaped |?): {bad[:3]}"
