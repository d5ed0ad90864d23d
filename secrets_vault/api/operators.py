"""Staff-only endpoints for operators' automation (``IsAdminUser``): secrets (names and
dates on read, values only in) and datasources (full CRUD, connection test; their
knowledge: ``secrets_vault.api.knowledge``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.adminkit import operator_write_log
from paw_project.api import JsonTypedSerializer, StrictSerializer, error_responses, list_output
from paw_project.errors import InvalidRequest, NotFound
from secrets_vault.models import Datasource, DatasourceCredential, Secret
from secrets_vault.selectors import (
    datasource_credentials,
    datasource_list,
    datasource_stale_examples,
    datasources_with_stale_examples,
    secret_list_all,
)
from secrets_vault.services import (
    datasource_create,
    datasource_credential_create,
    datasource_credential_delete,
    datasource_credential_update,
    datasource_delete,
    datasource_test,
    datasource_update,
    secret_create,
    secret_delete,
    secret_update,
)
from teams.models import Access


class AdminSecretOutput(serializers.Serializer):
    """A secret as operators see it: never its value."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    scope = serializers.CharField()
    owner = serializers.CharField(source="owner.username", allow_null=True, default=None)
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)


def _secret_or_404(secret_id: int) -> Secret:
    secret = secret_list_all().filter(pk=secret_id).first()
    if secret is None:
        raise NotFound("No such secret.", code="secret_not_found")
    return secret


def _owner(username: str | None):
    if not username:
        return None
    owner = get_user_model().objects.filter(username=username).first()
    if owner is None:
        raise InvalidRequest(f"No user named {username!r}.", code="unknown_user")
    return owner


class AdminSecretListApi(APIView):
    """``GET /api/admin/secrets``: every secret; ``POST`` ``{name, scope, owner?, value,
    description?}`` creates one (201; 409 when the name is taken in that scope)."""

    permission_classes = (IsAdminUser,)

    class InputSerializer(JsonTypedSerializer):
        class Meta:
            ref_name = "AdminSecretListInput"

        name = serializers.CharField(max_length=64)
        scope = serializers.ChoiceField(choices=Secret.Scope.choices, default=Secret.Scope.GLOBAL)
        owner = serializers.CharField(required=False, allow_null=True, allow_blank=True)
        value = serializers.CharField(trim_whitespace=False, allow_blank=True)
        description = serializers.CharField(max_length=500, required=False, allow_blank=True)

    OutputSerializer = list_output(
        key="secrets", item=AdminSecretOutput, ref_name="AdminSecretListOutput"
    )

    @extend_schema(
        responses=OutputSerializer,
        summary="List all secrets (never values)",
        operation_id="admin_secrets_list",
    )
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer({"secrets": secret_list_all()}).data)

    @extend_schema(request=InputSerializer, responses={201: AdminSecretOutput})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        secret = secret_create(
            name=values["name"],
            scope=values["scope"],
            owner=_owner(values.get("owner")),
            value=values["value"],
            description=values.get("description", ""),
        )
        operator_write_log(request=request, obj=secret, action="add")
        return Response(AdminSecretOutput(secret).data, status=status.HTTP_201_CREATED)


class AdminSecretDetailApi(APIView):
    """``GET /api/admin/secrets/{id}``; ``PATCH`` ``{value?, description?}``; ``DELETE``."""

    permission_classes = (IsAdminUser,)

    class InputSerializer(JsonTypedSerializer):
        class Meta:
            ref_name = "AdminSecretUpdateInput"

        value = serializers.CharField(trim_whitespace=False, allow_blank=True, required=False)
        description = serializers.CharField(max_length=500, required=False, allow_blank=True)

    @extend_schema(responses=AdminSecretOutput)
    def get(self, request: Request, secret_id: int) -> Response:
        return Response(AdminSecretOutput(_secret_or_404(secret_id)).data)

    @extend_schema(request=InputSerializer, responses=AdminSecretOutput)
    def patch(self, request: Request, secret_id: int) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        secret = secret_update(secret=_secret_or_404(secret_id), **data.validated_data)
        operator_write_log(
            request=request, obj=secret, action="change", fields=sorted(data.validated_data)
        )
        return Response(AdminSecretOutput(secret).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, secret_id: int) -> Response:
        secret = _secret_or_404(secret_id)
        with transaction.atomic():
            operator_write_log(request=request, obj=secret, action="delete")
            secret_delete(secret=secret)
        return Response(status=status.HTTP_204_NO_CONTENT)


