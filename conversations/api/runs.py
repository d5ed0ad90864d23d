"""Runs API: start a run (or a new version of the last turn: edit, regenerate), list and
read runs, cancel one."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.models import Run
from conversations.rendering import markdown_render
from conversations.selectors.runs import RunVersions, run_get, run_list, run_versions
from conversations.services.attachments import MAX_ATTACHMENTS
from conversations.services.runs import (
    MAX_PROMPT_CHARS,
    run_cancel,
    run_replace,
    run_start,
    sql_ask,
)
from paw_project.api import PawPagination, StrictSerializer, error_responses, paginated_response
from paw_project.throttles import RunsThrottle


class ErrorEntry(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class UsageOutput(serializers.Serializer):
    input = serializers.IntegerField(help_text="Input tokens of every model call of the run.")
    output = serializers.IntegerField(help_text="Output tokens.")
    rounds = serializers.IntegerField(help_text="Model calls.")
    estimated = serializers.BooleanField(help_text="The provider sent no usage: PAW estimated it.")


class VerifiedQueryOutput(serializers.Serializer):
    """The verified example whose SQL a run's result ran."""

    id = serializers.IntegerField(help_text="The knowledge entry's id.")
    title = serializers.CharField(help_text="Its question.")
    datasource = serializers.CharField()
    verified_at = serializers.DateTimeField()


class LineageEntryOutput(serializers.Serializer):
    """A knowledge entry an answer rests on."""

    id = serializers.IntegerField(help_text="The knowledge entry's id.")
    kind = serializers.ChoiceField(choices=["schema", "doc", "example"])
    title = serializers.CharField()
    datasource = serializers.CharField(help_text="Its datasource's slug.")
    source = serializers.ChoiceField(
        choices=["given", "retrieved"],
        help_text="given: chosen by PAW for the prompt; retrieved: found by the agent's "
        "search_knowledge.",
    )


class LineageOutput(serializers.Serializer):
    """What the answer of a run on datasources rests on (docs/data.md)."""

    datasources = serializers.ListField(child=serializers.CharField())
    entries = LineageEntryOutput(many=True)
    tables = serializers.ListField(
        child=serializers.CharField(), help_text="The tables its statements that ran read."
    )
    columns = serializers.ListField(
        child=serializers.CharField(),
        help_text="The columns they read: table.column, or column when its table cannot be told.",
    )


class SqlResultOutput(serializers.Serializer):
    """The rows of the run's last ``run_sql`` query that returned any, and, once a run on
    datasources finished, its ``lineage`` (a run without such a query: ``lineage`` only)."""

    datasource = serializers.CharField(required=False, help_text="The datasource it ran on.")
    sql = serializers.CharField(required=False, help_text="The statement.")
    columns = serializers.ListField(child=serializers.CharField(), required=False)
    rows = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField()),
        required=False,
        help_text="The first PAW_SQL_RESULT_ROWS rows, one list of values per row.",
    )
    row_count = serializers.IntegerField(
        required=False, help_text="Rows the statement returned (counted up to 100,000)."
    )
    truncated = serializers.BooleanField(
        required=False, help_text="Fewer rows here than the statement returned."
    )
    lineage = LineageOutput(
        required=False,
        help_text="What the answer rests on; set when a run on datasources finishes.",
    )
    verified = VerifiedQueryOutput(
        required=False,
        help_text="Present when the statement is a verified example's (compared as parsed "
        "SQL, by PAW): that example.",
    )


class VersionFieldsMixin(serializers.Serializer):
    """The fields of a run's place among the versions of its turn (an edited prompt or a
    regenerated answer is a new version): ``replaces``, ``replaced_by``, ``version``,
    ``versions``. Read from ``context["versions"]`` (``run_versions`` of the
    conversation) when given; else looked up once per conversation and kept there."""

    replaces = serializers.UUIDField(
        source="replaces_id",
        allow_null=True,
        read_only=True,
        help_text="The earlier version of this turn that this run answers anew, or null.",
    )
    replaced_by = serializers.SerializerMethodField(
        help_text="The next version of this turn, or null for the newest (the one the "
        "agent remembers)."
    )
    version = serializers.SerializerMethodField(
        help_text="Which version of its turn this run is: 1 for the first."
    )
    versions = serializers.SerializerMethodField(
        help_text="The run ids of every version of this turn, oldest first ([its own id] "
        "when it has only one)."
    )

    def _versions(self, run: Run) -> RunVersions:
        cache = self.context.setdefault("versions", {})
        if run.id not in cache:
            cache.update(run_versions(conversation_id=run.conversation_id))
        return cache.get(run.id) or RunVersions(version=1, versions=[run.id], replaced_by=None)

    @extend_schema_field(serializers.UUIDField(allow_null=True))
    def get_replaced_by(self, run: Run) -> UUID | None:
        return self._versions(run).replaced_by

    @extend_schema_field(serializers.IntegerField())
    def get_version(self, run: Run) -> int:
        return self._versions(run).version

    @extend_schema_field(serializers.ListField(child=serializers.UUIDField()))
    def get_versions(self, run: Run) -> list[UUID]:
        return self._versions(run).versions


