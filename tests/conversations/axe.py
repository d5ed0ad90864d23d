"""axe-core for the accessibility browser tests: the package from the npm registry,
pinned by ``tests/conversations/axe/package-lock.json``, injected into each page checked.

As the single sign-on tests' OpenID provider (``tests/sso/oidc_provider.py``), it is
installed once per version of the lock file (``npm ci``) into ``$XDG_CACHE_HOME/paw-tests/``
(else ``~/.cache/paw-tests/``) and reused by later runs and other checkouts; nothing is
fetched while a page is checked. Without npm the tests fail, naming the Debian package.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.npm import npm_folder, npm_install

SOURCE = Path(__file__).resolve().parent / "axe"
#: What fails a page: axe's impacts "serious" and "critical" (not "minor", "moderate").
FAILING_IMPACTS = ("serious", "critical")


def axe_script() -> Path:
    """The path of ``axe.min.js`` for this ``package-lock.json`` (installed now when
    missing; concurrent sessions each install into a folder of their own and the first to
    finish is kept). Fails the test when npm is missing or the install fails."""
    folder = npm_folder(SOURCE, "axe-core")
    script = folder / "node_modules" / "axe-core" / "axe.min.js"
    if script.is_file():
        return script
    if shutil.which("npm") is None:
        pytest.fail(
            "npm not found: the accessibility tests install axe-core from the npm registry "
            "(apt-get install nodejs npm; .ci/run does)."
        )
    npm_install(SOURCE, folder, what="axe-core")
    return script


def axe_violations(page, impacts: tuple[str, ...] = FAILING_IMPACTS) -> list[dict[str, Any]]:
    """Run axe-core on ``page`` as it is now and return its violations of ``impacts``,
    each as ``{"id", "impact", "help", "nodes": [{"target", "summary"}]}``.

    axe is evaluated from the installed file through the DevTools protocol, which the
    pages' Content-Security-Policy (``script-src 'self'``, no inline script) does not
    govern: a ``<script>`` tag (``page.add_script_tag``) would be refused by it, and
    turning the policy off would check a page other than the one people get."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(axe_script().read_text())
    results = page.evaluate(
        """async () => {
            const results = await window.axe.run(document);
            return {violations: results.violations, passes: results.passes.map((r) => r.id)};
        }"""
    )
    # Not a vacuous check: the contrast rule ran and passed somewhere.
    assert "color-contrast" in results["passes"], results["passes"]
    return [
        {
            "id": violation["id"],
            "impact": violation["impact"],
            "help": violation["help"],
            "nodes": [
                {"target": node["target"], "summary": node.get("failureSummary", "")}
                for node in violation["nodes"]
            ],
        }
        for violation in results["violations"]
        if violation["impact"] in impacts
    ]