#: The most teams one request may set on a datasource (bounded work per request).
TEAMS_MAX = 1_000


class _TeamBrief(serializers.Serializer):
    """A team as a datasource shows it: id and name."""

    class Meta:
        ref_name = "DatasourceTeam"

    id = serializers.IntegerField()
    name = serializers.CharField()


class AdminCredentialOutput(serializers.Serializer):
    """A team's own credentials on a datasource (the password is a placeholder only)."""

    id = serializers.IntegerField()
    team = _TeamBrief()
    user = serializers.CharField(source="db_user", help_text="The database user.")
    password = serializers.CharField(help_text="A {secret:NAME} placeholder, or empty.")
    priority = serializers.IntegerField(
        help_text="Of a person's teams with their own credentials here, the highest wins."
    )
    user_privileges = serializers.JSONField(
        help_text="What this database user could do beyond reading at the last check "
        '({"refused": [...], "noted": [...]}; {} when not checked).'
    )
    privileges_checked_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class AdminDatasourceOutput(serializers.Serializer):
    """A datasource with its connection settings (passwords are placeholders only), its
    access rule and its teams' own credentials."""

    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    dialect = serializers.CharField()
    connection = serializers.JSONField()
    read_only = serializers.BooleanField()
    allow_privileged_user = serializers.BooleanField(
        help_text="Saved read-only although its database user can do more than read (unsafe)."
    )
    user_privileges = serializers.JSONField(
        help_text="What its database user could do beyond reading at the last check: "
        '{"refused": [...], "noted": [...]}; {} when not checked.'
    )
    privileges_checked_at = serializers.DateTimeField(
        allow_null=True, help_text="When that was checked (saving or testing a read-only one)."
    )
    enabled = serializers.BooleanField()
    access = serializers.CharField(
        help_text="everyone (every signed-in person) or teams (the members of its teams; "
        "staff always)."
    )
    teams = _TeamBrief(many=True, source="teams.all")
    credentials = AdminCredentialOutput(
        many=True,
        source="credentials.all",
        help_text="Teams' own database users: their members' runs connect as them.",
    )
    allowed_hosts = serializers.ListField(child=serializers.CharField())
    env = serializers.CharField(source="env_name")
    schema_requested_at = serializers.DateTimeField(
        allow_null=True, help_text="When a schema refresh was last asked for."
    )
    schema_refreshed_at = serializers.DateTimeField(
        allow_null=True, help_text="When the schema entries were last harvested."
    )
    schema_error = serializers.CharField(
        help_text="Why the last schema refresh failed (the database's error), or empty."
    )
    schema_changes = serializers.JSONField(
        help_text="What the last schema refresh changed compared to the harvest before: "
        '{"at", "first_harvest", "tables_added": [...], "tables_removed": [...], '
        '"columns_added": {table: [...]}, "columns_removed": {table: [...]}, '
        '"columns_retyped": {table: [{"column", "from", "to"}]}, "examples": {"checked", '
        '"stale", "unstaled", "pending"}}; {} before the first refresh.'
    )
    stale_examples = serializers.SerializerMethodField(
        help_text="How many of its examples are stale (failed when the last refresh ran "
        "them again; not given to runs)."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_stale_examples(self, datasource: Datasource) -> int:
        return datasource_stale_examples(datasource)


class AdminDatasourceInput(StrictSerializer):
    """Datasource fields (others: 400 ``unknown_field``); ``partial=True`` for PATCH."""

    slug = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True)
    dialect = serializers.ChoiceField(choices=Datasource.Dialect.choices)
    connection = serializers.JSONField(required=False)
    read_only = serializers.BooleanField(required=False)
    allow_privileged_user = serializers.BooleanField(
        required=False,
        help_text="Accept a read-only datasource whose database user can do more than read "
        "(unsafe; refused with 400 datasource_user_privileged otherwise).",
    )
    enabled = serializers.BooleanField(required=False)
    access = serializers.ChoiceField(
        choices=Access.choices,
        required=False,
        help_text="everyone, or teams: only the members of `teams` (and staff). A new "
        "datasource is teams with no team (staff only) unless told otherwise.",
    )
    teams = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31 - 1), required=False,
        max_length=TEAMS_MAX,
        help_text="Team ids (GET /api/admin/teams): the whole list; an unknown id is 400 "
        "unknown_team.",
    )  # fmt: skip
    allowed_hosts = serializers.ListField(
        child=serializers.CharField(max_length=260), required=False, max_length=20,
        help_text="More destinations an isolated sandbox may reach when a run uses it.",
    )  # fmt: skip


