"""The "API keys" page: a person's own secrets in the web chat (edges over the services
that ``/api/secrets`` uses too). Values are write-only here as everywhere: a value is
typed in, stored encrypted, and never shown again."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.debug import sensitive_post_parameters

from paw_project.errors import DomainError
from paw_project.security import content_security_policy
from paw_project.throttles import SecretsThrottle
from secrets_vault.models import CustomProvider
from secrets_vault.providers import BUILTIN_PROVIDERS
from secrets_vault.selectors import secret_get, secret_list
from secrets_vault.services import secret_delete, secret_set


def _key_names() -> list[str]:
    """The secret names providers read their keys from (suggested in the form)."""
    names = [spec.key_name for spec in BUILTIN_PROVIDERS]
    names += [
        name
        for name in CustomProvider.objects.filter(enabled=True)
        .exclude(key_secret_name="")
        .values_list("key_secret_name", flat=True)
        if name not in names
    ]
    return names


@content_security_policy
@login_required
@sensitive_post_parameters("value")
def keys_page(request: HttpRequest) -> HttpResponse:
    """``/settings/keys/``: list the person's secrets (names and dates), set one
    (``action=set``: ``name``, ``value``, ``description``) or remove one
    (``action=delete``: ``name``). Errors are shown on the form; nothing changes then."""
    error, status = "", 200
    if request.method == "POST" and not SecretsThrottle().allow_request(request, None):
        error, status = "Too many changes in a short time; wait a minute and try again.", 429
    elif request.method == "POST":
        action = request.POST.get("action")
        name = (request.POST.get("name") or "").strip()
        try:
            if action == "set":
                secret, created = secret_set(
                    name=name,
                    value=request.POST.get("value", ""),
                    user=request.user,
                    description=(request.POST.get("description") or "").strip(),
                )
                messages.success(request, f"{secret.name} {'saved' if created else 'replaced'}.")
                return redirect("keys")
            if action == "delete":
                secret = secret_get(name=name, user=request.user)
                if secret is not None:
                    secret_delete(secret=secret)
                    messages.success(request, f"{name} removed.")
                return redirect("keys")
            error, status = "Unknown action.", 400
        except DomainError as exc:
            error, status = exc.detail, 400
    return render(
        request,
        "secrets_vault/keys.html",
        {
            "secrets": secret_list(user=request.user).order_by("name"),
            "key_names": _key_names(),
            "error": error,
            "name": request.POST.get("name", "") if error else "",
        },
        status=status,
    )
