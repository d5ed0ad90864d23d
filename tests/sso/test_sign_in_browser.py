"""Single sign-on in a real browser: Debian's Chromium signs in at a real OpenID provider
(``oidc-provider`` on loopback) and comes back to a real PAW web process."""

from __future__ import annotations

import re

import pytest

from accounts.models import User
from conversations.models import Conversation
from sso.models import OidcIdentity
from tests.sso.conftest import ACCOUNTS, PROVIDER_NAME

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]


def sign_in_at_the_provider(browser, login: str, *, path: str = "/"):
    """From PAW's sign-in page, "Sign in with …", sign in at the provider as ``login``
    and agree; returns the page, back at PAW."""
    page = browser.page
    page.goto(browser.url(path))
    page.wait_for_url(re.compile(r"/accounts/login/"))
    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    page.wait_for_url(re.compile(r"/interaction/"))  # the provider's own sign-in page
    page.locator("input[name=login]").fill(login)
    page.locator("input[name=password]").fill("any password: the provider is not under test")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # the provider's consent page
    page.wait_for_url(re.compile(re.escape(browser.url(""))))
    return page


def refusal_on_the_sign_in_page(page) -> str:
    page.wait_for_url(re.compile(r"/accounts/login/"))
    return page.get_by_role("alert").inner_text()


def test_signing_in_lands_in_the_chat_as_the_claimed_user_with_the_staff_claim(
    browser, oidc_provider
):
    page = sign_in_at_the_provider(browser, "ada-1815")
    page.wait_for_selector("#prompt")
    assert page.locator(".sidebar-foot strong").inner_text() == "ada"
    ada = User.objects.get(username="ada")
    assert ada.email == "ada@example.org"
    assert ada.is_staff and not ada.has_usable_password()
    identity = OidcIdentity.objects.get(user=ada)
    assert (identity.issuer, identity.subject) == (oidc_provider.issuer, "ada-1815")
    # Staff: the admin opens for the same session.
    page.goto(browser.url("/admin/"))
    page.wait_for_selector("#site-name")
    assert "ada" in page.locator("#user-tools").inner_text().lower()


def test_a_second_sign_in_is_the_same_user_and_a_namesake_gets_a_name_of_its_own(browser):
    User.objects.create_user(username="grace", password="a local grace's password")
    page = sign_in_at_the_provider(browser, "grace-1906")
    page.wait_for_selector("#prompt")
    # "Ｇｒａｃｅ" (full width) is "Grace", and "grace" is taken (ignoring case).
    assert page.locator(".sidebar-foot strong").inner_text() == "Grace-2"
    user = User.objects.get(username="Grace-2")
    assert not user.is_staff  # not in paw-staff
    page.get_by_role("button", name="Sign out").click()
    # Still signed in at the provider: "Sign in with …" comes straight back.
    page.get_by_role("link", name=f"Sign in with {PROVIDER_NAME}").click()
    page.wait_for_selector("#prompt")
    assert page.locator(".sidebar-foot strong").inner_text() == "Grace-2"
    assert User.objects.filter(username__istartswith="grace").count() == 2


def test_the_providers_groups_are_the_persons_teams(browser):
    from teams.models import Team

    users = Team.objects.create(name="paw-users")
    Team.objects.create(name="analysts")  # not in grace's claim
    page = sign_in_at_the_provider(browser, "grace-1906")
    page.wait_for_selector("#prompt")
    grace = User.objects.get(username="Grace")
    assert list(grace.groups.all()) == [users]  # paw-staff names no team: left out
    me = page.evaluate("fetch('/api/auth/me').then(r => r.json())")
    assert me["teams"] == [{"id": users.id, "name": "paw-users"}]


def test_an_id_token_for_another_audience_is_refused(browser):
    page = sign_in_at_the_provider(browser, "eve-other-audience")
    assert "issued for another application" in refusal_on_the_sign_in_page(page)
    assert not User.objects.filter(username="eve").exists()
    page.goto(browser.url("/"))
    page.wait_for_url(re.compile(r"/accounts/login/"))  # not signed in


def test_an_expired_id_token_is_refused(browser):
    page = sign_in_at_the_provider(browser, "old-token")
    assert "has expired" in refusal_on_the_sign_in_page(page)
    assert not User.objects.filter(username="old").exists()


def test_an_address_outside_the_allowed_domains_is_refused(browser):
    page = sign_in_at_the_provider(browser, "mallory-outsider")
    text = refusal_on_the_sign_in_page(page)
    assert "elsewhere.test may not use this PAW" in text and "example.org" in text
    assert not User.objects.filter(username="mallory").exists()
    assert ACCOUNTS["mallory-outsider"]["claims"]["email_verified"]


def test_signing_out_ends_the_session_and_closes_the_other_tabs_sockets(browser):
    page = sign_in_at_the_provider(browser, "ada-1815")
    page.wait_for_selector("#prompt")
    ada = User.objects.get(username="ada")
    conversation = Conversation.objects.create(user=ada)
    other = browser.new_page()
    other.goto(browser.url(f"/c/{conversation.id}/"))
    other.wait_for_selector(".connection[data-state=connected]")
    cookie = next(c for c in browser.context.cookies() if c["name"] == "sessionid")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/accounts/login/"))
    # The other tab's socket is closed for the signed-out session.
    other.wait_for_url(re.compile(r"/accounts/login/\?next=%2Fc%2F"))
    # The old session cookie is worth nothing now.
    from django.test import Client

    client = Client()
    client.cookies["sessionid"] = cookie["value"]
    assert client.get("/").status_code == 302