def _datasources() -> QuerySet[Datasource]:
    """Every datasource, with what the output shows of its teams and credentials."""
    return datasources_with_stale_examples(datasource_list(enabled_only=False)).prefetch_related(
        "teams",
        Prefetch("credentials", queryset=DatasourceCredential.objects.select_related("team")),
    )


def datasource_or_404(slug: str) -> Datasource:
    datasource = _datasources().filter(slug=slug).first()
    if datasource is None:
        raise NotFound(f"No datasource '{slug}'.", code="datasource_not_found")
    return datasource


class AdminDatasourceListApi(APIView):
    """``GET /api/admin/datasources``: all, enabled or not; ``POST`` creates one (201;
    400 for a literal password; 409 when the slug is taken)."""

    permission_classes = (IsAdminUser,)

    OutputSerializer = list_output(
        key="datasources", item=AdminDatasourceOutput, ref_name="AdminDatasourceListOutput"
    )

    @extend_schema(responses=OutputSerializer, operation_id="admin_datasources_list")
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer({"datasources": _datasources()}).data)

    @extend_schema(request=AdminDatasourceInput, responses={201: AdminDatasourceOutput})
    def post(self, request: Request) -> Response:
        data = AdminDatasourceInput(data=request.data)
        data.is_valid(raise_exception=True)
        datasource = datasource_create(**data.validated_data)
        operator_write_log(request=request, obj=datasource, action="add")
        return Response(
            AdminDatasourceOutput(datasource_or_404(datasource.slug)).data,
            status=status.HTTP_201_CREATED,
        )


