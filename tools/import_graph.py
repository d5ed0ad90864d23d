"""Print the import graph between PAW's top-level packages and check it has no cycle
(``make imports``; the contracts that hold the shape are import-linter's, in
``pyproject.toml``).

For each pair ``importer -> imported`` of packages: the modules that carry the imports
(imports under ``TYPE_CHECKING`` do not count: they never run). Then two checks, exit
status 1 when one fails:

- no import cycle between modules, anywhere;
- no cycle between the apps once the one allowed edge back is set aside: the domain
  (``conversations``) enqueuing the node's tasks through ``sandboxes.enqueue`` (the Celery
  edge, which imports nothing of ``conversations``). ``paw_project`` is not an app: it is
  the project's configuration (settings, ASGI and Celery wiring, which import the apps)
  and what every app shares (errors, broadcast, middleware).

Uses grimp, import-linter's own graph builder.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp

PACKAGES = (
    "paw_project", "accounts", "conversations", "sandboxes", "billing", "secrets_vault", "sso", "teams", "audit",
    "paw_agent", "paw_sqlcheck", "scripted_model", "paw_client",
)  # fmt: skip
APPS = ("accounts", "conversations", "sandboxes", "billing", "secrets_vault", "sso", "teams", "audit")
#: The Celery edge: the only modules of an app the domain may import from the node.
CELERY_EDGE = {("conversations", "sandboxes"): {"sandboxes.enqueue"}}


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    imported = graph.find_modules_directly_imported_by(child) & modules
                    work.append((child, iter(sorted(imported))))
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
                        found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def _app_cycles(edges: dict[tuple[str, str], set[str]]) -> list[tuple[str, str]]:
    """Pairs of apps that import each other, directly or through other apps, after the
    Celery edge is set aside."""
    reach: dict[str, set[str]] = {app: set() for app in APPS}
    for (source, target), imported in edges.items():
        if source in APPS and target in APPS and not imported <= CELERY_EDGE.get((source, target), set()):
            reach[source].add(target)
    changed = True
    while changed:
        changed = False
        for app in APPS:
            more = set().union(*(reach[other] for other in reach[app])) - reach[app]
            if more:
                reach[app] |= more
                changed = True
    return sorted((a, b) for a in APPS for b in reach[a] if a < b and a in reach[b])


def main() -> int:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    modules = {m for m in graph.modules if _package(m) in PACKAGES}
    importers_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    imported_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer in modules:
        for imported in graph.find_modules_directly_imported_by(importer) & modules:
            pair = (_package(importer), _package(imported))
            if pair[0] != pair[1]:
                importers_of[pair].add(importer)
                imported_of[pair].add(imported)
    print("Imports between packages (importer -> imported: importing modules)")
    for (source, target), importers in sorted(importers_of.items()):
        edge = " [the Celery edge]" if (source, target) in CELERY_EDGE else ""
        print(f"  {source} -> {target}{edge}: {', '.join(sorted(importers))}")
    failed = False
    cycles = _cycles(graph, modules)
    if cycles:
        failed = True
        print("Import cycles between modules:")
        for cycle in cycles:
            print("  " + " <-> ".join(cycle))
    else:
        print("No import cycle between modules.")
    app_cycles = _app_cycles(imported_of)
    if app_cycles:
        failed = True
        print("Apps that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in app_cycles))
    else:
        print("No cycle between the apps outside the Celery edge.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
