"""Datasource knowledge over REST: staff manage the entries and ask for a schema refresh
(``/api/admin/datasources/{slug}/...``); users read a datasource with its docs, examples
and a summary of its schema (``GET /api/datasources/{slug}``)."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.adminkit import operator_write_log
from paw_project.api import StrictSerializer, error_responses, paginated_response
from paw_project.errors import InvalidRequest, NotFound
from secrets_vault.api.operators import AdminDatasourceOutput, datasource_or_404
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import (
    datasources_for_user,
    knowledge_get,
    knowledge_list,
)
from secrets_vault.services import (
    datasource_schema_refresh_request,
    knowledge_entry_create,
    knowledge_entry_delete,
    knowledge_entry_unverify,
    knowledge_entry_update,
    knowledge_entry_verify,
)
from secrets_vault.services.knowledge import MAX_TEXT, MAX_TITLE

#: Docs and examples listed per datasource to users (the staff API pages through all).
USER_LIST_LIMIT = 1000


class KnowledgeEntryOutput(serializers.Serializer):
    """One knowledge entry (``sql`` is empty except for examples)."""

    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=KnowledgeEntry.Kind.choices)
    title = serializers.CharField()
    text = serializers.CharField()
    sql = serializers.CharField()
    flag_reason = serializers.CharField(
        help_text="Why runs are not given this entry until an operator acts (empty: they "
        "are): an example whose SQL the current rule does not call a read."
    )
    stale_error = serializers.CharField(
        help_text="Examples: the database's error when the last schema refresh ran it "
        "again (empty: it passed). Runs are not given a stale example until its SQL passes "
        "again (the next refresh, or saving it)."
    )
    stale_since = serializers.DateTimeField(
        allow_null=True, help_text="Since when it is stale (null: it is not)."
    )
    checked_at = serializers.DateTimeField(
        allow_null=True,
        help_text="Examples: when its SQL last ran (saved or re-checked by a refresh).",
    )
    verified_by = serializers.CharField(
        source="verified_by.username",
        allow_null=True,
        help_text="Examples only: who verified it (null: not verified, or the account is gone).",
    )
    verified_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When the example was verified; null when it is not. Changing its SQL clears it.",
    )
    verified_version = serializers.IntegerField(
        allow_null=True,
        help_text="The datasource's knowledge_version it was verified against, or null.",
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


def _entry_or_404(datasource: Datasource, entry_id: int) -> KnowledgeEntry:
    entry = knowledge_get(datasource=datasource, entry_id=entry_id)
    if entry is None:
        raise NotFound("No such knowledge entry.", code="knowledge_not_found")
    return entry


class AdminKnowledgeListApi(APIView):
    """``GET /api/admin/datasources/{slug}/knowledge[?kind=]``: the entries, paginated;
    ``POST {kind, title, text?, sql?}`` adds a doc or an example (201)."""

    permission_classes = (IsAdminUser,)

    class InputSerializer(StrictSerializer):
        kind = serializers.ChoiceField(choices=KnowledgeEntry.Kind.choices)
        title = serializers.CharField(max_length=MAX_TITLE)
        text = serializers.CharField(
            max_length=MAX_TEXT, required=False, allow_blank=True, default=""
        )
        sql = serializers.CharField(
            max_length=MAX_TEXT, required=False, allow_blank=True, default=""
        )

    @extend_schema(
        operation_id="admin_knowledge_list",
        parameters=[OpenApiParameter("kind", enum=KnowledgeEntry.Kind.values, required=False)],
        responses={200: KnowledgeEntryOutput(many=True), **error_responses(400, 403, 404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        kind = request.query_params.get("kind") or None
        if kind is not None and kind not in KnowledgeEntry.Kind.values:
            raise InvalidRequest("kind is one of schema, doc, example.", code="invalid_kind")
        return paginated_response(
            request=request,
            view=self,
            queryset=knowledge_list(datasource=datasource_or_404(slug), kind=kind).select_related(
                "verified_by"
            ),
            serializer_class=KnowledgeEntryOutput,
        )

    @extend_schema(
        operation_id="admin_knowledge_create",
        request=InputSerializer,
        responses={201: KnowledgeEntryOutput, **error_responses(400, 403, 404)},
    )
    def post(self, request: Request, slug: str) -> Response:
        """A doc (`title`, Markdown `text`) or an example (the question as `title`, the
        `sql` answering it, run read-only first: 400 `example_failed` with the database's
        error). Schema entries come only from a refresh (400 `schema_is_harvested`)."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = knowledge_entry_create(
            datasource=datasource_or_404(slug), user=request.user, **data.validated_data
        )
        operator_write_log(request=request, obj=entry, action="add")
        return Response(KnowledgeEntryOutput(entry).data, status=status.HTTP_201_CREATED)


