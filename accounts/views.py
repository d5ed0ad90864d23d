"""The sign-in, registration and sign-out pages of the web chat (Django session auth).

Edges only: Django's ``LoginView`` / ``LogoutView`` (CSRF-protected; django-axes locks a
username and address out after ``PAW_LOGIN_FAILURE_LIMIT`` failures), and a registration
form that calls :func:`accounts.services.user_register`, the rule the API uses too. With
single sign-on (:mod:`sso`) the sign-in page also offers "Sign in with …", and the
admin signs in there too; ``PAW_PASSWORD_LOGIN=0`` leaves that the only way.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth import REDIRECT_FIELD_NAME, login, password_validation
from django.contrib.auth import views as auth_views
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.http import urlencode
from django.views.decorators.debug import sensitive_post_parameters

from accounts import services
from accounts.models import User
from paw_project.asgi_limits import BodyKind, request_body
from paw_project.errors import DomainError
from paw_project.security import content_security_policy
from paw_project.throttles import AuthThrottle

#: The tag of the messages the sign-in page shows (not, say, an admin's "saved"): single
#: sign-on's failures (``sso.views``) carry it.
SIGN_IN_MESSAGE_TAG = "sign-in"
PASSWORD_LOGIN_OFF = "Sign-in with a password is turned off on this server."  # noqa: S105

#: The backend a freshly registered user is signed in with (the lockout backend first in
#: AUTHENTICATION_BACKENDS authenticates nobody).
SESSION_BACKEND = "django.contrib.auth.backends.ModelBackend"


def throttled(request: HttpRequest) -> int | None:
    """Seconds to wait when the client address is over ``PAW_THROTTLE_AUTH`` (the same
    per-address limit as the API's sign-in and registration), else ``None``."""
    throttle = AuthThrottle()
    if throttle.allow_request(request, None):
        return None
    return int(throttle.wait() or 60)


@method_decorator(content_security_policy, name="dispatch")
class LoginPage(auth_views.LoginView):
    """``/accounts/login/``: username and password; an account already signed in goes on.
    Attempts count against ``PAW_THROTTLE_AUTH`` per client address (429 past it), on top
    of the lockout of a username and address after repeated failures."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    request_body_kind = BodyKind.ANONYMOUS  # the smallest body limit (paw_project.asgi_limits)

    def post(self, request, *args, **kwargs):
        if not settings.PAW_PASSWORD_LOGIN:
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, PASSWORD_LOGIN_OFF)
            return self.render_to_response(self.get_context_data(form=form), status=403)
        wait = throttled(request)
        if wait is None:
            return super().post(request, *args, **kwargs)
        form = self.get_form()
        form.errors.clear()
        form.add_error(None, f"Too many sign-in attempts from your address; try again in {wait} s.")
        response = self.render_to_response(self.get_context_data(form=form), status=429)
        response["Retry-After"] = str(wait)
        return response

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["registration_open"] = settings.PAW_ALLOW_REGISTRATION
        context["password_login"] = settings.PAW_PASSWORD_LOGIN
        # Why the last single sign-on failed (other pages' messages are dropped here).
        context["sign_in_problems"] = [
            str(message)
            for message in messages.get_messages(self.request)
            if SIGN_IN_MESSAGE_TAG in message.tags.split()
        ]
        if services.sso_enabled():
            start = reverse("sso_start")
            next_url = context.get("next")
            context["sso"] = {
                "name": settings.PAW_OIDC_NAME,
                "url": f"{start}?{urlencode({'next': next_url})}" if next_url else start,
            }
        return context


def admin_login(request: HttpRequest) -> HttpResponse:
    """``/admin/login/``: the admin's own sign-in form, or, with single sign-on or
    without password sign-in, PAW's sign-in page (which comes back to the admin). A
    signed-in person who is not staff gets the admin's page saying so (sending them to
    the sign-in page would come straight back)."""
    if request.user.is_authenticated or (
        settings.PAW_PASSWORD_LOGIN and not services.sso_enabled()
    ):
        if request.method == "POST" and not settings.PAW_PASSWORD_LOGIN:
            raise PermissionDenied(PASSWORD_LOGIN_OFF)
        return admin.site.login(request)
    next_url = request.GET.get(REDIRECT_FIELD_NAME) or reverse("admin:index")
    return redirect(f"{settings.LOGIN_URL}?{urlencode({REDIRECT_FIELD_NAME: next_url})}")


class LogoutPage(auth_views.LogoutView):
    """``POST /accounts/logout/``: end the session, back to the sign-in page; the tabs of
    that session are told at once (their websockets close with 4401)."""

    next_page = settings.LOGIN_URL

    def post(self, request, *args, **kwargs):
        session_key = request.session.session_key
        response = super().post(request, *args, **kwargs)
        services.session_sockets_close(session_key=session_key)
        return response


class RegisterForm(forms.Form):
    """The registration form: the same fields and rules as ``POST /api/auth/register``."""

    username = forms.CharField(
        max_length=150,
        validators=[UnicodeUsernameValidator()],
        help_text="Letters, digits and @ . + - _ only.",
        widget=forms.TextInput(attrs={"autocomplete": "username", "autofocus": True}),
    )
    email = forms.EmailField(
        required=False, widget=forms.EmailInput(attrs={"autocomplete": "email"})
    )
    password = forms.CharField(
        max_length=4096,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="At least 8 characters, not too common, not only digits.",
    )
    password_again = forms.CharField(
        label="Password (again)",
        max_length=4096,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean(self):
        data = super().clean()
        password = data.get("password")
        if password:
            # Django's password validators (AUTH_PASSWORD_VALIDATORS), told who it is for,
            # so every problem shows at once; user_register checks them again.
            candidate = User(username=data.get("username") or "", email=data.get("email") or "")
            try:
                password_validation.validate_password(password, user=candidate)
            except ValidationError as error:
                self.add_error("password", error)
            if password != data.get("password_again"):
                self.add_error("password_again", "The two passwords differ.")
        return data


@request_body(BodyKind.ANONYMOUS)
@content_security_policy
@sensitive_post_parameters("password", "password_again")
def register_page(request: HttpRequest) -> HttpResponse:
    """``/accounts/register/``: create an account and sign in (403 page when
    ``PAW_ALLOW_REGISTRATION`` is off; attempts count against ``PAW_THROTTLE_AUTH`` per
    client address, like the API's)."""
    if not settings.PAW_ALLOW_REGISTRATION:
        return render(request, "accounts/register.html", {"closed": True}, status=403)
    if request.user.is_authenticated:
        return redirect(settings.LOGIN_REDIRECT_URL)
    form = RegisterForm(request.POST or None)
    status = 200
    if request.method == "POST":
        wait = throttled(request)
        if wait is not None:
            form.add_error(None, f"Too many attempts from your address; try again in {wait} s.")
            response = render(request, "accounts/register.html", {"form": form}, status=429)
            response["Retry-After"] = str(wait)
            return response
        if form.is_valid():
            try:
                user = services.user_register(
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password"],
                    email=form.cleaned_data["email"],
                )
            except DomainError as error:
                field = "username" if error.code == "username_taken" else None
                field = "password" if error.code == "password_invalid" else field
                form.add_error(field, error.detail)
            else:
                login(request, user, backend=SESSION_BACKEND)
                return redirect(settings.LOGIN_REDIRECT_URL)
        status = 400
    return render(request, "accounts/register.html", {"form": form}, status=status)
