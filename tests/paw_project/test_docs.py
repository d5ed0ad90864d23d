"""The documents hold to the tree: every relative link in README.md and docs/*.md leads
somewhere (a file of the repository and, for a ``#anchor``, a heading of that file, by
GitHub's slugs); the README's map names every package and module; docs/api.md's endpoint
table lists exactly the operations of the OpenAPI schema, and the schema every route
under ``/api/``."""

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


# --- docs/api.md's endpoint table against the OpenAPI schema ------------------------------

_ENDPOINT = re.compile(r"^((?:[A-Z]+/)*[A-Z]+) (/\S+)$")
_PARAMETER = re.compile(r"\{[^}]*\}")


def _operation(method: str, path: str) -> str:
    """``"GET /api/conversations/{}"``: one operation, its path parameters unnamed (the
    table says ``{id}`` where the schema says ``{conversation_id}``)."""
    return f"{method} {_PARAMETER.sub('{}', path)}"


def documented_operations(text: str) -> tuple[list[str], list[str]]:
    """The operations of the first table under ``## Endpoints`` in a docs/api.md text, in
    the order written, and the code spans of its first column that do not read as
    ``METHOD[/METHOD…] /path[?query]``. A row may name several such spans."""
    section = text.split("\n## Endpoints\n", 1)[1].split("\n#", 1)[0]
    operations, unreadable = [], []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line[1:].split(" | ", 1)[0]
        for span in re.findall(r"`([^`]+)`", first_cell):
            match = _ENDPOINT.match(span)
            if not match:
                unreadable.append(span)
                continue
            methods, path = match.groups()
            for method in methods.split("/"):
                operations.append(_operation(method, path.split("?", 1)[0]))
    return operations, unreadable


def schema_operations() -> set[str]:
    """Every operation of the OpenAPI schema that ``/api/schema/`` serves, generated in
    the process by drf-spectacular."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {
        _operation(method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
    }


def endpoint_table_problems(text: str, schema: set[str]) -> list[str]:
    """What is wrong with the endpoint table against the schema's operations: an
    operation it leaves out, a row's operation the schema does not have, one written
    twice, a first-column code span that is no ``METHOD /path``."""
    documented, unreadable = documented_operations(text)
    problems = [f"not in the table: {op}" for op in sorted(schema - set(documented))]
    problems += [f"no such operation: {op}" for op in sorted(set(documented) - schema)]
    seen: set[str] = set()
    for op in documented:
        if op in seen:
            problems.append(f"written twice: {op}")
        seen.add(op)
    problems += [f"not METHOD /path: {span}" for span in unreadable]
    return problems


def test_the_endpoint_table_names_every_operation_of_the_schema_and_no_other():
    """docs/api.md's endpoint table and the OpenAPI schema list the same operations, so a
    new endpoint without its row (or a row left from a removed one) fails the suite."""
    schema = schema_operations()
    assert {"GET /api/conversations/{}", "POST /api/approvals/{}/decision"} <= schema
    assert endpoint_table_problems((ROOT / "docs" / "api.md").read_text(), schema) == []


# Served beside the API, not part of it: named in docs/api.md's opening paragraph.
_SCHEMA_ROUTES = {"/api/schema/", "/api/docs/"}


def api_routes() -> set[str]:
    """The path of every URL route under ``/api/``, parameters unnamed as in
    :func:`_operation`, less the catch-all that answers unknown API paths with a 404."""
    from django.urls import URLResolver, get_resolver

    def walk(patterns, prefix: str):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            else:
                yield route

    converter = re.compile(r"<(?:\w+:)?\w+>")
    return {
        "/" + converter.sub("{}", route)
        for route in walk(get_resolver().url_patterns, "")
        if route.startswith("api/")
    } - {"/^api/"}


def test_every_api_route_is_in_the_schema():
    """No view under ``/api/`` is left out of the schema (a plain Django view, or one
    excluded from it), where the table check above would not see it."""
    schema_paths = {operation.split(" ", 1)[1] for operation in schema_operations()}
    docs = (ROOT / "docs" / "api.md").read_text()
    assert [route for route in sorted(_SCHEMA_ROUTES) if f"`{route}`" not in docs] == []
    assert "/api/conversations/{}/artifacts/{}" in api_routes()
    assert sorted(api_routes() - _SCHEMA_ROUTES - schema_paths) == []


def test_the_endpoint_table_check_finds_what_is_wrong():
    text = (
        "# API\n\n## Endpoints\n\n| method and path | what | answers |\n|---|---|---|\n"
        "| `GET /api/things?page=1` | list | 200 |\n"
        "| `GET/DELETE /api/things/{id}`, `POST /api/things/{id}/go` | one | 200 \\| 204 |\n"
        "| `PATCH /api/gone/{x}` | removed | 200 |\n"
        "| `GET /api/things` | again | 200 |\n"
        "| `the things` | not an endpoint | 200 |\n"
        "\nprose with `GET /api/elsewhere`\n\n## Websockets\n\n| `GET /api/later` | | |\n"
    )
    schema = {
        "GET /api/things",
        "POST /api/things",
        "GET /api/things/{}",
        "DELETE /api/things/{}",
        "POST /api/things/{}/go",
    }
    assert documented_operations(text)[0] == [
        "GET /api/things",
        "GET /api/things/{}",
        "DELETE /api/things/{}",
        "POST /api/things/{}/go",
        "PATCH /api/gone/{}",
        "GET /api/things",
    ]
    assert endpoint_table_problems(text, schema) == [
        "not in the table: POST /api/things",
        "no such operation: PATCH /api/gone/{}",
        "written twice: GET /api/things",
        "not METHOD /path: the things",
    ]
