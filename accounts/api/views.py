"""Auth API: register, token pair, refresh, logout, password change, me (thin edges)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import logout, update_session_auth_hash
from django.contrib.auth.validators import UnicodeUsernameValidator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import services
from accounts.models import User
from paw_project.api import StrictSerializer, error_responses
from paw_project.errors import Forbidden
from paw_project.throttles import AuthThrottle, PasswordThrottle


class TokenPairOutput(serializers.Serializer):
    access = serializers.CharField(help_text="JWT access token (`Authorization: Bearer …`).")
    refresh = serializers.CharField(help_text="JWT refresh token, for /api/auth/token/refresh.")


class UserOutput(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    email = serializers.EmailField(allow_blank=True)
    date_joined = serializers.DateTimeField()


class _PublicAuthApi(APIView):
    """Base of the endpoints called without a token: no authentication (so no CSRF check on
    a stale session cookie), throttled per client IP."""

    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = (AuthThrottle,)

    def get_authenticate_header(self, request: Request) -> str:
        # Keeps 401 a 401: DRF turns it into 403 for views with no authenticator.
        return 'Bearer realm="api"'


class RegisterApi(_PublicAuthApi):
    class InputSerializer(StrictSerializer):
        username = serializers.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
        password = serializers.CharField(max_length=4096, write_only=True, trim_whitespace=False)
        email = serializers.EmailField(required=False, allow_blank=True, default="")

    @extend_schema(
        operation_id="auth_register",
        request=InputSerializer,
        responses={201: UserOutput, **error_responses(400, 403, 409, 429)},
        auth=[],
    )
    def post(self, request: Request) -> Response:
        """Create an account (Django's password validators apply). 403
        `registration_closed` when `PAW_ALLOW_REGISTRATION` is off."""
        if not settings.PAW_ALLOW_REGISTRATION:
            raise Forbidden("Registration is closed on this server.", code="registration_closed")
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_register(**data.validated_data)
        return Response(UserOutput(user).data, status=status.HTTP_201_CREATED)


class TokenApi(_PublicAuthApi):
    class InputSerializer(StrictSerializer):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)

    @extend_schema(
        operation_id="auth_token",
        request=InputSerializer,
        responses={200: TokenPairOutput, **error_responses(400, 429)},
        auth=[],
    )
    def post(self, request: Request) -> Response:
        """Log in: a JWT access and refresh token pair."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pair = services.auth_login(request=request._request, **data.validated_data)
        return Response(TokenPairOutput(pair).data)


class TokenRefreshApi(_PublicAuthApi):
    class InputSerializer(StrictSerializer):
        refresh = serializers.CharField(max_length=4096)

    @extend_schema(
        operation_id="auth_token_refresh",
        request=InputSerializer,
        responses={200: TokenPairOutput, **error_responses(400, 429)},
        auth=[],
    )
    def post(self, request: Request) -> Response:
        """A new pair for a refresh token; the old refresh token is blacklisted."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pair = services.auth_token_refresh(refresh=data.validated_data["refresh"])
        return Response(TokenPairOutput(pair).data)


class LogoutApi(APIView):
    @extend_schema(
        operation_id="auth_logout", request=None, responses={204: None, **error_responses(403)}
    )
    def post(self, request: Request) -> Response:
        """Revoke every access and refresh token of the user, everywhere; a session caller is
        also logged out."""
        services.auth_tokens_revoke(user=request.user)
        if request.auth is None:  # session authentication
            logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PasswordChangeApi(APIView):
    throttle_classes = (AuthThrottle, PasswordThrottle)

    class InputSerializer(StrictSerializer):
        old_password = serializers.CharField(max_length=4096, trim_whitespace=False)
        new_password = serializers.CharField(max_length=4096, trim_whitespace=False)

    @extend_schema(
        operation_id="auth_password_change",
        request=InputSerializer,
        responses={200: TokenPairOutput, **error_responses(400, 403, 429)},
    )
    def post(self, request: Request) -> Response:
        """Change the password (throttled per user and per client address). Every earlier
        token stops working; the answer is a new pair (a session caller stays logged in)."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pair = services.user_password_change(user=request.user, **data.validated_data)
        if request.auth is None:
            update_session_auth_hash(request._request, request.user)
        return Response(TokenPairOutput(pair).data)


class MeApi(APIView):
    @extend_schema(operation_id="auth_me", responses={200: UserOutput, **error_responses()})
    def get(self, request: Request) -> Response:
        """The signed-in user."""
        user: User = request.user
        return Response(UserOutput(user).data)
