"""Shares API: share a conversation read-only (a snapshot), list, update and stop its
shares; view a share, its runs, events and files; fork it into one's own conversation."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.api.conversations import ConversationOutput
from conversations.api.downloads import DownloadQuery, download_response
from conversations.api.events import EventListApi, EventPageOutput
from conversations.api.runs import RunOutput
from conversations.models import Approval, Run, Share
from conversations.rendering import markdown_render
from conversations.selectors.artifacts import content_type_for
from conversations.selectors.runs import run_versions
from conversations.selectors.shares import (
    conversation_share_get,
    conversation_share_list,
    share_approvals,
    share_event_page,
    share_file_get,
    share_for_viewer,
    share_list,
    share_runs,
    share_status,
    share_team_ids,
)
from conversations.services.shares import (
    KEEP,
    SHARE_MAX_DAYS,
    share_create,
    share_delete,
    share_fork,
    share_update,
)
from paw_project.api import PawPagination, StrictSerializer, error_responses, paginated_response
from paw_project.throttles import ShareForksThrottle, SharesThrottle


def share_url(request: Request, share: Share) -> str:
    """The address of a share's page (``/s/<id>/``), absolute."""
    return request.build_absolute_uri(f"/s/{share.id}/")


def files_base(share: Share) -> str:
    """Where a share's files are downloaded: ``/api/shares/<id>/files/``."""
    return f"/api/shares/{share.id}/files/"


