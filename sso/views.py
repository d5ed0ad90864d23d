"""The two pages of a single sign-on: the start (off to the provider) and the callback
(back from it). Edges over mozilla-django-oidc's views; a refusal or a provider that
cannot be reached sends the person back to the sign-in page, saying why."""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.utils.http import urlencode
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from accounts.services import sso_enabled
from accounts.views import SIGN_IN_MESSAGE_TAG
from paw_project.errors import DomainError
from sso.provider import ProviderUnavailable, provider_configuration
from sso.services import SignOnRefused

logger = logging.getLogger(__name__)

UNAVAILABLE = "The sign-in service cannot be reached right now; try again in a moment."


def _back_to_sign_in(
    request: HttpRequest, message: str, next_url: str | None = None
) -> HttpResponse:
    messages.error(request, message, extra_tags=SIGN_IN_MESSAGE_TAG)
    url = resolve_url(settings.LOGIN_URL)
    return HttpResponseRedirect(f"{url}?{urlencode({'next': next_url})}" if next_url else url)


class SsoStart(OIDCAuthenticationRequestView):
    """``GET /accounts/sso/start/?next=/c/…``: off to the provider's authorization
    endpoint (state, nonce and PKCE challenge kept in the session); 404 without single
    sign-on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.PAW_OIDC_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider_configuration()["authorization_endpoint"]
        except ProviderUnavailable as error:
            logger.error("single sign-on: %s", error)
            return _back_to_sign_in(request, UNAVAILABLE, request.GET.get("next"))
        return super().get(request)


class SsoCallback(OIDCAuthenticationCallbackView):
    """``GET /accounts/sso/callback/?code=…&state=…``: the provider's answer. Signed in:
    on to where the sign-in started (the chat by default). Refused, cancelled or failed:
    back to the sign-in page with the reason."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("Single sign-on is not configured.")
        next_url = request.session.get("oidc_login_next")
        try:
            return super().get(request)
        except SignOnRefused as refusal:
            logger.warning("single sign-on refused (%s): %s", refusal.code, refusal.detail)
            return _back_to_sign_in(request, refusal.detail, next_url)
        except SuspiciousOperation as error:  # an unknown state, a wrong nonce
            logger.warning("single sign-on: %s", error)
            return _back_to_sign_in(
                request, "The sign-in could not be completed; please start it again.", next_url
            )
        except (ProviderUnavailable, requests.RequestException) as error:
            logger.error("single sign-on: the provider failed: %s", error)
            return _back_to_sign_in(request, UNAVAILABLE, next_url)
        except DomainError as error:  # PAW's client secret cannot be read from the vault
            logger.error("single sign-on is misconfigured: %s", error.detail)
            return _back_to_sign_in(request, "Single sign-on is misconfigured on this server.")

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error")
        if error:  # the person cancelled, or the provider refused (RFC 6749 §4.1.2.1)
            logger.info("single sign-on: the provider answered %s", error)
            return _back_to_sign_in(
                self.request, "The sign-in was cancelled or refused at the sign-in service."
            )
        return _back_to_sign_in(
            self.request, "The sign-in could not be completed; please start it again."
        )