class AdminKnowledgeDetailApi(APIView):
    """``GET/PATCH/DELETE /api/admin/datasources/{slug}/knowledge/{id}``."""

    permission_classes = (IsAdminUser,)

    class InputSerializer(StrictSerializer):
        title = serializers.CharField(max_length=MAX_TITLE, required=False)
        text = serializers.CharField(max_length=MAX_TEXT, required=False, allow_blank=True)
        sql = serializers.CharField(max_length=MAX_TEXT, required=False, allow_blank=True)

    @extend_schema(
        operation_id="admin_knowledge_retrieve",
        responses={200: KnowledgeEntryOutput, **error_responses(403, 404)},
    )
    def get(self, request: Request, slug: str, entry_id: int) -> Response:
        entry = _entry_or_404(datasource_or_404(slug), entry_id)
        return Response(KnowledgeEntryOutput(entry).data)

    @extend_schema(
        operation_id="admin_knowledge_update",
        request=InputSerializer,
        responses={200: KnowledgeEntryOutput, **error_responses(400, 403, 404)},
    )
    def patch(self, request: Request, slug: str, entry_id: int) -> Response:
        """Change a doc's or an example's `title`, `text` or `sql` (a changed SQL is
        checked again). Schema entries are the database's: 400 `schema_is_harvested`."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = _entry_or_404(datasource_or_404(slug), entry_id)
        entry = knowledge_entry_update(entry=entry, user=request.user, **data.validated_data)
        operator_write_log(
            request=request, obj=entry, action="change", fields=sorted(data.validated_data)
        )
        return Response(KnowledgeEntryOutput(entry).data)

    @extend_schema(
        operation_id="admin_knowledge_destroy", responses={204: None, **error_responses(403, 404)}
    )
    def delete(self, request: Request, slug: str, entry_id: int) -> Response:
        entry = _entry_or_404(datasource_or_404(slug), entry_id)
        with transaction.atomic():
            operator_write_log(request=request, obj=entry, action="delete")
            knowledge_entry_delete(entry=entry)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AdminKnowledgeVerifyApi(APIView):
    """``POST /api/admin/datasources/{slug}/knowledge/{id}/verify``: mark an example
    verified by the caller, now, against the datasource's current knowledge version."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_knowledge_verify",
        request=None,
        responses={200: KnowledgeEntryOutput, **error_responses(400, 403, 404)},
    )
    def post(self, request: Request, slug: str, entry_id: int) -> Response:
        """Verified examples come first among those a run is given, and an answer with
        the same SQL (as parsed) is shown as a verified query. Verifying again renews it.
        400 `not_an_example` (a doc or a schema entry), `example_flagged` (kept from
        runs: fix its SQL first)."""
        entry = _entry_or_404(datasource_or_404(slug), entry_id)
        with transaction.atomic():
            entry = knowledge_entry_verify(entry=entry, user=request.user)
            operator_write_log(request=request, obj=entry, action="change", note="verified")
        return Response(KnowledgeEntryOutput(entry).data)


