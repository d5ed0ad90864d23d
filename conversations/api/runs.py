"""Runs API: start a run, list and read runs, cancel one."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.models import Run
from conversations.rendering import markdown_render
from conversations.selectors.runs import run_get, run_list
from conversations.services.runs import MAX_PROMPT_CHARS, run_cancel, run_start
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


class RunOutput(serializers.ModelSerializer):
    """A run: its prompt, status, answer, errors, model and token usage."""

    conversation_id = serializers.UUIDField(read_only=True)
    errors = ErrorEntry(many=True)
    usage = serializers.SerializerMethodField()
    answer_html = serializers.SerializerMethodField(
        help_text="The answer rendered from Markdown and sanitized; relative images and "
        "links point at the conversation's artifacts."
    )
    created = serializers.DateTimeField(source="created_at")
    started = serializers.DateTimeField(source="started_at", allow_null=True)
    finished = serializers.DateTimeField(source="finished_at", allow_null=True)

    class Meta:
        model = Run
        fields = (
            "id", "conversation_id", "prompt", "status", "answer", "answer_html", "errors",
            "provider", "model",
            "datasources", "usage", "created", "started", "finished",
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
    class InputSerializer(StrictSerializer):
        prompt = serializers.CharField(max_length=MAX_PROMPT_CHARS, trim_whitespace=True)
        llm_provider = serializers.CharField(max_length=64, required=False, allow_blank=True)
        llm_model = serializers.CharField(max_length=200, required=False, allow_blank=True)
        datasources = serializers.ListField(
            child=serializers.CharField(max_length=100), required=False, max_length=20
        )

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
        `budget_exhausted` when the monthly token budget is used up."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = run_start(user=request.user, conversation_id=conversation_id, **data.validated_data)
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
