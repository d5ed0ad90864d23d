"""The "API keys" page: a person's own secrets in the web chat (edges over the services
that ``/api/secrets`` uses too), and their personal API tokens for PAW itself (the services
of ``/api/auth/tokens``). Values are write-only here as everywhere: a secret is typed in,
stored encrypted, and never shown again; a token's value is shown once, when it is made."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.debug import sensitive_post_parameters

from accounts.selectors import personal_token_list
from accounts.services import personal_token_create, personal_token_delete
from paw_project.errors import DomainError, InvalidRequest
from paw_project.security import content_security_policy
from paw_project.throttles import SecretsThrottle, TokensThrottle
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
    (``action=delete``: ``name``); list, make and revoke personal API tokens
    (``action=token_create`` / ``token_delete``, see :func:`_tokens_post`). Errors are shown
    on the form; nothing changes then."""
    action = request.POST.get("action") if request.method == "POST" else None
    if action in ("token_create", "token_delete"):
        return _tokens_post(request, action)
    error, status = "", 200
    if request.method == "POST" and not SecretsThrottle().allow_request(request, None):
        error, status = "Too many changes in a short time; wait a minute and try again.", 429
    elif request.method == "POST":
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
    return _page(
        request, status=status, error=error, name=request.POST.get("name", "") if error else ""
    )


def _page(request: HttpRequest, *, status: int = 200, **context) -> HttpResponse:
    """The page with the person's secrets and tokens, plus ``context`` (errors, a new token)."""
    return render(
        request,
        "secrets_vault/keys.html",
        {
            "secrets": secret_list(user=request.user).order_by("name"),
            "key_names": _key_names(),
            "tokens": personal_token_list(user=request.user),
            **context,
        },
        status=status,
    )


def _tokens_post(request: HttpRequest, action: str) -> HttpResponse:
    """Make a personal API token (``action=token_create``: ``token_name``,
    ``expires_in_days`` empty for never) and show its value this once, or delete one
    (``action=token_delete``: ``token_id``)."""
    if not TokensThrottle().allow_request(request, None):
        wait = "Too many changes in a short time; wait a minute."
        return _page(request, status=429, token_error=wait)
    try:
        if action == "token_create":
            days = (request.POST.get("expires_in_days") or "").strip()
            if days and not (days.isascii() and days.isdigit()):
                raise InvalidRequest("The lifetime is a number of days, or empty for never.")
            token, raw = personal_token_create(
                user=request.user,
                name=request.POST.get("token_name", ""),
                expires_in_days=int(days) if days else None,
            )
            # Rendered, not redirected: the value must not travel through the session.
            return _page(request, status=201, new_token=raw, new_token_name=token.name)
        token_id = (request.POST.get("token_id") or "").strip()
        if not (token_id.isascii() and token_id.isdigit()):
            raise InvalidRequest("No such API token.")
        personal_token_delete(user=request.user, token_id=int(token_id))
        messages.success(request, "The API token was revoked.")
        return redirect("keys")
    except DomainError as exc:
        return _page(
            request,
            status=exc.status_code,
            token_error=exc.detail,
            token_name=request.POST.get("token_name", ""),
        )
