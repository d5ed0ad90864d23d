"""Conversation API routes, under ``/api/``. Ids are UUIDs: anything else does
not match and answers the JSON 404."""

from __future__ import annotations

from django.urls import path

from conversations.api import (
    approvals,
    artifacts,
    conversations,
    events,
    exports,
    files,
    runs,
    shares,
)

urlpatterns = [
    path("conversations", conversations.ConversationListApi.as_view(), name="api-conversations"),
    path(
        "conversations/<uuid:conversation_id>",
        conversations.ConversationDetailApi.as_view(),
        name="api-conversation",
    ),
    path(
        "conversations/<uuid:conversation_id>/history",
        conversations.ConversationHistoryApi.as_view(),
        name="api-conversation-history",
    ),
    path(
        "conversations/<uuid:conversation_id>/session",
        conversations.ConversationSessionApi.as_view(),
        name="api-conversation-session",
    ),
    path(
        "conversations/<uuid:conversation_id>/files", files.FileListApi.as_view(), name="api-files"
    ),
    path(
        "conversations/<uuid:conversation_id>/files/<uuid:file_id>",
        files.FileDetailApi.as_view(),
        name="api-file",
    ),
    path(
        "conversations/<uuid:conversation_id>/files/<uuid:file_id>/content",
        files.FileContentApi.as_view(),
        name="api-file-content",
    ),
    path(
        "conversations/<uuid:conversation_id>/artifacts",
        artifacts.ArtifactListApi.as_view(),
        name="api-artifacts",
    ),
    path(
        "conversations/<uuid:conversation_id>/artifacts/<path:path>",
        artifacts.ArtifactDownloadApi.as_view(),
        name="api-artifact",
    ),
    path(
        "conversations/<uuid:conversation_id>/events",
        events.EventListApi.as_view(),
        name="api-events",
    ),
    path(
        "conversations/<uuid:conversation_id>/export",
        exports.ConversationExportApi.as_view(),
        name="api-conversation-export",
    ),
    path("conversations/<uuid:conversation_id>/runs", runs.RunListApi.as_view(), name="api-runs"),
    path(
        "conversations/<uuid:conversation_id>/runs/<uuid:run_id>",
        runs.RunDetailApi.as_view(),
        name="api-run",
    ),
    path(
        "conversations/<uuid:conversation_id>/runs/<uuid:run_id>/cancel",
        runs.RunCancelApi.as_view(),
        name="api-run-cancel",
    ),
    path(
        "conversations/<uuid:conversation_id>/approvals",
        approvals.ApprovalListApi.as_view(),
        name="api-approvals",
    ),
    path(
        "conversations/<uuid:conversation_id>/shares",
        shares.ConversationShareListApi.as_view(),
        name="api-conversation-shares",
    ),
    path(
        "conversations/<uuid:conversation_id>/shares/<uuid:share_id>",
        shares.ConversationShareDetailApi.as_view(),
        name="api-conversation-share",
    ),
    path(
        "conversations/<uuid:conversation_id>/shares/<uuid:share_id>/update",
        shares.ConversationShareUpdateApi.as_view(),
        name="api-conversation-share-update",
    ),
    path("shares", shares.ShareListApi.as_view(), name="api-shares"),
    path("shares/<uuid:share_id>", shares.ShareDetailApi.as_view(), name="api-share"),
    path("shares/<uuid:share_id>/runs", shares.ShareRunListApi.as_view(), name="api-share-runs"),
    path(
        "shares/<uuid:share_id>/events",
        shares.ShareEventListApi.as_view(),
        name="api-share-events",
    ),
    path(
        "shares/<uuid:share_id>/files/<path:path>",
        shares.ShareFileApi.as_view(),
        name="api-share-file",
    ),
    path("shares/<uuid:share_id>/fork", shares.ShareForkApi.as_view(), name="api-share-fork"),
    path("sql/ask", runs.SqlAskApi.as_view(), name="api-sql-ask"),
    path(
        "approvals/<uuid:approval_id>/decision",
        approvals.ApprovalDecisionApi.as_view(),
        name="api-approval-decision",
    ),
]