class RunOutput(VersionFieldsMixin, serializers.ModelSerializer):
    """A run: its prompt, status, answer, errors, model and token usage; for a question
    asked with ``POST /api/sql/ask`` (``kind`` ``sql``) its ``result`` table."""

    conversation_id = serializers.UUIDField(read_only=True)
    errors = ErrorEntry(many=True)
    tools = serializers.ListField(
        child=serializers.CharField(), help_text="The only tools the run may use; [] for all."
    )
    attachments = serializers.ListField(
        child=serializers.CharField(),
        help_text="The workspace images sent to the model with the prompt.",
    )
    result = SqlResultOutput(
        allow_null=True,
        help_text="The last run_sql of the run that returned rows and, once a run on "
        "datasources finished, its lineage; null when neither.",
    )
    usage = serializers.SerializerMethodField()
    answer_html = serializers.SerializerMethodField(
        help_text="The answer rendered from Markdown and sanitized; relative images and "
        "links point at the conversation's artifacts."
    )
    runtime_gated = serializers.BooleanField(
        allow_null=True,
        help_text="Whether the agent runtime that ran it asks before its risky tools act "
        "(paw-agent: true); false for an ungated runtime (python-agent-harness), whose tools "
        "run without asking, so approvals did not apply; null until its runtime started it.",
    )
    created = serializers.DateTimeField(source="created_at")
    started = serializers.DateTimeField(source="started_at", allow_null=True)
    finished = serializers.DateTimeField(source="finished_at", allow_null=True)

    class Meta:
        model = Run
        fields = (
            "id", "conversation_id", "kind", "prompt", "status", "answer", "answer_html",
            "errors", "provider", "model",
            "datasources", "tools", "attachments", "result", "usage", "runtime_gated",
            "replaces", "replaced_by", "version", "versions", "created", "started", "finished",
        )  # fmt: skip
        read_only_fields = fields

    def get_answer_html(self, run: Run) -> str:
        return markdown_render(run.answer, conversation_id=run.conversation_id)

    @extend_schema_field(UsageOutput)
    def get_usage(self, run: Run) -> dict:
        """Final counts once the run ended; zeros before."""
        usage = run.usage or {}
        return {
            "input": usage.get("input", 0),
            "output": usage.get("output", 0),
            "rounds": usage.get("rounds", 0),
            "estimated": bool(usage.get("estimated", False)),
        }


