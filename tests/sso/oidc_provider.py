"""A real OpenID provider for the single sign-on tests: the certified ``oidc-provider``
package from the npm registry, run with Debian's node on 127.0.0.1
(``tests/sso/provider/provider.mjs`` says what it does).

The package is installed once per version of ``package-lock.json`` (``npm ci``) into
``$XDG_CACHE_HOME/paw-tests/`` (else ``~/.cache/paw-tests/``) and reused by later runs
and other checkouts; without node and npm the tests fail, naming the Debian packages.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.npm import npm_folder, npm_install
from tests.processes import child_process, free_port, http_get, output_of

SOURCE = Path(__file__).resolve().parent / "provider"
#: oidc-provider 9 uses ``crypto.hash`` (Node.js 20.12 and later; Debian 12's own nodejs
#: package is 18, the machine's Node.js is newer).
NODE_AT_LEAST = (20, 12)


def _node_check() -> None:
    missing = [name for name in ("node", "npm") if shutil.which(name) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the single sign-on tests run a real OpenID "
            "provider with node (apt-get install nodejs npm; .ci/run does)."
        )
    version = subprocess.run(
        ["node", "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    numbers = tuple(int(part) for part in version.lstrip("v").split(".")[:2] if part.isdigit())
    if numbers < NODE_AT_LEAST:
        wanted = ".".join(map(str, NODE_AT_LEAST))
        pytest.fail(
            f"node {version} is too old for the test OpenID provider: it needs {wanted} or newer."
        )


def provider_install() -> Path:
    """The folder holding ``node_modules/oidc-provider`` for this ``package-lock.json``
    (installed now when missing; concurrent sessions each install into a folder of their
    own and the first to finish is kept). Fails the test when node or npm is missing or
    the install fails."""
    folder = npm_folder(SOURCE, "oidc-provider")
    _node_check()
    if (folder / "node_modules" / "oidc-provider" / "package.json").is_file():
        return folder
    npm_install(SOURCE, folder, what="the test OpenID provider")
    return folder


class OpenIdProvider:
    """A running provider: ``issuer`` (``http://127.0.0.1:<port>``), ``output()``."""

    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process = process
        self.port = port
        self.issuer = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        return output_of(self.process)


@contextlib.contextmanager
def openid_provider(
    *, clients: list[dict[str, Any]], accounts: dict[str, dict[str, Any]], folder: Path
) -> Iterator[OpenIdProvider]:
    """Run the provider with ``clients`` (OAuth client metadata, RFC 7591 names) and
    ``accounts`` (``sub → {"claims": {...}, "mint": {...}}``) until the block ends; its
    files go to ``folder``. Serving means its discovery document answers."""
    installed = provider_install()
    script = (SOURCE / "provider.mjs").read_bytes()
    # Next to the installed node_modules, so that node resolves `oidc-provider`.
    runner = installed / f"provider-{hashlib.sha256(script).hexdigest()[:16]}.mjs"
    if not runner.is_file():
        staged = runner.with_name(f"{runner.name}.{os.getpid()}.tmp")
        staged.write_bytes(script)
        staged.replace(runner)
    port = free_port()
    config = folder / f"openid-provider-{port}.json"
    config.write_text(json.dumps({"port": port, "clients": clients, "accounts": accounts}))
    with child_process(["node", str(runner), str(config)], cwd=installed) as process:
        provider = OpenIdProvider(process, port)
        discovery = f"{provider.issuer}/.well-known/openid-configuration"
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the OpenID provider did not start:\n{provider.output()}")
            with contextlib.suppress(OSError):
                if http_get(discovery, timeout=2)[0] == 200:
                    break
            time.sleep(0.1)
        yield provider
