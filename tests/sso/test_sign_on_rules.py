"""Who a single sign-on lets in, as which PAW user, with which flags (sso.services)."""

from __future__ import annotations

import pytest

from accounts.models import User
from accounts.services import username_free_variant
from sso.models import OidcIdentity
from sso.services import SignOnRefused, claim_matches, sign_on_check, sso_sign_in

pytestmark = pytest.mark.django_db

ISSUER = "https://login.example.org"


def claims(sub: str = "s-1", **extra) -> dict:
    return {"sub": sub, "email": "ada@example.org", "email_verified": True, **extra}


@pytest.mark.parametrize(
    ("rule", "value", "expected"),
    [
        ("paw_admin", True, True),
        ("paw_admin", "true", True),
        ("paw_admin", False, False),
        ("paw_admin", "no", False),
        ("groups=paw-staff", ["paw-users", "paw-staff"], True),
        ("groups=paw-staff", ["paw-users"], False),
        ("groups=paw-staff", "paw-staff", True),
        ("role=admin", "administrator", False),
        ("", True, False),
    ],
)
def test_a_staff_rule_is_a_true_claim_or_a_claim_holding_a_value(rule, value, expected):
    name = rule.partition("=")[0] or "paw_admin"
    assert claim_matches({name: value}, rule) is expected
    assert claim_matches({}, rule) is False


def test_the_first_sign_in_makes_a_user_with_a_normalized_name_and_no_password():
    user = sso_sign_in(issuer=ISSUER, claims=claims(preferred_username="Ａｄａ Lovelace"))
    assert user.username == "Ada-Lovelace"  # NFKC, and a space is not allowed in a name
    assert user.email == "ada@example.org"
    assert not user.has_usable_password() and not user.is_staff and not user.is_superuser
    identity = OidcIdentity.objects.get()
    assert (identity.issuer, identity.subject, identity.user) == (ISSUER, "s-1", user)
    assert identity.last_sign_in_at is not None


def test_later_sign_ins_find_the_user_by_subject_not_by_name():
    first = sso_sign_in(issuer=ISSUER, claims=claims(preferred_username="ada"))
    renamed = sso_sign_in(
        issuer=ISSUER, claims=claims(preferred_username="countess", email="ada@example.com")
    )
    assert renamed == first
    renamed.refresh_from_db()
    assert renamed.username == "ada" and renamed.email == "ada@example.com"
    # Another provider's subject of the same value is another person.
    other = sso_sign_in(issuer="https://other.example.org", claims=claims(preferred_username="ada"))
    assert other != first and other.username == "ada-2"


def test_an_existing_local_account_of_the_same_name_is_never_taken_over(make_user):
    local = make_user("Alice")
    user = sso_sign_in(issuer=ISSUER, claims=claims(preferred_username="alice"))
    assert user != local
    assert user.username == "alice-2"  # "Alice" and "alice" are one name
    assert local.oidc_identities.count() == 0


def test_without_a_username_claim_the_name_comes_from_the_email_then_the_subject():
    assert sso_sign_in(issuer=ISSUER, claims=claims("s-a")).username == "ada"
    assert sso_sign_in(issuer=ISSUER, claims={"sub": "Ｚ９"}).username == "Z9"


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [("ｂｏｂ", "bob"), ("a b/c", "a-b-c"), ("---", "user"), ("", "user"), ("é.x@y+z", "é.x@y+z")],
)
def test_a_wanted_name_is_made_a_valid_username(wanted, expected):
    assert username_free_variant(wanted) == expected


def test_a_long_taken_name_keeps_the_length_limit_with_its_number(make_user):
    make_user("n" * 150)
    assert username_free_variant("N" * 200) == "N" * 148 + "-2"


def test_the_staff_and_superuser_claims_are_applied_at_every_sign_in(settings):
    settings.PAW_OIDC_STAFF_CLAIM = "groups=paw-staff"
    settings.PAW_OIDC_SUPERUSER_CLAIM = "paw_admin"
    user = sso_sign_in(issuer=ISSUER, claims=claims(groups=["paw-staff"], paw_admin=True))
    assert user.is_staff and user.is_superuser
    user = sso_sign_in(issuer=ISSUER, claims=claims(groups=["paw-users"]))
    user.refresh_from_db()
    assert not user.is_staff and not user.is_superuser  # taken away at the provider


def test_without_a_staff_rule_the_admins_choice_stays(settings):
    user = sso_sign_in(issuer=ISSUER, claims=claims())
    User.objects.filter(pk=user.pk).update(is_staff=True)
    assert sso_sign_in(issuer=ISSUER, claims=claims(groups=[])).is_staff


