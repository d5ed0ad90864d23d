"""Conversations API: list, create, read, update, delete; history; forgetting the session."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.api.runs import VersionFieldsMixin
from conversations.models import Approval, Conversation, Run
from conversations.rendering import markdown_render
from conversations.selectors.conversations import (
    conversation_active_run_id,
    conversation_get,
    conversation_history,
    conversation_list,
)
from conversations.selectors.sidebar import (
    MAX_SEARCH_CHARS,
    conversations_search,
    pending_approvals_of,
    search_match,
    with_pending_approvals,
)
from conversations.services.conversations import (
    MAX_APPROVAL_TIMEOUT_SECONDS,
    MIN_APPROVAL_TIMEOUT_SECONDS,
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
from paw_project.errors import InvalidRequest


class ConversationPagination(PawCursorPagination):
    """Newest activity first; ties by newest created, then id."""

    ordering = ("-last_activity_at", "-created_at", "-id")


def _iso(value: datetime | None) -> str | None:
    """A datetime as DRF's ``DateTimeField`` writes it (UTC, ``Z`` suffix)."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class _PendingApprovalOutput(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=Approval.Kind.choices)
    expires_at = serializers.DateTimeField()

    class Meta:
        ref_name = "PendingApproval"


class _MatchOutput(serializers.Serializer):
    field = serializers.ChoiceField(choices=["title", "prompt", "answer"])
    text = serializers.CharField()

    class Meta:
        ref_name = "SearchMatch"


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
    event_cursor = serializers.IntegerField(
        help_text="The cursor of the conversation's latest stored event: resume the "
        "websocket (or poll `events`) after it to get only what comes next."
    )
    pending_approvals = serializers.SerializerMethodField(
        help_text="Its approvals waiting for the person (the agent's confirms and "
        "questions), oldest first, each with its deadline: the sidebar's *waiting for you*."
    )
    match = serializers.SerializerMethodField(
        help_text="With `search`: where the conversation matched — the title, or a "
        "prompt's or an answer's words around the first term found (`text`); else null."
    )

    class Meta:
        model = Conversation
        fields = (
            "id",
            "title",
            "auto_approve",
            "llm_provider",
            "llm_model",
            "approval_timeout_seconds",
            "datasources",
            "created",
            "updated",
            "last_activity",
            "memory_since",
            "active_run_id",
            "event_cursor",
            "pending_approvals",
            "match",
        )
        read_only_fields = fields

    @extend_schema_field(serializers.UUIDField(allow_null=True))
    def get_active_run_id(self, conversation: Conversation) -> str | None:
        active = conversation_active_run_id(conversation)
        return str(active) if active else None

    @extend_schema_field(_PendingApprovalOutput(many=True))
    def get_pending_approvals(self, conversation: Conversation) -> list[dict]:
        return pending_approvals_of(conversation)

    @extend_schema_field(_MatchOutput(allow_null=True))
    def get_match(self, conversation: Conversation) -> dict | None:
        search = self.context.get("search")
        return search_match(conversation, search=search) if search else None

    def to_representation(self, conversation: Conversation) -> dict:
        return {
            "id": str(conversation.id),
            "title": conversation.title,
            "auto_approve": conversation.auto_approve,
            "llm_provider": conversation.llm_provider,
            "llm_model": conversation.llm_model,
            "approval_timeout_seconds": conversation.approval_timeout_seconds,
            "datasources": list(conversation.datasources or []),
            "created": _iso(conversation.created_at),
            "updated": _iso(conversation.updated_at),
            "last_activity": _iso(conversation.last_activity_at),
            "memory_since": _iso(conversation.memory_since),
            "active_run_id": self.get_active_run_id(conversation),
            "event_cursor": conversation.event_cursor,
            "pending_approvals": self.get_pending_approvals(conversation),
            "match": self.get_match(conversation),
        }


def _search_of(request: Request) -> str:
    """The list's ``search`` parameter, stripped (``""``: none). Raises
    :class:`InvalidRequest` (400) ``search_too_long`` past :data:`MAX_SEARCH_CHARS`
    characters and ``invalid_search`` for a NUL or another control character."""
    search = request.query_params.get("search", "").strip()
    if len(search) > MAX_SEARCH_CHARS:
        raise InvalidRequest(
            f"search is limited to {MAX_SEARCH_CHARS} characters.", code="search_too_long"
        )
    if any(ord(c) < 32 and c not in "\t\n\r" for c in search):
        raise InvalidRequest("search may not contain control characters.", code="invalid_search")
    return search