class _SharedConversationOutput(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField(help_text="Its title now (the share's own: `title`).")

    class Meta:
        ref_name = "SharedConversation"


class _LeftOutOutput(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField(help_text="bytes")
    reason = serializers.CharField(help_text="Why the snapshot does not hold it.")

    class Meta:
        ref_name = "ShareFileLeftOut"


class _ShareFields(serializers.ModelSerializer):
    """What the owner and the viewers of a share both see."""

    url = serializers.SerializerMethodField(help_text="The share's page: the link to send.")
    teams = serializers.SerializerMethodField(
        help_text="The ids of the teams whose members may see it (audience `teams`: those "
        "its owner is still a member of; [] for `signed_in`)."
    )
    created = serializers.DateTimeField(source="created_at")
    updated = serializers.DateTimeField(
        source="snapshot_at", help_text="When its snapshot was taken (made or last updated)."
    )
    expires = serializers.DateTimeField(
        source="expires_at", allow_null=True, help_text="When it stops working; null: never."
    )
    files_left_out = _LeftOutOutput(
        many=True, help_text="Workspace files the snapshot does not hold (over its limits)."
    )

    def get_url(self, share: Share) -> str:
        return share_url(self.context["request"], share)

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_teams(self, share: Share) -> list[int]:
        return share_team_ids(share)


class ShareOutput(_ShareFields):
    """A share as its owner sees it (``POST``/``GET .../shares``, ``GET /api/shares``)."""

    conversation = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField(
        help_text="`active`; `expired` (past `expires`); `not_allowed` (PAW_SHARING no "
        "longer allows its audience, you were deactivated, or none of its teams is one of "
        "yours any more). Only an active share can be seen."
    )

    class Meta:
        model = Share
        fields = (
            "id", "url", "conversation", "audience", "teams", "title", "status", "created",
            "updated", "expires", "files_left_out",
        )  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(_SharedConversationOutput)
    def get_conversation(self, share: Share) -> dict:
        return {"id": str(share.conversation_id), "title": share.conversation.title}

    @extend_schema_field(serializers.ChoiceField(choices=["active", "expired", "not_allowed"]))
    def get_status(self, share: Share) -> str:
        return share_status(share)


class _ShareFileOutput(serializers.Serializer):
    path = serializers.CharField(help_text="Its workspace path: download it under `files/`.")
    size = serializers.IntegerField(help_text="bytes")
    content_type = serializers.CharField(help_text="Guessed from the extension.")
    upload = serializers.BooleanField(help_text="An upload (else a file the agent made).")

    class Meta:
        ref_name = "ShareFile"


class _ShareApprovalOutput(serializers.Serializer):
    run_id = serializers.UUIDField()
    ask_id = serializers.CharField()
    kind = serializers.ChoiceField(choices=Approval.Kind.choices)
    status = serializers.CharField()
    decided_by = serializers.CharField()
    answers = serializers.ListField(child=serializers.CharField())

    class Meta:
        ref_name = "ShareApproval"


class SharedOutput(_ShareFields):
    """A share as its audience sees it (``GET /api/shares/{id}``): the snapshot's title,
    who shared it, its files and how its questions and confirms were decided; its runs
    and events are read page by page (``.../runs``, ``.../events``)."""

    shared_by = serializers.CharField(source="conversation.user.username")
    is_owner = serializers.SerializerMethodField(help_text="The caller shared it.")
    files = serializers.SerializerMethodField()
    approvals = serializers.SerializerMethodField(
        help_text="How each question and confirm of its runs was decided (at most 1,000)."
    )
    files_url = serializers.SerializerMethodField(
        help_text="Prefix of its files' downloads: append a file's `path`."
    )

    class Meta:
        model = Share
        fields = (
            "id", "url", "title", "shared_by", "is_owner", "audience", "teams", "created",
            "updated", "expires", "files", "files_left_out", "files_url", "approvals",
        )  # fmt: skip
        read_only_fields = fields

    def get_is_owner(self, share: Share) -> bool:
        return share.conversation.user_id == self.context["request"].user.pk

    @extend_schema_field(_ShareFileOutput(many=True))
    def get_files(self, share: Share) -> list[dict]:
        return [
            {
                "path": entry["path"],
                "size": entry["size"],
                "content_type": content_type_for(entry["path"]),
                "upload": bool(entry.get("upload")),
            }
            for entry in share.files
        ]

    @extend_schema_field(_ShareApprovalOutput(many=True))
    def get_approvals(self, share: Share) -> list[dict]:
        return [
            {
                "run_id": str(approval.run_id),
                "ask_id": approval.ask_id,
                "kind": approval.kind,
                "status": approval.status,
                "decided_by": approval.decided_by,
                "answers": approval.answers,
            }
            for approval in share_approvals(share)
        ]

    def get_files_url(self, share: Share) -> str:
        return files_base(share)


#: What a run's JSON holds that a share's does not: the owner's model settings and the
#: tokens they spent (docs/chat.md: "never your keys, secrets or model settings").
SHARED_RUN_LEFT_OUT = ("provider", "model", "usage")


class SharedRunOutput(RunOutput):
    """A run of a share's snapshot: as ``GET .../runs`` gives it but without the owner's
    model settings and token usage (:data:`SHARED_RUN_LEFT_OUT`), its answer's images and
    links pointing at the share's files, its versions those of the snapshot."""

    usage = None

    class Meta(RunOutput.Meta):
        fields = tuple(f for f in RunOutput.Meta.fields if f not in SHARED_RUN_LEFT_OUT)
        read_only_fields = fields
        ref_name = "SharedRun"

    def get_answer_html(self, run: Run) -> str:
        return markdown_render(run.answer, files_base=files_base(self.context["share"]))


class _ShareListOutput(serializers.Serializer):
    shares = ShareOutput(many=True)

    class Meta:
        ref_name = "ConversationShares"


def _expires_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1,
        max_value=SHARE_MAX_DAYS,
        required=False,
        allow_null=True,
        help_text=f"Days until the link stops working (1 to {SHARE_MAX_DAYS}); null: never.",
    )


class ConversationShareListApi(APIView):
    throttle_classes = (SharesThrottle,)

    class InputSerializer(StrictSerializer):
        audience = serializers.ChoiceField(
            choices=Share.Audience.choices,
            help_text="`teams`: the members of `teams`; `signed_in`: every signed-in person.",
        )
        teams = serializers.ListField(
            child=serializers.IntegerField(),
            required=False,
            max_length=100,
            help_text="With `teams`: ids of teams you are a member of (GET /api/auth/me).",
        )
        expires_in_days = _expires_field()

    @extend_schema(
        operation_id="conversation_shares_list",
        responses={200: _ShareListOutput, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """The conversation's shares, newest first: `{"shares": [...]}` (at most 20)."""
        shares = conversation_share_list(user=request.user, conversation_id=conversation_id)
        return Response(
            {"shares": ShareOutput(shares, many=True, context={"request": request}).data}
        )

    @extend_schema(
        operation_id="conversation_shares_create",
        request=InputSerializer,
        responses={201: ShareOutput, **error_responses(400, 403, 404, 429)},
    )
    def post(self, request: Request, conversation_id: UUID) -> Response:
        """Share the conversation read-only, as it is now (a snapshot: later messages are
        not shown until the share is updated). 400 `unknown_team` for a team you are not
        a member of, `audience_not_allowed` when PAW_SHARING does not allow the audience;
        403 `sharing_off` under PAW_SHARING=off."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        share = share_create(
            user=request.user, conversation_id=conversation_id, **data.validated_data
        )
        return Response(
            ShareOutput(share, context={"request": request}).data, status=status.HTTP_201_CREATED
        )


class ConversationShareDetailApi(APIView):
    @extend_schema(
        operation_id="conversation_shares_retrieve",
        responses={200: ShareOutput, **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID, share_id: UUID) -> Response:
        """One share of the conversation."""
        share = conversation_share_get(
            user=request.user, conversation_id=conversation_id, share_id=share_id
        )
        return Response(ShareOutput(share, context={"request": request}).data)

    @extend_schema(
        operation_id="conversation_shares_destroy",
        responses={204: None, **error_responses(404)},
    )
    def delete(self, request: Request, conversation_id: UUID, share_id: UUID) -> Response:
        """Stop sharing: the link answers 404 from now on."""
        share_delete(user=request.user, conversation_id=conversation_id, share_id=share_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ConversationShareUpdateApi(APIView):
    throttle_classes = (SharesThrottle,)

    class InputSerializer(StrictSerializer):
        expires_in_days = _expires_field()

    @extend_schema(
        operation_id="conversation_shares_update",
        request=InputSerializer,
        responses={200: ShareOutput, **error_responses(400, 403, 404, 429)},
    )
    def post(self, request: Request, conversation_id: UUID, share_id: UUID) -> Response:
        """A new snapshot under the same link: the share shows the conversation as it is
        now. `expires_in_days` sets its expiry anew from now (null: never); left out, it
        stays."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        share = share_update(
            user=request.user,
            conversation_id=conversation_id,
            share_id=share_id,
            expires_in_days=data.validated_data.get("expires_in_days", KEEP),
        )
        return Response(ShareOutput(share, context={"request": request}).data)


class ShareListApi(APIView):
    pagination_class = PawPagination

    @extend_schema(
        operation_id="shares_list", responses={200: ShareOutput(many=True), **error_responses()}
    )
    def get(self, request: Request) -> Response:
        """*Shared by me*: your shares across your conversations, newest first
        (paginated); update or stop each through its conversation's `shares`."""
        return paginated_response(
            request=request,
            view=self,
            queryset=share_list(user=request.user),
            serializer_class=ShareOutput,
            pagination_class=PawPagination,
            context={"request": request},
        )


class ShareDetailApi(APIView):
    @extend_schema(
        operation_id="shares_retrieve", responses={200: SharedOutput, **error_responses(404)}
    )
    def get(self, request: Request, share_id: UUID) -> Response:
        """A share you may see (you are in its audience, or shared it): its snapshot's
        title, who shared it, its files and approvals. 404 for anyone else, and once it
        was stopped, expired or PAW_SHARING no longer allows it."""
        share = share_for_viewer(user=request.user, share_id=share_id)
        return Response(SharedOutput(share, context={"request": request}).data)


class ShareRunListApi(APIView):
    pagination_class = PawPagination

    @extend_schema(
        operation_id="shares_runs_list",
        responses={200: SharedRunOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request, share_id: UUID) -> Response:
        """The snapshot's runs, oldest first (paginated), as `GET .../runs` gives them."""
        share = share_for_viewer(user=request.user, share_id=share_id)
        runs = share_runs(share)
        versions = run_versions(conversation_id=share.conversation_id, runs=runs)
        return paginated_response(
            request=request,
            view=self,
            queryset=runs,
            serializer_class=SharedRunOutput,
            pagination_class=PawPagination,
            context={"share": share, "versions": versions},
        )


class ShareEventListApi(APIView):
    @extend_schema(
        operation_id="shares_events_list",
        parameters=[EventListApi.QuerySerializer],
        responses={200: EventPageOutput, **error_responses(400, 404)},
    )
    def get(self, request: Request, share_id: UUID) -> Response:
        """The snapshot's events with `cursor > after`, in cursor order, paged as `GET
        .../events` (at most `limit`, about 1 MiB)."""
        share = share_for_viewer(user=request.user, share_id=share_id)
        query = EventListApi.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after, limit = query.validated_data["after"], query.validated_data["limit"]
        events, more = share_event_page(share, after=after, limit=limit)
        return Response(
            EventPageOutput(
                {
                    "events": events,
                    "next_after": events[-1].cursor if events else after,
                    "has_more": more,
                }
            ).data
        )


class ShareFileApi(APIView):
    QuerySerializer = DownloadQuery

    @extend_schema(
        operation_id="shares_files_download",
        parameters=[
            QuerySerializer,
            OpenApiParameter(
                "path", OpenApiTypes.STR, OpenApiParameter.PATH, description="Relative path."
            ),
        ],
        responses={
            200: OpenApiResponse(OpenApiTypes.BINARY, description="The snapshot's copy."),
            **error_responses(400, 404),
        },
    )
    def get(self, request: Request, share_id: UUID, path: str):
        """Download a file of the snapshot (as it was when the share was made or last
        updated), with the headers of every download."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        opened = share_file_get(user=request.user, share_id=share_id, path=path)
        return download_response(request._request, opened, inline=query.validated_data["inline"])


class ShareForkApi(APIView):
    throttle_classes = (SharesThrottle, ShareForksThrottle)

    @extend_schema(
        operation_id="shares_fork",
        request=None,
        responses={201: ConversationOutput, **error_responses(404, 429)},
    )
    def post(self, request: Request, share_id: UUID) -> Response:
        """Start your own conversation from the share: its transcript (and the agent's
        memory of it), its files copied, and of its datasources only those you may use.
        429 past PAW_THROTTLE_UPLOADS, or past PAW_THROTTLE_FORKS (default 20 a day)."""
        conversation = share_fork(user=request.user, share_id=share_id)
        return Response(ConversationOutput(conversation).data, status=status.HTTP_201_CREATED)
