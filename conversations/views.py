"""Page views of the web chat (edges: parse, check permission, call a selector, render).

The chat page is one template; its ES modules (``static/paw/chat/``) talk to the REST API
with the session cookie and CSRF token, and follow the conversation on its websocket.
"""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from conversations.selectors.conversations import conversation_get
from paw_project.errors import NotFound
from paw_project.security import content_security_policy
from secrets_vault.providers import DEMO_PROVIDER_NAME


def chat_config(request: HttpRequest, conversation_id: UUID | None) -> dict:
    """What the chat page's script needs to start (rendered with ``json_script``)."""
    return {
        "conversationId": str(conversation_id) if conversation_id else None,
        "username": request.user.get_username(),
        "maxUploadBytes": settings.PAW_MAX_UPLOAD_BYTES,
        "approvalTimeoutSeconds": settings.PAW_APPROVAL_TIMEOUT_SECONDS,
        "demoProvider": DEMO_PROVIDER_NAME if settings.PAW_DEMO_BASE_URL else None,
    }


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
        {"conversation": conversation, "config": chat_config(request, conversation_id)},
    )