def _datasources_field(**kwargs) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=100),
        max_length=20,
        help_text="Slugs of datasources (GET /api/datasources) every run of the "
        "conversation is given unless the run names its own.",
        **kwargs,
    )


def _approval_timeout_field(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=MIN_APPROVAL_TIMEOUT_SECONDS,
        max_value=MAX_APPROVAL_TIMEOUT_SECONDS,
        allow_null=True,
        help_text="Seconds the agent's questions and confirms wait for an answer in this "
        "conversation; null: the server default (PAW_APPROVAL_TIMEOUT_SECONDS).",
        **kwargs,
    )


class _ConversationFields(StrictSerializer):
    title = serializers.CharField(max_length=200, allow_blank=True)
    auto_approve = serializers.BooleanField()
    llm_provider = serializers.CharField(max_length=64, allow_blank=True)
    llm_model = serializers.CharField(max_length=200, allow_blank=True)
    approval_timeout_seconds = _approval_timeout_field()
    datasources = _datasources_field()


class ConversationListApi(APIView):
    class InputSerializer(_ConversationFields):
        title = serializers.CharField(max_length=200, allow_blank=True, required=False)
        auto_approve = serializers.BooleanField(required=False)
        llm_provider = serializers.CharField(max_length=64, allow_blank=True, required=False)
        llm_model = serializers.CharField(max_length=200, allow_blank=True, required=False)
        approval_timeout_seconds = _approval_timeout_field(required=False)
        datasources = _datasources_field(required=False)

    pagination_class = ConversationPagination

    @extend_schema(
        operation_id="conversations_list",
        parameters=[
            OpenApiParameter(
                "search",
                {"type": "string", "maxLength": MAX_SEARCH_CHARS},
                description="Only the conversations whose title, or a prompt or answer of "
                'theirs, has these words (full-text: `tip -cancelled`, `"exact phrase"`, '
                f"`a or b`; at most {MAX_SEARCH_CHARS} characters, longer is 400 "
                "`search_too_long`). Each result's `match` says where it matched.",
            ),
        ],
        responses={200: ConversationOutput(many=True), **error_responses(400, 404)},
    )
    def get(self, request: Request) -> Response:
        """The user's conversations, newest activity first, cursor-paginated: follow
        `next` for older ones. `search` narrows them to those matching its words."""
        search = _search_of(request)
        queryset = with_pending_approvals(conversation_list(user=request.user))
        if search:
            queryset = conversations_search(queryset, search=search)
        return paginated_response(
            request=request,
            view=self,
            queryset=queryset,
            serializer_class=ConversationOutput,
            pagination_class=ConversationPagination,
            context={"search": search},
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
        """Change the title, `auto_approve`, the default provider and model, the
        approval timeout, or the datasources its runs are given."""
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


class TurnOutput(VersionFieldsMixin, serializers.ModelSerializer):
    """One turn of the history: a run's prompt and answer. The versions of an edited or
    regenerated turn are listed each in its place, linked by ``versions``; only the newest
    (``replaced_by`` null) is in the agent's memory."""

    run_id = serializers.UUIDField(source="id")
    created = serializers.DateTimeField(source="created_at")
    started = serializers.DateTimeField(source="started_at", allow_null=True)
    finished = serializers.DateTimeField(source="finished_at", allow_null=True)
    in_memory = serializers.SerializerMethodField(
        help_text="False for turns before the last session reset (the agent forgot them) "
        "and for versions replaced by a newer one."
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
            "replaces",
            "replaced_by",
            "version",
            "versions",
        )
        read_only_fields = fields

    def get_answer_html(self, run: Run) -> str:
        return markdown_render(run.answer, conversation_id=run.conversation_id)

    def get_in_memory(self, run: Run) -> bool:
        memory_since = self.context.get("memory_since")
        if self._versions(run).replaced_by is not None:
            return False
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
