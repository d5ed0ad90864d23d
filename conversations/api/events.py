"""Events API: the conversation's stored run events, in cursor order, for polling."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.models import RunEvent
from conversations.selectors.events import EVENTS_LIMIT_DEFAULT, EVENTS_LIMIT_MAX, event_list
from paw_project.api import error_responses


class EventOutput(serializers.ModelSerializer):
    """One stored event: ``event`` is the line as sent to clients (secrets masked)."""

    event = serializers.JSONField(source="payload")
    created = serializers.DateTimeField(source="created_at")

    class Meta:
        model = RunEvent
        fields = ("cursor", "run_id", "type", "kind", "event", "created")
        read_only_fields = fields


class EventPageOutput(serializers.Serializer):
    events = EventOutput(many=True)
    next_after = serializers.IntegerField(
        help_text="Pass as `after` next time: the last cursor returned, or `after` if none."
    )
    has_more = serializers.BooleanField(help_text="More events are stored past this page.")


class EventListApi(APIView):
    class QuerySerializer(serializers.Serializer):
        after = serializers.IntegerField(
            min_value=0,
            max_value=2**63 - 1,
            required=False,
            default=0,
            help_text="Return events with a cursor above this one.",
        )
        limit = serializers.IntegerField(
            min_value=1,
            max_value=EVENTS_LIMIT_MAX,
            required=False,
            default=EVENTS_LIMIT_DEFAULT,
        )

    @extend_schema(
        operation_id="events_list",
        parameters=[QuerySerializer],
        responses={200: EventPageOutput, **error_responses(400, 404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """Events with `cursor > after`, in cursor order (at most `limit`, and about 1 MiB
        of them: a page of large events is cut short, with `has_more`). Poll with
        `after=next_after` and no event is ever missed."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after, limit = query.validated_data["after"], query.validated_data["limit"]
        events, cut = event_list(
            user=request.user, conversation_id=conversation_id, after=after, limit=limit + 1
        )
        page = events[:limit]
        return Response(
            EventPageOutput(
                {
                    "events": page,
                    "next_after": page[-1].cursor if page else after,
                    "has_more": cut or len(events) > limit,
                }
            ).data
        )
