"""Every write of a ``Sandbox`` or ``WorkerNode`` row goes through a named service of
``sandboxes/records.py``: a structural test (an AST scan of PAW's own packages), so a
new write elsewhere fails here rather than becoming one more place the node's state
changes from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "paw_project", "accounts", "conversations", "sandboxes", "billing", "secrets_vault", "sso",
)  # fmt: skip
MODELS = {"Sandbox", "WorkerNode"}
#: The one module allowed to write the rows.
RECORDS = ROOT / "sandboxes" / "records.py"
#: What writes a row: a manager's or queryset's write, or an instance's.
WRITES = {
    "save", "delete", "update", "create", "get_or_create", "update_or_create", "bulk_create",
    "bulk_update", "raw",
}  # fmt: skip


def _root_name(node: ast.AST) -> str | None:
    """The name a chain like ``Sandbox.objects.filter(...).update`` starts from."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def row_writes(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of each write of a ``Sandbox`` / ``WorkerNode`` row in ``source``:
    a write call on a chain starting from either model (or a name it is imported as),
    and, in a module that imports either, any ``.save()`` / ``.delete()`` of an
    instance (a row fetched first, then written)."""
    tree = ast.parse(source)
    models = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("sandboxes.models"):
            models |= {alias.asname or alias.name for alias in node.names if alias.name in MODELS}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in WRITES:
            continue
        root = _root_name(node.func.value)
        if root in models or root in MODELS:
            found.append((node.lineno, f"{root}….{node.func.attr}()"))
        elif models and node.func.attr in ("save", "delete"):
            found.append((node.lineno, f"{root}.{node.func.attr}()"))
    return found


def test_the_scan_finds_the_writes_it_must():
    source = (
        "from sandboxes.models import Sandbox, WorkerNode as Node\n"
        "Sandbox.objects.filter(id=1).update(state='dead')\n"
        "Node.objects.update_or_create(name='n')\n"
        "row = Sandbox.objects.get(id=1)\n"
        "row.save()\n"
        "Sandbox.objects.select_for_update().filter(id=1)[0].delete()\n"
        "Sandbox.objects.filter(id=1).exists()\n"
    )
    assert [line for line, _ in row_writes(source)] == [2, 3, 5, 6]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_sandbox_or_node_row_is_written_outside_the_records_module(package):
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path == RECORDS or "migrations" in path.parts:
            continue
        for line, what in row_writes(path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, (
        "a Sandbox / WorkerNode row is written outside sandboxes/records.py (add a named "
        "service there and call it):\n" + "\n".join(offenders)
    )


def test_the_records_module_writes_the_rows():
    """The scan sees the writes where they belong (it would pass vacuously otherwise)."""
    assert len(row_writes(RECORDS.read_text())) >= 10
