"""PAW's ASGI handler (``paw_project.asgi_handler``): Django's request cycle for sync views
in one hop to the request thread, with Django's signals, disconnect handling and
streaming kept."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
from django.core.signals import request_finished, request_started
from django.http import HttpResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path

from paw_project.asgi import application

events: list[tuple[str, int]] = []
entered = threading.Event()  # the slow view or the stream has started
released = threading.Event()  # the test lets it go on


def plain_view(request):
    events.append(("view", threading.get_ident()))
    return HttpResponse("plain")


def slow_view(request):
    entered.set()
    released.wait(30)  # a bound for a broken test, not a timing
    events.append(("view", threading.get_ident()))
    return HttpResponse("late")


def streaming_view(request):
    # An asynchronous iterator: Django's ASGI handler reads a synchronous one whole before
    # sending anything.
    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            entered.set()  # asked for more: the first chunk was sent
            await asyncio.to_thread(released.wait, 30)
            yield b"second"
        finally:
            events.append(("stream closed", threading.get_ident()))

    return StreamingHttpResponse(chunks())


urlpatterns = [path("plain", plain_view), path("slow", slow_view), path("stream", streaming_view)]


@pytest.fixture(autouse=True)
def recorded() -> Iterator[list[tuple[str, int]]]:
    """``events``, with ``request_started`` and ``request_finished`` recorded in it."""

    def started(**kwargs) -> None:
        events.append(("request_started", threading.get_ident()))

    def finished(**kwargs) -> None:
        events.append(("request_finished", threading.get_ident()))

    events.clear()
    entered.clear()
    released.clear()
    request_started.connect(started)
    request_finished.connect(finished)
    try:
        with override_settings(ROOT_URLCONF=__name__):
            yield events
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
        released.set()


def scope(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }


class Client:
    """One ASGI HTTP exchange: the request (no body), then ``http.disconnect`` once
    :meth:`leave` is called. What the application sends is recorded in ``events`` too."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.requested = False
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if not self.requested:
            self.requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        events.append((message["type"], threading.get_ident()))
        self.sent.append(message)

    def leave(self) -> None:
        self.gone.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def test_request_started_the_view_and_request_finished_run_on_one_thread_before_sending(
    recorded,
):
    client = Client()
    await application(scope("/plain"), client.receive, client.send)
    assert client.sent[0]["status"] == 200 and client.body() == b"plain"
    names = [name for name, _ in recorded]
    assert names[:3] == ["request_started", "view", "request_finished"]
    assert names[3:] == ["http.response.start", "http.response.body"]
    threads = {thread for _, thread in recorded[:3]}
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_a_response_is_not_sent_to_a_client_that_went_away_while_the_view_ran(recorded):
    client = Client()
    answer = asyncio.create_task(application(scope("/slow"), client.receive, client.send))
    await asyncio.to_thread(entered.wait, 30)
    client.leave()
    await asyncio.sleep(0)  # the handler hears the disconnect while the view still runs
    released.set()
    await answer
    assert client.sent == []
    assert [name for name, _ in recorded] == ["request_started", "view", "request_finished"]


async def test_a_streaming_response_is_sent_whole_then_closed(recorded):
    released.set()
    client = Client()
    await application(scope("/stream"), client.receive, client.send)
    assert client.body() == b"firstsecond"
    assert client.sent[-1] == {"type": "http.response.body"}  # the end of the body
    names = [name for name, _ in recorded]
    assert names[0] == "request_started" and "stream closed" in names
    assert names[-1] == "request_finished" and names.count("request_finished") == 1


async def test_a_stream_stops_when_the_client_goes_away_and_is_closed(recorded):
    client = Client()
    answer = asyncio.create_task(application(scope("/stream"), client.receive, client.send))
    await asyncio.to_thread(entered.wait, 30)
    client.leave()
    await asyncio.sleep(0)
    released.set()
    await answer
    assert client.body() == b"first"
    names = [name for name, _ in recorded]
    assert "stream closed" in names
    assert names.count("request_finished") == 1
