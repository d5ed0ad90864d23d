"""Fixtures of the single sign-on tests: a real OpenID provider on loopback
(:mod:`tests.sso.oidc_provider`), a PAW web process signing in with it, and Debian's
Chromium (the browser tests' fixtures of ``tests/conversations``)."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator

import pytest

from secrets_vault.services import secret_set
from tests.conftest import WebServer
from tests.conversations.conftest import (  # noqa: F401 - fixtures and the report hook
    BrowserSession,
    chromium,
    keep_failure_artifacts,
    pytest_runtest_makereport,
)
from tests.processes import child_process, free_port, wait_http, worker_database_url
from tests.secrets_vault import leak_scan
from tests.sso.oidc_provider import OpenIdProvider, openid_provider

CLIENT_ID = "paw-test"
CLIENT_SECRET = f"oidc-client-secret-{secrets.token_urlsafe(16)}"
#: The vault's global secret holding the client secret (PAW_OIDC_CLIENT_SECRET names it).
CLIENT_SECRET_NAME = "OIDC_CLIENT_SECRET"
PROVIDER_NAME = "Test IdP"
ALLOWED_DOMAIN = "example.org"
STAFF_GROUP = "paw-staff"

#: The people at the provider (``sub`` is what one types as "login" on its sign-in page).
ACCOUNTS = {
    "ada-1815": {
        "claims": {
            "preferred_username": "ada",
            "name": "Ada Lovelace",
            "email": "ada@example.org",
            "email_verified": True,
            "groups": ["paw-users", STAFF_GROUP],
        }
    },
    "grace-1906": {
        "claims": {
            "preferred_username": "Ｇｒａｃｅ",  # full width: NFKC makes it "Grace"
            "email": "grace@example.org",
            "email_verified": True,
            "groups": ["paw-users"],
        }
    },
    "eve-other-audience": {
        "claims": {"preferred_username": "eve", "email": "eve@example.org", "email_verified": True},
        "mint": {"audience": "another-application"},
    },
    "old-token": {
        "claims": {"preferred_username": "old", "email": "old@example.org", "email_verified": True},
        "mint": {"expired_seconds_ago": 600},
    },
    "mallory-outsider": {
        "claims": {
            "preferred_username": "mallory",
            "email": "mallory@elsewhere.test",
            "email_verified": True,
        }
    },
}


@pytest.fixture(scope="module")
def sso_port() -> int:
    """PAW's port (known before the provider starts: it registers the redirect URI)."""
    return free_port()


@pytest.fixture(scope="module")
def oidc_provider(sso_port, tmp_path_factory) -> Iterator[OpenIdProvider]:
    leak_scan.remember(CLIENT_SECRET)
    client = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"http://127.0.0.1:{sso_port}/accounts/sso/callback/"],
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_post",
    }
    folder = tmp_path_factory.mktemp("openid-provider")
    with openid_provider(clients=[client], accounts=ACCOUNTS, folder=folder) as provider:
        yield provider


@pytest.fixture(scope="module")
def sso_server(django_db_setup, django_db_blocker, oidc_provider, sso_port) -> Iterator[WebServer]:
    """A PAW web process signing in with the provider: client secret from the vault,
    only ``example.org`` addresses, the ``paw-staff`` group makes staff, the ``groups``
    claim names the person's teams."""
    with django_db_blocker.unblock():
        database_url = worker_database_url()
    env = {
        "PAW_DATABASE_URL": database_url,
        "PAW_OIDC_ISSUER": oidc_provider.issuer,
        "PAW_OIDC_CLIENT_ID": CLIENT_ID,
        "PAW_OIDC_CLIENT_SECRET": f"{{secret:{CLIENT_SECRET_NAME}}}",
        "PAW_OIDC_NAME": PROVIDER_NAME,
        "PAW_OIDC_SCOPES": "openid email profile groups",
        "PAW_OIDC_ALLOWED_DOMAINS": ALLOWED_DOMAIN,
        "PAW_OIDC_STAFF_CLAIM": f"groups={STAFF_GROUP}",
        "PAW_OIDC_TEAMS_CLAIM": "groups",
    }
    command = [
        sys.executable,
        "-m",
        "paw_project.web",
        "--host",
        "127.0.0.1",
        "--port",
        str(sso_port),
    ]
    with child_process(command, env=env) as process:
        wait_http(f"http://127.0.0.1:{sso_port}/healthz", process=process)
        yield WebServer(process, sso_port)


@pytest.fixture
def client_secret_in_vault(db) -> None:
    """The client secret as the vault's global secret (again for each test: the database
    is emptied after every test)."""
    secret_set(name=CLIENT_SECRET_NAME, value=CLIENT_SECRET)


@pytest.fixture
def browser(
    request,
    chromium,  # noqa: F811 - the imported fixture, by name
    sso_server,
    oidc_provider,
    client_secret_in_vault,
) -> Iterator[BrowserSession]:
    """A fresh browser context on the SSO server; on failure, screenshots, the console
    and both servers' logs go to ``test-artifacts/``."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    session = BrowserSession(context, sso_server)
    yield session
    logs = {"server": sso_server.output(), "provider": oidc_provider.output()}
    keep_failure_artifacts(request, context, session, logs)
    context.close()
