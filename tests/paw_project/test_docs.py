"""Every relative link in README.md and docs/*.md leads somewhere: to a file of the
repository and, for a ``#anchor``, to a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from tests.processes import ROOT

# [text](target) and [text](target "title"); images too. Not <http://…> autolinks.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped
    (letters, digits, ``_``, ``-`` and spaces stay), each space a ``-``."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = []
    for char in text:
        category = unicodedata.category(char)
        if char in " -_" or category[0] in "LN" or category == "Mn":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings; a repeated slug gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, line in _prose_lines(path.read_text()):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: …
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not linked.exists():
                problems.append(f"{where} (no such file)")
            elif not linked.is_relative_to(ROOT):
                problems.append(f"{where} (outside the repository)")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                problems.append(f"{where} (no such heading)")
    return problems


def test_github_slugs():
    assert github_slug("The agent runtime: `paw-agent`") == "the-agent-runtime-paw-agent"
    assert github_slug("Spare sandboxes (`PAW_SANDBOX_SPARES`)") == "spare-sandboxes-paw_sandbox_spares"
    assert github_slug("The web server, and what a request may cost") == (
        "the-web-server-and-what-a-request-may-cost"
    )
    assert github_slug("PAW — Python Agent Web") == "paw--python-agent-web"


@pytest.mark.parametrize("path", documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.paw_project.test_docs.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Some heading\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#some-heading) [ok](#top) ![ok](docs/a.md)\n"
        "# Top\n"
        "```\n[in code](nowhere.md)\n```\n"
        "`[in a code span](nowhere.md)` <https://example.org/> [web](https://example.org/x)\n"
        "[gone](docs/b.md) [no heading](docs/a.md#other) [here](#nothing)\n"
    )
    assert broken_links(doc) == [
        "README.md:7: docs/b.md (no such file)",
        "README.md:7: docs/a.md#other (no such heading)",
        "README.md:7: #nothing (no such heading)",
    ]


def _map() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## A map of the repository")
    return readme[start : readme.index("\n## ", start + 1)]


def test_the_readme_map_names_every_package():
    """Every package of the tree (a folder with an ``__init__.py`` or a ``pyproject.toml``
    at the top, or under ``clients/``) has its line in the README's map."""
    packages = {
        path.parent.relative_to(ROOT).as_posix()
        for pattern in ("*/__init__.py", "*/pyproject.toml", "clients/*/pyproject.toml")
        for path in ROOT.glob(pattern)
        if path.parent.name not in {"tests", ".venv"}
    }
    assert {"paw_project", "sandboxes", "paw_agent", "clients/python"} <= packages
    assert [p for p in sorted(packages) if f"`{p}/`" not in _map()] == []


def test_the_readme_map_names_every_module_of_sandboxes_and_paw_project():
    """The "which side" table has a row for each module of ``sandboxes/``, and the
    ``paw_project/`` line names each of its modules."""
    table = {
        name
        for line in _map().splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([\w/]+(?:\.py)?)`", line.split(" | ")[0])
    }
    modules = {p.name for p in (ROOT / "sandboxes").glob("*.py")} - {"__init__.py", "apps.py"}
    assert sorted(modules - table) == []
    line = _map().split("- `paw_project/`", 1)[1].split("\n- ", 1)[0]
    modules = {p.name for p in (ROOT / "paw_project").glob("*.py")} - {"__init__.py", "apps.py"}
    assert sorted(m for m in modules if f"`{m}`" not in line) == []