class AdminKnowledgeUnverifyApi(APIView):
    """``POST /api/admin/datasources/{slug}/knowledge/{id}/unverify``: clear an
    example's verification."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_knowledge_unverify",
        request=None,
        responses={200: KnowledgeEntryOutput, **error_responses(400, 403, 404)},
    )
    def post(self, request: Request, slug: str, entry_id: int) -> Response:
        """Nothing to do (200) when it is not verified; 400 `not_an_example`."""
        entry = _entry_or_404(datasource_or_404(slug), entry_id)
        with transaction.atomic():
            entry = knowledge_entry_unverify(entry=entry)
            operator_write_log(request=request, obj=entry, action="change", note="unverified")
        return Response(KnowledgeEntryOutput(entry).data)


class AdminDatasourceRefreshSchemaApi(APIView):
    """``POST /api/admin/datasources/{slug}/refresh-schema``: 202; a worker harvests the
    live schema (credentials resolved there) and replaces the schema entries, or records
    the database's error in `schema_error`."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_datasource_refresh_schema",
        request=None,
        responses={202: AdminDatasourceOutput, **error_responses(403, 404)},
    )
    def post(self, request: Request, slug: str) -> Response:
        datasource = datasource_schema_refresh_request(
            datasource=datasource_or_404(slug), user=request.user
        )
        operator_write_log(
            request=request, obj=datasource, action="change", note="schema refresh requested"
        )
        return Response(AdminDatasourceOutput(datasource).data, status=status.HTTP_202_ACCEPTED)


class _SchemaTable(serializers.Serializer):
    name = serializers.CharField(source="title", help_text="The table's name, as SQL writes it.")
    summary = serializers.SerializerMethodField(
        help_text="Its kind, number of columns, row estimate and comment."
    )

    def get_summary(self, entry: KnowledgeEntry) -> str:
        return entry.text.split("\n", 1)[0]


class _Schema(serializers.Serializer):
    refreshed_at = serializers.DateTimeField(allow_null=True)
    tables = _SchemaTable(many=True)


class _Doc(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()
    text = serializers.CharField()
    updated_at = serializers.DateTimeField()


class _Example(_Doc):
    sql = serializers.CharField()
    verified_at = serializers.DateTimeField(
        allow_null=True, help_text="When a staff member verified it; null when not verified."
    )


class DatasourceDetailApi(APIView):
    """``GET /api/datasources/{slug}``: an enabled datasource the caller may use, with what
    the agent knows of it: its docs and examples, and its schema summarized (one line per
    table); 404 for one they may not use, as for an unknown one."""

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "DatasourceDetailOutput"

        slug = serializers.CharField()
        name = serializers.CharField()
        description = serializers.CharField()
        dialect = serializers.CharField()
        schema = _Schema()
        docs = _Doc(many=True)
        examples = _Example(many=True)

    @extend_schema(
        operation_id="datasource_detail",
        responses={200: OutputSerializer, **error_responses(404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        # One the caller may not use is a 404 like an unknown one: nothing says it exists.
        datasource = datasources_for_user(request.user).filter(slug=slug).first()
        if datasource is None:
            raise NotFound(f"No datasource '{slug}'.", code="datasource_not_found")
        entries = knowledge_list(datasource=datasource)
        data = {
            "slug": datasource.slug,
            "name": datasource.name,
            "description": datasource.description,
            "dialect": datasource.dialect,
            "schema": {
                "refreshed_at": datasource.schema_refreshed_at,
                "tables": entries.filter(kind=KnowledgeEntry.Kind.SCHEMA).only("title", "text")[
                    : USER_LIST_LIMIT * 2
                ],
            },
            "docs": entries.filter(kind=KnowledgeEntry.Kind.DOC)[:USER_LIST_LIMIT],
            # A flagged or stale example is not given to runs: not what the agent knows.
            "examples": entries.filter(
                kind=KnowledgeEntry.Kind.EXAMPLE, flag_reason="", stale_since__isnull=True
            )[:USER_LIST_LIMIT],
        }
        return Response(self.OutputSerializer(data).data)