def test_a_disabled_account_is_refused():
    user = sso_sign_in(issuer=ISSUER, claims=claims())
    User.objects.filter(pk=user.pk).update(is_active=False)
    with pytest.raises(SignOnRefused) as refused:
        sso_sign_in(issuer=ISSUER, claims=claims())
    assert refused.value.code == "account_disabled"


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ({"email": "eve@elsewhere.test"}, "domain_not_allowed"),
        ({"email": "eve@sub.example.org"}, "domain_not_allowed"),  # no subdomains
        ({"email": None}, "domain_not_allowed"),
        ({"email": "ada@EXAMPLE.org", "email_verified": False}, "email_unverified"),
    ],
)
def test_only_verified_addresses_of_the_allowed_domains_come_in(settings, given, code):
    settings.PAW_OIDC_ALLOWED_DOMAINS = ["example.org"]
    sign_on_check(claims(email="ada@EXAMPLE.org"))  # the domain ignores case
    sign_on_check({"sub": "s", "email": "ada@example.org"})  # no email_verified: trusted
    with pytest.raises(SignOnRefused) as refused:
        sso_sign_in(issuer=ISSUER, claims=claims(**given))
    assert refused.value.code == code
    assert not User.objects.exists()


def test_only_members_of_the_allowed_groups_come_in(settings):
    settings.PAW_OIDC_ALLOWED_GROUPS = ["paw-users", "paw-staff"]
    settings.PAW_OIDC_GROUPS_CLAIM = "roles"
    sign_on_check(claims(roles=["paw-users"]))
    sign_on_check(claims(roles="paw-staff"))
    for roles in (["others"], None):
        with pytest.raises(SignOnRefused) as refused:
            sign_on_check(claims(roles=roles))
        assert refused.value.code == "group_not_allowed"


def _team_names(user: User) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def test_the_teams_claim_sets_a_persons_teams_at_every_sign_in(settings):
    from teams.models import Team

    settings.PAW_OIDC_TEAMS_CLAIM = "groups"
    Team.objects.create(name="Analysts"), Team.objects.create(name="finance")
    user = sso_sign_in(issuer=ISSUER, claims=claims(groups=["analysts", "unknown-group"]))
    assert _team_names(user) == ["Analysts"]  # names compared ignoring case; others ignored
    assert not Team.objects.filter(name="unknown-group").exists()
    user = sso_sign_in(issuer=ISSUER, claims=claims(groups="finance"))
    assert _team_names(user) == ["finance"]  # left analysts at the provider: left it here
    user = sso_sign_in(issuer=ISSUER, claims=claims())
    assert _team_names(user) == []  # no claim: no team


def test_missing_teams_are_made_when_asked_and_the_default_team_is_joined_first(settings):
    from teams.models import Team

    settings.PAW_DEFAULT_TEAM = "staff-room"
    user = sso_sign_in(issuer=ISSUER, claims=claims("s-new"))
    assert _team_names(user) == ["staff-room"]  # no teams claim configured: PAW's own
    settings.PAW_OIDC_TEAMS_CLAIM = "groups"
    settings.PAW_OIDC_CREATE_TEAMS = True
    user = sso_sign_in(issuer=ISSUER, claims=claims("s-new", groups=["ops", "", 42, "x" * 200]))
    assert _team_names(user) == ["ops"]  # the claim decides; nothing blank, too long or not text
    assert Team.objects.filter(name="ops").exists()
    assert not Team.objects.filter(name="42").exists()


@pytest.mark.parametrize("item", [{"a": 1}, ["ops"], 42, 4.2, True, None])
def test_a_claim_item_that_is_not_a_string_makes_no_team(settings, item):
    from teams.models import Team

    settings.PAW_OIDC_TEAMS_CLAIM = "groups"
    settings.PAW_OIDC_CREATE_TEAMS = True
    user = sso_sign_in(issuer=ISSUER, claims=claims(groups=["ops", item]))
    assert _team_names(user) == ["ops"]
    assert list(Team.objects.values_list("name", flat=True)) == ["ops"]


def test_a_claim_is_read_up_to_its_bound(settings):
    from sso.services import CLAIM_VALUE_MAX_LENGTH, CLAIM_VALUES_MAX, _claim_values

    many = [f"g{i}" for i in range(CLAIM_VALUES_MAX + 50)]
    values = _claim_values({"groups": many}, "groups")
    assert values == set(many[:CLAIM_VALUES_MAX])
    long = "x" * (CLAIM_VALUE_MAX_LENGTH + 1)
    assert _claim_values({"groups": [long, "x" * CLAIM_VALUE_MAX_LENGTH]}, "groups") == {
        "x" * CLAIM_VALUE_MAX_LENGTH
    }
    assert _claim_values({"groups": long}, "groups") == set()
    assert _claim_values({"groups": {"a": 1}}, "groups") == set()


def test_without_a_teams_claim_teams_set_in_paw_stay(settings):
    from teams.models import Team

    user = sso_sign_in(issuer=ISSUER, claims=claims(groups=["ops"]))
    user.groups.add(Team.objects.create(name="analysts"))
    assert _team_names(sso_sign_in(issuer=ISSUER, claims=claims(groups=["ops"]))) == ["analysts"]
