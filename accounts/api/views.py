"""Auth API: register, token pair, refresh, logout, password change, me, personal API tokens
(thin edges)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import logout, update_session_auth_hash
from django.contrib.auth.validators import UnicodeUsernameValidator
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.models import PersonalToken, User
from paw_project.api import StrictSerializer, error_responses, paginated_response
from paw_project.asgi_limits import BodyKind
from paw_project.errors import Forbidden
from paw_project.throttles import AuthThrottle, PasswordThrottle, TokensThrottle
from teams.api.views import TeamBriefOutput
from teams.selectors import user_teams


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
    request_body_kind = BodyKind.ANONYMOUS  # the smallest body limit (paw_project.asgi_limits)

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


class _TokenPairApi(_PublicAuthApi):
    """Base of the public endpoints that answer a token pair: parse the body with the
    subclass's ``InputSerializer``, ask :meth:`pair` for the tokens."""

    InputSerializer: type[serializers.Serializer]

    def pair(self, request: Request, data: dict) -> dict[str, str]:
        raise NotImplementedError

    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(TokenPairOutput(self.pair(request, data.validated_data)).data)


def _token_pair_schema(
    view: type[_TokenPairApi], *, operation_id: str, description: str, errors: tuple[int, ...]
) -> None:
    """Document ``view``'s ``POST`` (its own ``InputSerializer`` in, a token pair out, the
    ``errors`` statuses)."""
    extend_schema_view(
        post=extend_schema(
            operation_id=operation_id,
            description=description,
            request=view.InputSerializer,
            responses={200: TokenPairOutput, **error_responses(*errors)},
            auth=[],
        )
    )(view)


class TokenApi(_TokenPairApi):
    class InputSerializer(StrictSerializer):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)

    def pair(self, request: Request, data: dict) -> dict[str, str]:
        if not settings.PAW_PASSWORD_LOGIN:
            raise Forbidden(
                "Sign-in with a password is turned off on this server.",
                code="password_login_disabled",
            )
        return services.auth_login(request=request._request, **data)


class TokenRefreshApi(_TokenPairApi):
    class InputSerializer(StrictSerializer):
        refresh = serializers.CharField(max_length=4096)

    def pair(self, request: Request, data: dict) -> dict[str, str]:
        return services.auth_token_refresh(refresh=data["refresh"])


_token_pair_schema(
    TokenApi,
    operation_id="auth_token",
    description="Log in: a JWT access and refresh token pair. 403 `password_login_disabled` "
    "when `PAW_PASSWORD_LOGIN` is off (single sign-on only).",
    errors=(400, 403, 429),
)
_token_pair_schema(
    TokenRefreshApi,
    operation_id="auth_token_refresh",
    description="A new pair for a refresh token; the old refresh token is blacklisted.",
    errors=(400, 429),
)


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


class MeOutput(UserOutput):
    is_staff = serializers.BooleanField()
    teams = serializers.SerializerMethodField(help_text="The teams you are a member of, by name.")

    @extend_schema_field(TeamBriefOutput(many=True))
    def get_teams(self, user: User) -> list[dict]:
        return TeamBriefOutput(user_teams(user), many=True).data


class MeApi(APIView):
    @extend_schema(operation_id="auth_me", responses={200: MeOutput, **error_responses()})
    def get(self, request: Request) -> Response:
        """The signed-in user, with their teams."""
        user: User = request.user
        return Response(MeOutput(user).data)


class PersonalTokenOutput(serializers.ModelSerializer):
    """A personal API token as listed: never its value."""

    created = serializers.DateTimeField(source="created_at")
    last_used = serializers.DateTimeField(
        source="last_used_at", allow_null=True, help_text="Updated at most once a minute."
    )
    expires = serializers.DateTimeField(source="expires_at", allow_null=True)

    class Meta:
        model = PersonalToken
        fields = ("id", "name", "prefix", "created", "last_used", "expires")
        read_only_fields = fields


class PersonalTokenCreatedOutput(PersonalTokenOutput):
    token = serializers.CharField(help_text="The value, `paw_…`: shown this once, never again.")

    class Meta(PersonalTokenOutput.Meta):
        fields = (*PersonalTokenOutput.Meta.fields, "token")
        read_only_fields = fields


class PersonalTokenListApi(APIView):
    throttle_classes = (TokensThrottle,)

    class InputSerializer(StrictSerializer):
        name = serializers.CharField(max_length=100)
        expires_in_days = serializers.IntegerField(
            min_value=1,
            max_value=services.PERSONAL_TOKEN_MAX_DAYS,
            required=False,
            allow_null=True,
            help_text="Days until it expires; left out or null: it does not expire.",
        )

    @extend_schema(
        operation_id="auth_tokens_list",
        responses={200: PersonalTokenOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request) -> Response:
        """Your personal API tokens (names and dates, never the values), newest first."""
        return paginated_response(
            request=request,
            view=self,
            queryset=selectors.personal_token_list(user=request.user),
            serializer_class=PersonalTokenOutput,
        )

    @extend_schema(
        operation_id="auth_tokens_create",
        request=InputSerializer,
        responses={201: PersonalTokenCreatedOutput, **error_responses(400, 403, 429)},
    )
    def post(self, request: Request) -> Response:
        """Make a personal API token: `Authorization: Bearer paw_…` on every endpoint and
        the websocket. The answer carries the value, shown this once."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = services.personal_token_create(user=request.user, **data.validated_data)
        body = {**PersonalTokenOutput(token).data, "token": raw}
        return Response(body, status=status.HTTP_201_CREATED)


class PersonalTokenDetailApi(APIView):
    throttle_classes = (TokensThrottle,)

    @extend_schema(
        operation_id="auth_tokens_destroy", responses={204: None, **error_responses(403, 404)}
    )
    def delete(self, request: Request, token_id: int) -> Response:
        """Revoke (delete) a token: it stops working at once."""
        services.personal_token_delete(user=request.user, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