class AdminDatasourceDetailApi(APIView):
    """``GET /api/admin/datasources/{slug}``; ``PATCH`` any fields; ``DELETE``."""

    permission_classes = (IsAdminUser,)

    @extend_schema(responses=AdminDatasourceOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(AdminDatasourceOutput(datasource_or_404(slug)).data)

    @extend_schema(request=AdminDatasourceInput, responses=AdminDatasourceOutput)
    def patch(self, request: Request, slug: str) -> Response:
        data = AdminDatasourceInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        datasource = datasource_update(datasource=datasource_or_404(slug), **data.validated_data)
        operator_write_log(
            request=request, obj=datasource, action="change", fields=sorted(data.validated_data)
        )
        return Response(AdminDatasourceOutput(datasource_or_404(datasource.slug)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str) -> Response:
        datasource = datasource_or_404(slug)
        with transaction.atomic():
            operator_write_log(request=request, obj=datasource, action="delete")
            datasource_delete(datasource=datasource)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AdminDatasourceTestApi(APIView):
    """``POST /api/admin/datasources/{slug}/test``: really connect (placeholders resolved
    for the caller) → ``{ok, message}``; always 200, the outcome is in ``ok``."""

    permission_classes = (IsAdminUser,)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AdminDatasourceTestOutput"

        ok = serializers.BooleanField()
        message = serializers.CharField()

    @extend_schema(request=None, responses=OutputSerializer)
    def post(self, request: Request, slug: str) -> Response:
        result = datasource_test(datasource=datasource_or_404(slug), user=request.user)
        return Response(self.OutputSerializer(result).data)


class AdminCredentialInput(JsonTypedSerializer):
    """A team credential's fields; ``partial=True`` for PATCH."""

    class Meta:
        ref_name = "AdminCredentialInput"

    team = serializers.IntegerField(
        min_value=1, max_value=2**31 - 1, help_text="The team's id (GET /api/admin/teams)."
    )
    user = serializers.CharField(max_length=200, help_text="The database user its runs use.")
    password = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="A {secret:NAME} placeholder (a literal password is refused), or empty.",
    )
    priority = serializers.IntegerField(required=False, min_value=-(2**31), max_value=2**31 - 1)


def _credential_or_404(datasource: Datasource, credential_id: int) -> DatasourceCredential:
    credential = datasource_credentials(datasource=datasource).filter(pk=credential_id).first()
    if credential is None:
        raise NotFound("No such credential on this datasource.", code="credential_not_found")
    return credential


class AdminCredentialListApi(APIView):
    """``GET /api/admin/datasources/{slug}/credentials``: the teams' own credentials on it,
    highest priority first; ``POST`` ``{team, user, password?, priority?}`` gives a team
    its own (201; 400 ``unknown_team``, ``invalid`` for a literal password,
    ``credentials_not_supported`` on SQLite, ``datasource_user_privileged``; 409
    ``credential_exists``)."""

    permission_classes = (IsAdminUser,)

    OutputSerializer = list_output(
        key="credentials", item=AdminCredentialOutput, ref_name="AdminCredentialListOutput"
    )

    @extend_schema(
        operation_id="admin_datasource_credentials_list",
        responses={200: OutputSerializer, **error_responses(403, 404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        credentials = datasource_credentials(datasource=datasource_or_404(slug))
        return Response(self.OutputSerializer({"credentials": credentials}).data)

    @extend_schema(
        operation_id="admin_datasource_credentials_create",
        request=AdminCredentialInput,
        responses={201: AdminCredentialOutput, **error_responses(400, 403, 404, 409)},
    )
    def post(self, request: Request, slug: str) -> Response:
        datasource = datasource_or_404(slug)
        data = AdminCredentialInput(data=request.data)
        data.is_valid(raise_exception=True)
        credential = datasource_credential_create(datasource=datasource, **data.validated_data)
        operator_write_log(request=request, obj=credential, action="add")
        return Response(
            AdminCredentialOutput(_credential_or_404(datasource, credential.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class AdminCredentialDetailApi(APIView):
    """``GET /api/admin/datasources/{slug}/credentials/{id}``; ``PATCH`` any of ``team``,
    ``user``, ``password``, ``priority`` (checked as a new one); ``DELETE`` (204: the
    team's runs connect as the datasource's own user again)."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_datasource_credentials_retrieve",
        responses={200: AdminCredentialOutput, **error_responses(403, 404)},
    )
    def get(self, request: Request, slug: str, credential_id: int) -> Response:
        credential = _credential_or_404(datasource_or_404(slug), credential_id)
        return Response(AdminCredentialOutput(credential).data)

    @extend_schema(
        operation_id="admin_datasource_credentials_update",
        request=AdminCredentialInput,
        responses={200: AdminCredentialOutput, **error_responses(400, 403, 404, 409)},
    )
    def patch(self, request: Request, slug: str, credential_id: int) -> Response:
        datasource = datasource_or_404(slug)
        credential = _credential_or_404(datasource, credential_id)
        data = AdminCredentialInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        datasource_credential_update(credential=credential, **data.validated_data)
        operator_write_log(
            request=request, obj=credential, action="change", fields=sorted(data.validated_data)
        )
        return Response(AdminCredentialOutput(_credential_or_404(datasource, credential_id)).data)

    @extend_schema(
        operation_id="admin_datasource_credentials_destroy",
        responses={204: None, **error_responses(403, 404)},
    )
    def delete(self, request: Request, slug: str, credential_id: int) -> Response:
        credential = _credential_or_404(datasource_or_404(slug), credential_id)
        with transaction.atomic():
            operator_write_log(request=request, obj=credential, action="delete")
            datasource_credential_delete(credential=credential)
        return Response(status=status.HTTP_204_NO_CONTENT)
