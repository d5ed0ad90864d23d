"""Approvals API: the agent's pending questions and confirms, and deciding them."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.models import Approval
from conversations.selectors.runs import approval_list
from conversations.services.approvals import MAX_ANSWER_CHARS, MAX_ANSWERS, approval_decide
from paw_project.api import PawPagination, StrictSerializer, error_responses, paginated_response
from paw_project.errors import InvalidRequest


class ApprovalOutput(serializers.ModelSerializer):
    """An approval: what the agent asked (``prompt`` for a confirm, ``questions`` for a
    question; ``call``, the one tool call an approved confirm allows, or ``null``), its
    deadline, and, once closed, the decision and who made it (``used``: when a gated call
    used the approval)."""

    run_id = serializers.UUIDField(read_only=True)
    conversation_id = serializers.UUIDField(read_only=True)
    created = serializers.DateTimeField(source="created_at")
    expires = serializers.DateTimeField(source="expires_at")
    decided = serializers.DateTimeField(source="decided_at", allow_null=True)
    call = serializers.JSONField(allow_null=True)
    used = serializers.DateTimeField(source="used_at", allow_null=True)

    class Meta:
        model = Approval
        fields = (
            "id", "conversation_id", "run_id", "ask_id", "kind", "prompt", "call", "questions",
            "status", "answers",
            "decided_by", "via", "created", "expires", "decided", "used",
        )  # fmt: skip
        read_only_fields = fields


class ApprovalListApi(APIView):
    pagination_class = PawPagination

    class QuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=Approval.Status.choices, required=False)

    @extend_schema(
        operation_id="approvals_list",
        parameters=[QuerySerializer],
        responses={200: ApprovalOutput(many=True), **error_responses(400, 404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """The conversation's approvals, oldest first; `?status=pending` for open ones."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        approvals = approval_list(
            user=request.user,
            conversation_id=conversation_id,
            status=query.validated_data.get("status"),
        )
        return paginated_response(
            request=request, view=self, queryset=approvals, serializer_class=ApprovalOutput,
            pagination_class=PawPagination,
        )  # fmt: skip


class ApprovalDecisionApi(APIView):
    class InputSerializer(StrictSerializer):
        approved = serializers.BooleanField(required=False)
        answers = serializers.ListField(
            child=serializers.CharField(max_length=MAX_ANSWER_CHARS), required=False, min_length=1,
            max_length=MAX_ANSWERS,
        )  # fmt: skip

    @extend_schema(
        operation_id="approvals_decide",
        request=InputSerializer,
        responses={200: ApprovalOutput, **error_responses(400, 404, 409)},
    )
    def post(self, request: Request, approval_id: UUID) -> Response:
        """Decide: `{"approved": true|false}` for a confirm, `{"answers": [...]}` for a
        question. 409 `approval_closed` when it was already decided or has expired."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if len(data.validated_data) != 1:  # neither, or both (one would be ignored)
            raise InvalidRequest(
                'Send "approved" (true or false) or "answers", not both.',
                code="invalid_decision",
            )
        approval = approval_decide(
            approval_id=approval_id, user=request.user, via="api", **data.validated_data
        )
        return Response(ApprovalOutput(approval).data)
