"""HTTP middleware: the request id every response carries and every log line names."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from paw_project.logging import request_id_var

REQUEST_ID_HEADER = "X-Request-ID"
# A client's id is echoed only when it is short and plain, so it is safe in logs/headers.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_for(incoming: str | None) -> str:
    """The request id to use: ``incoming`` when sane (1-128 of ``[A-Za-z0-9._:-]``), else a new
    32-hex-digit id."""
    if incoming and _SANE_REQUEST_ID.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Sets ``request.request_id`` and the logging context, and adds ``X-Request-ID`` to the
    response. Works in sync and async stacks.

    The id stays set after the response leaves the middleware, so Django's own line for it
    (``django.request``, written by the handler outside every middleware) carries it too;
    ``paw_project.logging.reset_request_id`` clears it when the request is finished."""

    sync_capable = True
    async_capable = True

    def __init__(
        self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]
    ):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _begin(self, request: HttpRequest) -> None:
        request.request_id = request_id_for(request.headers.get(REQUEST_ID_HEADER))
        request_id_var.set(request.request_id)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        self._begin(request)
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request.request_id
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        self._begin(request)
        response = await self.get_response(request)
        response[REQUEST_ID_HEADER] = request.request_id
        return response
