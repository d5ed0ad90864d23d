"""The admin: the ledger's change list with filters and the totals of the filtered rows
(read-only), and a user's budget edited on the user page."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.test import Client

from billing.models import Budget, UsageEvent
from billing.selectors import budget_limits
from tests.billing.ledger import at, ledger_event

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/billing/usageevent/"


@pytest.fixture
def admin_client_(make_user) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def ledger(user, other_user):
    ledger_event(user=user, input_tokens=100, output_tokens=1, model="model-a")
    ledger_event(user=user, input_tokens=200, output_tokens=2, model="model-b", rounds=4)
    ledger_event(user=other_user, input_tokens=400, output_tokens=4, model="model-a")
    ledger_event(
        user=other_user,
        input_tokens=800,
        output_tokens=8,
        model="model-a",
        created=at("2020-01-05T10:00:00"),
    )


def totals(response) -> dict:
    assert response.status_code == 200
    return response.context["usage_totals"]


def test_the_change_list_shows_totals_of_the_filtered_rows(admin_client_, ledger, user):
    everything = totals(admin_client_.get(CHANGELIST))
    assert everything == {
        "input_tokens": 1500,
        "output_tokens": 15,
        "tokens": 1515,
        "rounds": 7,
        "runs": 4,
    }
    by_model = totals(admin_client_.get(f"{CHANGELIST}?model=model-a"))
    assert (by_model["tokens"], by_model["runs"]) == (1313, 3)
    by_user = totals(admin_client_.get(f"{CHANGELIST}?user__id__exact={user.pk}"))
    assert (by_user["tokens"], by_user["runs"]) == (303, 2)
    both = admin_client_.get(f"{CHANGELIST}?user__id__exact={user.pk}&model=model-b")
    assert (totals(both)["tokens"], totals(both)["runs"]) == (202, 1)
    assert b"<strong>202</strong> tokens" in both.content
    by_date = totals(admin_client_.get(f"{CHANGELIST}?created__year=2020"))
    assert (by_date["tokens"], by_date["runs"]) == (808, 1)
    # The date filter's own links ("Past 7 days", "This year"...) send aware bounds.
    window = urlencode(
        {"created__gte": "2021-01-01 00:00:00+00:00", "created__lt": "2100-01-01 00:00:00+00:00"}
    )
    since = totals(admin_client_.get(f"{CHANGELIST}?{window}"))
    assert since["tokens"] == 1515 - 808


def test_the_ledger_cannot_be_edited_or_deleted_in_the_admin(admin_client_, ledger):
    event = UsageEvent.objects.first()
    assert admin_client_.get(f"{CHANGELIST}add/").status_code == 403
    page = admin_client_.get(f"{CHANGELIST}{event.pk}/change/")
    assert page.status_code == 200 and b'name="input_tokens"' not in page.content
    assert admin_client_.post(f"{CHANGELIST}{event.pk}/delete/").status_code == 403
    assert UsageEvent.objects.filter(pk=event.pk).exists()


def user_form(user, **budget) -> dict:
    """The user change form as the admin page posts it, with the budget inline."""
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "budget-TOTAL_FORMS": "1",
        "budget-INITIAL_FORMS": "1" if Budget.objects.filter(user=user).exists() else "0",
        "budget-MIN_NUM_FORMS": "0",
        "budget-MAX_NUM_FORMS": "1",
        "budget-0-user": str(user.pk),
        "budget-0-id": str(
            Budget.objects.filter(user=user).values_list("pk", flat=True).first() or ""
        ),
    }
    data.update({f"budget-0-{key}": value for key, value in budget.items()})
    return data


def test_a_users_budget_is_edited_on_the_user_page(admin_client_, user, settings):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 1_000_000
    settings.PAW_BUDGET_RUN_TOKENS = 50_000
    url = f"/admin/accounts/user/{user.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200
    assert b'name="budget-0-monthly_tokens"' in page.content
    assert b'name="budget-0-run_tokens"' in page.content

    saved = admin_client_.post(url, user_form(user, monthly_tokens="25000", run_tokens=""))
    assert saved.status_code == 302, saved.context and saved.context["errors"]
    assert budget_limits(user_id=user.pk).monthly == 25_000
    assert budget_limits(user_id=user.pk).run == 50_000  # empty: the server default

    saved = admin_client_.post(url, user_form(user, monthly_tokens="0", run_tokens="1234"))
    assert saved.status_code == 302
    assert (budget_limits(user_id=user.pk).monthly, budget_limits(user_id=user.pk).run) == (0, 1234)

    refused = admin_client_.post(url, user_form(user, monthly_tokens="-1", run_tokens=""))
    assert refused.status_code == 200  # the form again, with the error
    assert budget_limits(user_id=user.pk).monthly == 0


def test_a_new_user_can_be_added_with_a_budget(admin_client_):
    assert admin_client_.get("/admin/accounts/user/add/").status_code == 200
    response = admin_client_.post(
        "/admin/accounts/user/add/",
        {
            "username": "newcomer",
            "password1": "a sturdy passphrase 4711",
            "password2": "a sturdy passphrase 4711",
            "usable_password": "true",
            "budget-TOTAL_FORMS": "1",
            "budget-INITIAL_FORMS": "0",
            "budget-MIN_NUM_FORMS": "0",
            "budget-MAX_NUM_FORMS": "1",
            "budget-0-monthly_tokens": "",
            "budget-0-run_tokens": "5000",
        },
    )
    assert response.status_code == 302, response.context and response.context["errors"]
    newcomer = Budget.objects.get(user__username="newcomer")
    assert (newcomer.monthly_tokens, newcomer.run_tokens) == (None, 5000)
