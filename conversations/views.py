"""Page views of the web chat (edges: parse, check permission, call a selector, render).

The chat page is one template; its ES modules (``static/paw/chat/``) talk to the REST API
with the session cookie and CSRF token, and follow the conversation on its websocket.
"""

from __future__ import annotations

import shutil
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from conversations.selectors.conversations import conversation_get
from conversations.selectors.shares import share_for_viewer, sharing_allows
from paw_project.errors import NotFound
from paw_project.security import content_security_policy
from paw_project.vendor import plotly_css_url, plotly_js_url, plotly_style_ids
from secrets_vault.providers import DEMO_PROVIDER_NAME
from teams.selectors import user_teams


def chat_config(request: HttpRequest, conversation_id: UUID | None) -> dict:
    """What the chat page's script needs to start (rendered with ``json_script``)."""
    return {
        "conversationId": str(conversation_id) if conversation_id else None,
        "username": request.user.get_username(),
        "maxUploadBytes": settings.PAW_MAX_UPLOAD_BYTES,
        "approvalTimeoutSeconds": settings.PAW_APPROVAL_TIMEOUT_SECONDS,
        "demoProvider": DEMO_PROVIDER_NAME if settings.PAW_DEMO_BASE_URL else None,
        "plotlyUrl": plotly_js_url(),
        # Staff may save a run_sql of the transcript as a datasource example (admin API).
        "isStaff": bool(request.user.is_staff),
        # The header's Share dialog: the audiences PAW_SHARING allows, the person's teams.
        "sharing": sharing_config(request),
    }


def sharing_config(request: HttpRequest) -> dict:
    """What the Share dialog offers: ``{"audiences": [...], "teams": [{"id", "name"}]}``
    (no audience under ``PAW_SHARING=off``)."""
    return {
        "audiences": [a for a in ("teams", "signed_in") if sharing_allows(a)],
        "teams": [{"id": team.id, "name": team.name} for team in user_teams(request.user)],
    }


def isolation_warning(request: HttpRequest) -> str:
    """For staff only, the embedded mode's fallback to sandboxes without a jail
    (bubblewrap missing and ``PAW_SANDBOX_ISOLATION`` not set to ``none`` on purpose; with
    Redis that is a start-up error of the worker instead). ``""`` otherwise."""
    if not request.user.is_staff or not settings.EMBEDDED or settings.PAW_SANDBOX_ISOLATION:
        return ""
    if shutil.which("bwrap") is not None:
        return ""
    return (
        "Sandboxes run without isolation: bubblewrap is not installed "
        "(apt-get install bubblewrap), so the agent's code can read this machine's files. "
        "Set PAW_SANDBOX_ISOLATION=none to choose this and hide this notice."
    )


@content_security_policy
@login_required
@ensure_csrf_cookie
def chat(request: HttpRequest, conversation_id: UUID | None = None) -> HttpResponse:
    """``/`` (no conversation open yet: the first message or upload starts one) and
    ``/c/<id>/`` (that conversation; 404 when it is not the user's)."""
    conversation = None
    if conversation_id is not None:
        try:
            conversation = conversation_get(user=request.user, conversation_id=conversation_id)
        except NotFound as error:
            raise Http404("No such conversation.") from error
    return render(
        request,
        "conversations/chat.html",
        {
            "conversation": conversation,
            "config": chat_config(request, conversation_id),
            "isolation_warning": isolation_warning(request),
            # plotly.js's rules as a file: plotly.js then adds no inline <style> (CSP).
            "plotly_css_url": plotly_css_url(),
            "plotly_style_ids": plotly_style_ids(),
        },
    )


@content_security_policy
@login_required
@ensure_csrf_cookie
def shared(request: HttpRequest, share_id: UUID) -> HttpResponse:
    """``/s/<id>/``: a shared conversation, read-only (its snapshot's transcript, charts
    and files; *Fork* starts one's own conversation from it). 404 for anyone not in its
    audience, as for a share that does not exist (``share_for_viewer``)."""
    try:
        share = share_for_viewer(user=request.user, share_id=share_id)
    except NotFound as error:
        raise Http404("No such share.") from error
    return render(
        request,
        "conversations/shared.html",
        {
            "share": share,
            "config": {
                "shareId": str(share.id),
                "plotlyUrl": plotly_js_url(),
                "demoProvider": DEMO_PROVIDER_NAME if settings.PAW_DEMO_BASE_URL else None,
            },
            "plotly_css_url": plotly_css_url(),
            "plotly_style_ids": plotly_style_ids(),
        },
    )


@content_security_policy
@login_required
@ensure_csrf_cookie
def shared_by_me(request: HttpRequest) -> HttpResponse:
    """``/shares/``: *Shared by me*, the person's shares across their conversations, to
    update or stop each (the list is read from ``GET /api/shares``)."""
    return render(
        request, "conversations/shared_by_me.html", {"config": {"sharing": sharing_config(request)}}
    )