class RunListApi(APIView):
    pagination_class = PawPagination

    class InputSerializer(StrictSerializer):
        prompt = serializers.CharField(
            max_length=MAX_PROMPT_CHARS,
            trim_whitespace=True,
            required=False,
            help_text="Required, except with `replaces`: left out there, the replaced "
            "prompt is sent again (regenerate).",
        )
        replaces = serializers.UUIDField(
            required=False,
            help_text="Answer the last turn anew: the id of (any version of) the "
            "conversation's last run. With `prompt` the prompt is edited, without it the "
            "answer is regenerated. The new run is the turn's next version; the replaced "
            "one stays stored and leaves the agent's memory.",
        )
        llm_provider = serializers.CharField(max_length=64, required=False, allow_blank=True)
        llm_model = serializers.CharField(max_length=200, required=False, allow_blank=True)
        datasources = serializers.ListField(
            child=serializers.CharField(max_length=100),
            required=False,
            max_length=20,
            help_text="The datasources this run may query; left out: the conversation's "
            "`datasources`; `[]`: none.",
        )
        attachments = serializers.ListField(
            child=serializers.CharField(max_length=1000),
            required=False,
            max_length=MAX_ATTACHMENTS,
            help_text="Images of the workspace (paths, e.g. an upload's name) to send to the "
            "model with the prompt: PNG, JPEG or WebP, each at most PAW_MAX_IMAGE_BYTES; "
            "400 `model_without_vision` when the run's model does not accept images.",
        )

        def validate(self, attrs: dict) -> dict:
            if "prompt" not in attrs and "replaces" not in attrs:
                raise serializers.ValidationError(
                    {"prompt": [ErrorDetail("This field is required.", code="required")]}
                )
            return attrs

    def get_throttles(self):
        # Only starting a run is throttled; reading them is not.
        return [RunsThrottle()] if self.request.method == "POST" else []

    @extend_schema(
        operation_id="runs_list", responses={200: RunOutput(many=True), **error_responses(404)}
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """The conversation's runs, newest first (paginated)."""
        return paginated_response(
            request=request,
            view=self,
            queryset=run_list(user=request.user, conversation_id=conversation_id),
            serializer_class=RunOutput,
            pagination_class=PawPagination,
        )

    @extend_schema(
        operation_id="runs_create",
        request=InputSerializer,
        responses={202: RunOutput, **error_responses(400, 402, 404, 409, 429)},
    )
    def post(self, request: Request, conversation_id: UUID) -> Response:
        """Start a run: 202 with the queued run; follow it on the websocket or by polling
        `events`. 409 `run_active` while another run of the conversation is active, 402
        `budget_exhausted` when the monthly token budget is used up.

        With `replaces` (the id of a version of the last turn) the run answers that turn
        anew: `prompt` edits it, no `prompt` regenerates the answer. 404 for a run not in
        the conversation, 409 `not_last_turn` for an earlier turn, 409 `run_active` while
        a run is active."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        replaces = values.pop("replaces", None)
        if replaces is not None:
            run = run_replace(
                user=request.user, conversation_id=conversation_id, run_id=replaces, **values
            )
        else:
            run = run_start(user=request.user, conversation_id=conversation_id, **values)
        return Response(RunOutput(run).data, status=status.HTTP_202_ACCEPTED)


class RunDetailApi(APIView):
    @extend_schema(operation_id="runs_retrieve", responses={200: RunOutput, **error_responses(404)})
    def get(self, request: Request, conversation_id: UUID, run_id: UUID) -> Response:
        """One run."""
        return Response(
            RunOutput(
                run_get(user=request.user, conversation_id=conversation_id, run_id=run_id)
            ).data
        )


class RunCancelApi(APIView):
    @extend_schema(
        operation_id="runs_cancel",
        request=None,
        responses={202: RunOutput, **error_responses(404, 409)},
    )
    def post(self, request: Request, conversation_id: UUID, run_id: UUID) -> Response:
        """Ask a run to stop: 202; it ends `cancelled` shortly (a queued one at once).
        409 `run_finished` when it has already ended."""
        run = run_cancel(user=request.user, conversation_id=conversation_id, run_id=run_id)
        return Response(RunOutput(run).data, status=status.HTTP_202_ACCEPTED)


class SqlAskApi(APIView):
    """``POST /api/sql/ask``: a question about a datasource, answered with SQL."""

    throttle_classes = (RunsThrottle,)

    class InputSerializer(StrictSerializer):
        datasource = serializers.CharField(max_length=100, help_text="The datasource's slug.")
        question = serializers.CharField(max_length=MAX_PROMPT_CHARS, trim_whitespace=True)
        conversation = serializers.UUIDField(
            required=False, allow_null=True, help_text="Ask in this conversation (else a new one)."
        )
        llm_provider = serializers.CharField(max_length=64, required=False, allow_blank=True)
        llm_model = serializers.CharField(max_length=200, required=False, allow_blank=True)

    @extend_schema(
        operation_id="sql_ask",
        request=InputSerializer,
        responses={202: RunOutput, **error_responses(400, 402, 404, 409, 429)},
    )
    def post(self, request: Request) -> Response:
        """Start a run that answers `question` with SQL on `datasource`, with only the
        tools `run_sql`, `search_knowledge` and `ask_user`, in `conversation` or a new one:
        202 with the queued run (`id`, `conversation_id`, `status` …). Follow it like any
        run; once finished, `GET .../runs/{id}` has `result`: `{sql, columns, rows,
        row_count, truncated, lineage}` (`lineage`: the knowledge, tables and columns the
        answer rests on), and `verified` when the SQL is a verified example's. A statement
        that changes data still waits for an approval."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        run = sql_ask(
            user=request.user,
            datasource=values["datasource"],
            question=values["question"],
            conversation_id=values.get("conversation"),
            llm_provider=values.get("llm_provider"),
            llm_model=values.get("llm_model"),
        )
        return Response(RunOutput(run).data, status=status.HTTP_202_ACCEPTED)
