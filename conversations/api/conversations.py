"""Conversations API: list, create, read, update, delete; history; forgetting the session."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.models import Conversation, Run
from conversations.rendering import markdown_render
from conversations.selectors.conversations import (
    conversation_active_run_id,
    conversation_get,
    conversation_history,
    conversation_list,
)
from conversations.services.conversations import (
    conversation_create,
    conversation_delete,
    conversation_session_reset,
    conversation_update,
)
from paw_project.api import (
    PawCursorPagination,
    StrictSerializer,
    error_responses,
    paginated_response,
)


class ConversationPagination(PawCursorPagination):
    """Newest activity first; ties by newest created, then id."""

    ordering = ("-last_activity_at", "-created_at", "-id")


def _iso(value: datetime | None) -> str | None:
    """A datetime as DRF's ``DateTimeField`` writes it (UTC, ``Z`` suffix)."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class ConversationOutput(serializers.ModelSerializer):
    """A conversation as every endpoint returns it.

    ``to_representation`` builds the dict directly: the conversation list is the API's
    hottest read, and DRF's generic per-field path cost more than the queries (see
    ``bench/api.py``). A test pins it to what the declared fields would give.
    """

    created = serializers.DateTimeField(source="created_at")
    updated = serializers.DateTimeField(source="updated_at")
    last_activity = serializers.DateTimeField(source="last_activity_at")
    active_run_id = serializers.SerializerMethodField(
        help_text="The run going on now (queued, starting or running), or null."
    )

    class Meta:
        model = Conversation
        fields = (
            "id",
            "title",
            "auto_approve",
            "llm_provider",
            "llm_model",
            "created",
            "updated",
            "last_activity",
            "memory_since",
            "active_run_id",
        )
        read_only_fields = fields

    @extend_schema_field(serializers.UUIDField(allow_null=True))
    def get_active_run_id(self, conversation: Conversation) -> str | None:
        active = conversation_active_run_id(conversation)
        return str(active) if active else None

    def to_representation(self, conversation: Conversation) -> dict:
        return {
            "id": str(conversation.id),
            "title": conversation.title,
            "auto_approve": conversation.auto_approve,
            "llm_provider": conversation.llm_provider,
            "llm_model": conversation.llm_model,
            "created": _iso(conversation.created_at),
            "updated": _iso(conversation.updated_at),
            "last_activity": _iso(conversation.last_activity_at),
            "memory_since": _iso(conversation.memory_since),
            "active_run_id": self.get_active_run_id(conversation),
        }


class _ConversationFields(StrictSerializer):
    title = serializers.CharField(max_length=200, allow_blank=True)
    auto_approve = serializers.BooleanField()
    llm_provider = serializers.CharField(max_length=64, allow_blank=True)
    llm_model = serializers.CharField(max_length=200, allow_blank=True)


class ConversationListApi(APIView):
    class InputSerializer(_ConversationFields):
        title = serializers.CharField(max_length=200, allow_blank=True, required=False)
        auto_approve = serializers.BooleanField(required=False)
        llm_provider = serializers.CharField(max_length=64, allow_blank=True, required=False)
        llm_model = serializers.CharField(max_length=200, allow_blank=True, required=False)

    pagination_class = ConversationPagination

    @extend_schema(
        operation_id="conversations_list",
        responses={200: ConversationOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request) -> Response:
        """The user's conversations, newest activity first, cursor-paginated: follow
        `next` for older ones."""
        return paginated_response(
            request=request,
            view=self,
            queryset=conversation_list(user=request.user),
            serializer_class=ConversationOutput,
            pagination_class=ConversationPagination,
        )

    @extend_schema(
        operation_id="conversations_create",
        request=InputSerializer,
        responses={201: ConversationOutput, **error_responses(400, 403)},
    )
    def post(self, request: Request) -> Response:
        """Start a new conversation (all fields optional)."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        conversation = conversation_create(user=request.user, **data.validated_data)
        return Response(ConversationOutput(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailApi(APIView):
    class InputSerializer(_ConversationFields):
        pass

    @extend_schema(
        operation_id="conversations_retrieve",
        responses={200: ConversationOutput, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """One conversation of the user."""
        conversation = conversation_get(user=request.user, conversation_id=conversation_id)
        return Response(ConversationOutput(conversation).data)

    @extend_schema(
        operation_id="conversations_update",
        request=InputSerializer(partial=True),
        responses={200: ConversationOutput, **error_responses(400, 403, 404)},
    )
    def patch(self, request: Request, conversation_id: UUID) -> Response:
        """Change the title, `auto_approve`, or the default provider and model."""
        data = self.InputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        conversation = conversation_update(
            user=request.user, conversation_id=conversation_id, **data.validated_data
        )
        return Response(ConversationOutput(conversation).data)

    @extend_schema(
        operation_id="conversations_destroy",
        responses={204: None, **error_responses(403, 404)},
    )
    def delete(self, request: Request, conversation_id: UUID) -> Response:
        """Delete the conversation: its sandbox is stopped and its workspace removed."""
        conversation_delete(user=request.user, conversation_id=conversation_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TurnOutput(serializers.ModelSerializer):
    """One turn of the history: a run's prompt and answer."""

    run_id = serializers.UUIDField(source="id")
    created = serializers.DateTimeField(source="created_at")
    started = serializers.DateTimeField(source="started_at", allow_null=True)
    finished = serializers.DateTimeField(source="finished_at", allow_null=True)
    in_memory = serializers.SerializerMethodField(
        help_text="False for turns before the last session reset (the agent forgot them)."
    )
    answer_html = serializers.SerializerMethodField(
        help_text="The answer rendered from Markdown and sanitized."
    )

    class Meta:
        model = Run
        fields = (
            "run_id",
            "prompt",
            "answer",
            "answer_html",
            "status",
            "errors",
            "created",
            "started",
            "finished",
            "in_memory",
        )
        read_only_fields = fields

    def get_answer_html(self, run: Run) -> str:
        return markdown_render(run.answer, conversation_id=run.conversation_id)

    def get_in_memory(self, run: Run) -> bool:
        memory_since = self.context.get("memory_since")
        return memory_since is None or run.created_at >= memory_since


class ConversationHistoryApi(APIView):
    @extend_schema(
        operation_id="conversations_history",
        responses={200: TurnOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """The conversation's turns (prompt, answer, status, run id, times), oldest first,
        paginated."""
        conversation = conversation_get(user=request.user, conversation_id=conversation_id)
        return paginated_response(
            request=request,
            view=self,
            queryset=conversation_history(user=request.user, conversation_id=conversation.id),
            serializer_class=TurnOutput,
            context={"memory_since": conversation.memory_since},
        )


class ConversationSessionApi(APIView):
    @extend_schema(
        operation_id="conversations_session_reset",
        responses={204: None, **error_responses(403, 404, 409)},
    )
    def delete(self, request: Request, conversation_id: UUID) -> Response:
        """Forget the agent's memory: the sandbox stops and the next one starts without the
        earlier turns. The transcript stays. 409 `run_active` while a run is active."""
        conversation_session_reset(user=request.user, conversation_id=conversation_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
