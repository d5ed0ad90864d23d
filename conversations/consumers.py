"""The websocket of a conversation: ``ws/conversations/<id>/``.

Server → client: ``run.event`` ``{cursor, run_id, event}`` for every stored event (with
``?frames=batch`` on the URL: ``run.events`` ``{events: [{cursor, run_id, event}, ...]}``,
the events of one stored batch or one replay page in one frame, in cursor order),
``run.status``, ``agent_confirm_request``, ``agent_confirm_resolved``, ``error``
``{code, detail}``, ``pong``. Client → server: ``resume`` ``{after}``,
``agent_confirm_response`` ``{approval_id, approved | answers}``, ``run.cancel``
``{run_id}``, ``ping``.

Exactly once, in order: events are delivered strictly by increasing cursor. The consumer
follows the conversation's events (Redis mode: its live log, through the process's
:class:`~paw_project.live_log.LiveHub`; embedded mode: its channel-layer group) before it
reads anything, then waits for the client's ``resume {after}`` (or ``?after=N`` on the
URL; without either, after ``RESUME_GRACE`` seconds it starts from the cursor current at
connect). From then on it remembers the last cursor the client has, reads back what comes
after it (``selectors.events``: the live log, then the database), skips live events at or
below it, and fills any gap by reading back (an event below a live one is always readable
already: the live log holds it before it is published; in the embedded mode it is stored
before). A later ``resume`` reads back from the cursor it names. Live events reach the
socket from a task of the connection's own (:meth:`ConversationConsumer.live_batch`
queues them), under one lock with every read-back, so the two never interleave.

A live connection that has been quiet for ``QUIET_CHECK_SECONDS`` since its last message
compares its cursor with the conversation's once, and reads back what it lacks: a
message lost on the way (the hub's connection broke, the channel layer dropped it for a
channel over its capacity) is caught up at the latest then, even when it was the last
one of a run.

Close codes: 4401 not signed in (or signed out, or its token revoked), 4404 no such
conversation — also another user's one, as the REST API answers 404 for it (ids cannot be
probed) — or the conversation was deleted, 4429 a token refused because of too many failed
bearer authentications from the client's address (``accounts.websocket``; after an
``error`` ``throttled`` with ``retry_after``, seconds).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import time
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from conversations.models import Conversation
from conversations.selectors.conversations import conversation_get
from conversations.selectors.events import (
    EventText,
    conversation_cursor_async,
    cursor_ceiling_async,
    event_texts_after_async,
)
from conversations.selectors.messages import pending_messages
from conversations.services import approvals as approval_services
from conversations.services import runs as run_services
from paw_project import live_log, metrics
from paw_project.broadcast import (
    conversation_group,
    revocation_group,
    session_group,
    user_group,
)
from paw_project.errors import DomainError, NotFound

logger = logging.getLogger(__name__)

#: Largest client message accepted (bytes of text).
MAX_MESSAGE_BYTES = 64 * 1024
#: Client messages allowed per connection: a burst of RATE_BURST, refilled at RATE_PER_SECOND.
RATE_BURST = 30
RATE_PER_SECOND = 10.0
#: Events read from the database per query when replaying.
REPLAY_PAGE = 500
#: Seconds between two ``resume`` messages of one connection (each may replay a whole
#: conversation from the database).
RESUME_INTERVAL = 1.0
#: Seconds a new connection waits for the client's ``resume`` before going live.
RESUME_GRACE = 1.0
#: Seconds of quiet after which a live connection checks once that it has every stored
#: event: the channel layer drops messages for a channel that is far behind (its capacity),
#: and a dropped last message leaves no later cursor to reveal the gap.
QUIET_CHECK_SECONDS = 2.0
#: Live appends a connection holds while its client reads slowly; past that it drops them
#: and reads the log back instead (memory stays bounded whoever is slow).
LIVE_QUEUE_MAX = 1000
LIVE_QUEUE_MAX_BYTES = 8 << 20


@database_sync_to_async
def _conversation_access(user: Any, conversation_id: str) -> tuple[int, Conversation | None]:
    """``(close code or 0, conversation)`` for a user opening a conversation's socket: the
    REST API's own lookup, so another user's conversation is "no such conversation" here
    too (4404: ids cannot be probed)."""
    if user is None or not user.is_authenticated:
        return 4401, None
    try:
        return 0, conversation_get(user=user, conversation_id=conversation_id)
    except NotFound:
        return 4404, None


_pending_messages = database_sync_to_async(pending_messages)


class PawConsumer(AsyncJsonWebsocketConsumer):
    """A JSON websocket consumer whose messages skip Channels' per-message sweep of old
    database connections. ``AsyncConsumer.dispatch`` (Channels 4.2+) awaits
    ``aclose_old_connections()`` before every handler: a hop to a worker thread and back
    for each websocket frame and each group message, a third of the web process's CPU with
    a hundred streams at once (py-spy, ``bench/events.py``). Every database call of PAW's
    consumers goes through ``database_sync_to_async``, which closes old connections
    itself, in the thread that uses them, before and after the call."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Run the connection, and release what it holds however it ends: Channels calls
        ``disconnect`` only on a disconnect message, not when the channel layer fails
        (Redis restarted) and the connection ends with an error."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()

    async def release(self) -> None:
        """Let go of what the connection holds (subscriptions, tasks); idempotent."""

    async def refuse_throttled_token(self) -> bool:
        """Call after ``accept``: when the connection's token was refused for too many
        failed bearer authentications from its address (``accounts.websocket``), send
        ``error`` ``throttled`` with ``retry_after`` (seconds), close with 4429 and return
        True; else return False."""
        wait = self.scope.get("paw_auth_retry_after")
        if wait is None:
            return False
        await self.send_json(
            {
                "type": "error",
                "code": "throttled",
                "detail": "Too many failed token authentications from this address.",
                "retry_after": wait,
            }
        )
        await self.close(code=4429)
        return True


class ConversationConsumer(PawConsumer):
    """A thin edge: authenticate, follow the conversation, call services for client
    actions. Implements :class:`paw_project.live_log.Subscriber`."""

    async def connect(self) -> None:
        self.conversation_id_text = self.scope["url_route"]["kwargs"]["conversation_id"]
        self.group: str | None = None
        self._hub: live_log.LiveHub | None = None
        self._pump: asyncio.Task | None = None
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.batch_frames = query.get("frames") == ["batch"]
        user = self.scope.get("user")
        code, conversation = await _conversation_access(user, self.conversation_id_text)
        subprotocol = self.scope.get("paw_subprotocol")
        await self.accept(subprotocol=subprotocol)
        if await self.refuse_throttled_token():
            return
        if code:
            await self.close(code=code)
            return
        self.user = user
        self.conversation_id: UUID = conversation.id
        self.group = conversation_group(conversation.id)
        # A logout or a password change (tokens revoked), or the browser session signing
        # out, closes the socket: session.revoked.
        self.revocation_groups = [revocation_group(user.pk)]
        session = self.scope.get("session")
        if self.scope.get("paw_auth") != "jwt" and session is not None and session.session_key:
            self.revocation_groups.append(session_group(session.session_key))
        for group in self.revocation_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self._tokens = float(RATE_BURST)
        self._refilled = time.monotonic()
        self.live = False  # events flow once the client said where it is (resume)
        self.cursor = 0
        self._sending = asyncio.Lock()  # live sends and read-backs, one at a time
        #: Live appends waiting for the pump: (first cursor, sent ms, texts, their size).
        self._live: collections.deque[tuple[int, int, list[str], int]] = collections.deque()
        self._live_bytes = 0
        self._behind = False  # live appends were dropped: read back before going on
        self._wake = asyncio.Event()
        # Follow first, then read: nothing appended from here on can be missed.
        await self.channel_layer.group_add(self.group, self.channel_name)
        if live_log.enabled():
            self._hub = live_log.hub()
            await self._hub.follow(conversation.id, self)
            self._pump = asyncio.create_task(self._pump_live())
        self.cursor = await conversation_cursor_async(conversation_id=conversation.id)
        self._last_message = time.monotonic()
        self._checked = False  # the quiet check ran since the last message
        self._watch = asyncio.create_task(self._watch_quiet())
        for message in await _pending_messages(conversation_id=conversation.id):
            await self.send_json(message)
        after = query.get("after")
        if after:
            # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
            digits = re.fullmatch(r"[0-9]{1,19}", after[0])
            await self._resume({"after": int(after[0]) if digits else after[0]})
        else:
            self._grace = asyncio.create_task(self._go_live_later())

    async def _go_live_later(self) -> None:
        await asyncio.sleep(RESUME_GRACE)
        await self.channel_layer.send(self.channel_name, {"type": "resume.grace"})

    async def resume_grace(self, message: dict[str, Any]) -> None:
        """No ``resume`` came: go live from the cursor current at connect."""
        async with self._sending:
            if not self.live:
                self.live = True
                await self._fill(until=None, reason="connect")

    async def _watch_quiet(self) -> None:
        """Ask for a catch-up check (through this consumer's own channel, so it runs in turn
        with the other handlers) once per quiet spell."""
        while True:
            await asyncio.sleep(QUIET_CHECK_SECONDS / 2)
            quiet = time.monotonic() - self._last_message >= QUIET_CHECK_SECONDS
            if self.live and quiet and not self._checked:
                self._checked = True
                await self.channel_layer.send(self.channel_name, {"type": "catch.up"})

    async def catch_up(self, message: dict[str, Any]) -> None:
        """Read back events this connection lacks (see the module docstring)."""
        if (
            self.live
            and await conversation_cursor_async(conversation_id=self.conversation_id) > self.cursor
        ):
            async with self._sending:
                logger.info("websocket caught up on events it had not received")
                await self._fill(until=None, reason="quiet_check")

    def _heard(self) -> None:
        self._last_message = time.monotonic()
        self._checked = False

    def _stop_timers(self) -> None:
        for task in (getattr(self, "_grace", None), getattr(self, "_watch", None)):
            if task is not None:
                task.cancel()

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Close from the server end; the connection's timers stop with it."""
        self._stop_timers()
        await super().close(code=code, reason=reason)

    async def release(self) -> None:
        self._stop_timers()
        pump, self._pump = getattr(self, "_pump", None), None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        hub, self._hub = getattr(self, "_hub", None), None
        if hub is not None:
            await hub.leave(self.conversation_id, self)

    async def disconnect(self, code: int) -> None:
        await self.release()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            for group in self.revocation_groups:
                await self.channel_layer.group_discard(group, self.channel_name)

    # --- from the client ----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self._take_token():
            metrics.throttled(scope="websocket")
            await self._error("rate_limited", "Too many messages; slow down.")
            return
        if text_data is None:
            await self._error("bad_message", "Send JSON text messages.")
            return
        if len(text_data.encode()) > MAX_MESSAGE_BYTES:
            await self._error("too_large", f"Messages are limited to {MAX_MESSAGE_BYTES} bytes.")
            return
        try:
            content = json.loads(text_data)
        except RecursionError:
            # "[" * 30000 fits the size limit but nests deeper than the parser recurses:
            # refused like any malformed message, and the socket stays open.
            await self._error("bad_json", "The message nests too deeply.")
            return
        except ValueError:
            await self._error("bad_json", "The message is not valid JSON.")
            return
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            await self._error("bad_message", 'A message is a JSON object with a "type".')
            return
        handler = {
            "resume": self._resume,
            "agent_confirm_response": self._confirm_response,
            "run.cancel": self._run_cancel,
            "ping": self._ping,
        }.get(content["type"])
        if handler is None:
            await self._error("unknown_type", f"Unknown message type {content['type'][:64]!r}.")
            return
        try:
            await handler(content)
        except DomainError as exc:
            await self._error(exc.code, exc.detail)

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(RATE_BURST, self._tokens + (now - self._refilled) * RATE_PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def _resume(self, content: dict[str, Any]) -> None:
        after = content.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            await self._error("invalid", '"after" must be a cursor (an integer >= 0).')
            return
        now = time.monotonic()
        if now - getattr(self, "_resumed_at", -RESUME_INTERVAL) < RESUME_INTERVAL:
            await self._error("rate_limited", "Resume at most once a second.")
            return
        self._resumed_at = now
        current = await cursor_ceiling_async(conversation_id=self.conversation_id)
        async with self._sending:
            # A cursor from the future would hide the events still to come: clamp it.
            self.cursor = min(after, current)
            self.live = True
            await self._fill(until=None, reason="resume")

    async def _confirm_response(self, content: dict[str, Any]) -> None:
        answers = content.get("answers")
        approved = content.get("approved")
        if approved is not None and not isinstance(approved, bool):
            await self._error("invalid", '"approved" must be true or false.')
            return
        await database_sync_to_async(approval_services.approval_decide)(
            approval_id=content.get("approval_id", ""),
            user=self.user,
            approved=approved,
            answers=answers,
            via="websocket",
        )

    async def _run_cancel(self, content: dict[str, Any]) -> None:
        await database_sync_to_async(run_services.run_cancel)(
            user=self.user, conversation_id=self.conversation_id, run_id=content.get("run_id", "")
        )

    async def _ping(self, content: dict[str, Any]) -> None:
        await self.send_json({"type": "pong"})

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "code": code, "detail": detail})

    # --- live events ----------------------------------------------------------------------

    def live_batch(self, first: int, sent_ms: int, texts: list[str]) -> None:
        """From the hub: the live log's append of events ``first``… (queued for the pump;
        a connection holding :data:`LIVE_QUEUE_MAX` of them, or
        :data:`LIVE_QUEUE_MAX_BYTES`, drops them and reads back)."""
        size = sum(len(text) for text in texts)
        if len(self._live) >= LIVE_QUEUE_MAX or self._live_bytes + size > LIVE_QUEUE_MAX_BYTES:
            self._live.clear()
            self._live_bytes = 0
            self._behind = True
        else:
            self._live.append((first, sent_ms, texts, size))
            self._live_bytes += size
        self._wake.set()

    def live_resync(self) -> None:
        """From the hub: appends may have been lost; read back."""
        self._behind = True
        self._wake.set()

    async def _pump_live(self) -> None:
        """Send the queued live appends, in order, one at a time with the read-backs."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._live or self._behind:
                self._heard()
                try:
                    async with self._sending:
                        if self._behind:
                            self._behind = False
                            if self.live:
                                await self._fill(until=None, reason="resync")
                            continue
                        first, sent_ms, texts, size = self._live.popleft()
                        self._live_bytes -= size
                        await self._deliver(
                            [(first + index, text) for index, text in enumerate(texts)],
                            sent_at=sent_ms / 1000,
                        )
                except OSError:
                    return  # the client went away (the server's ClientDisconnected is one)
                except Exception:
                    # A failed read-back (the database away for a moment): read back again
                    # shortly; what this connection missed is in the log.
                    logger.exception("websocket: live delivery failed; reading back shortly")
                    self._behind = True
                    await asyncio.sleep(1.0)

    async def conversation_events(self, message: dict[str, Any]) -> None:
        """Embedded mode: stored events from the channel layer, in cursor order."""
        self._heard()
        events = [
            (event["cursor"], json.dumps(event, ensure_ascii=False)) for event in message["events"]
        ]
        async with self._sending:
            await self._deliver(events, sent_at=message.get("sent_at"))

    async def _deliver(self, events: list[EventText], *, sent_at: float | None) -> None:
        """Send what the client lacks of ``events`` (consecutive live events), reading back
        any gap before them first. Call with ``_sending`` held."""
        if not self.live or not events:
            return  # before the client's resume: read back then
        first = events[0][0]
        if events[-1][0] <= self.cursor:
            return
        if first > self.cursor + 1:
            await self._fill(until=first, reason="gap")
        fresh = [event for event in events if event[0] > self.cursor]
        await self._send_events(fresh)
        metrics.relay_delivered(sent_at=sent_at, count=len(fresh))

    # --- from the group -----------------------------------------------------------------

    async def session_revoked(self, message: dict[str, Any]) -> None:
        """The user's tokens were revoked (logout, password change): a socket opened with a
        token closes with 4401; a browser session's too when its session ended with them
        (a password change). A deleted personal API token (``token_id``) closes only the
        sockets opened with it."""
        token_id = message.get("token_id")
        if token_id is not None:  # one personal API token was deleted: its sockets only
            if self.scope.get("paw_token_id") == token_id:
                await self.close(code=4401)
        elif self.scope.get("paw_auth") == "jwt" or message.get("sessions"):
            await self.close(code=4401)

    async def conversation_deleted(self, message: dict[str, Any]) -> None:
        """The conversation was deleted: close with 4404."""
        await self.close(code=4404)

    async def session_signed_out(self, message: dict[str, Any]) -> None:
        """This socket's browser session signed out: close with 4401."""
        await self.close(code=4401)

    async def conversation_message(self, message: dict[str, Any]) -> None:
        self._heard()
        await self.send_json(message["message"])

    async def _fill(self, *, until: int | None, reason: str) -> None:
        """Send the events after ``self.cursor`` (and below ``until``), page by page;
        ``reason``: why they are read back (counted: ``paw_relay_events_replayed_total``).
        Call with ``_sending`` held."""
        while True:
            page = await event_texts_after_async(
                conversation_id=self.conversation_id,
                after=self.cursor,
                until=until,
                limit=REPLAY_PAGE,
            )
            if not page:  # a page may be cut short by its size: read until none is left
                return
            await self._send_events(page)
            metrics.events_replayed(reason=reason, count=len(page))

    async def _send_events(self, events: list[EventText]) -> None:
        """Send ``events`` (after ``self.cursor``, in cursor order), each given as its JSON
        text: one ``run.events`` frame on a connection that asked for them
        (``?frames=batch``), else a ``run.event`` frame each. The frames are put together
        from the texts, not encoded again."""
        if not events:
            return
        if self.batch_frames:
            await self.send(
                text_data='{"type":"run.events","events":['
                + ",".join(text for _, text in events)
                + "]}"
            )  # a read-back page is at most READ_BACK_MAX_BYTES (and one event) of texts
            self.cursor = events[-1][0]
            return
        for cursor, text in events:
            await self.send(text_data='{"type":"run.event",' + text[1:])
            self.cursor = cursor


@database_sync_to_async
def _signed_in(user: Any) -> bool:
    return user is not None and user.is_authenticated


class UserConsumer(PawConsumer):
    """The person's own websocket, ``ws/user/``: the conversation list's live feed.

    Server → client: ``conversation.updated`` ``{conversation: {id, title, active,
    active_run_id, pending_approvals: [{id, kind, expires_at}], last_activity, created,
    as_of}}`` when one of their conversations changes in the sidebar's terms (a run
    starts or ends, an approval is raised, decided or expires, a title changes, it is
    created), ``conversation.removed`` ``{id}`` when one is deleted, ``error``, ``pong``.
    Client → server: ``ping``. Nothing is replayed: a client (re)reads
    ``GET /api/conversations`` on every (re)connect, and each message carries a whole
    state, so nothing is missed for long. Close codes: 4401 not signed in (or signed out,
    or its token revoked) and 4429 (a token refused for its address's failed bearer
    authentications), as the conversation socket's.
    """

    async def connect(self) -> None:
        self.groups_followed: list[str] = []
        user = self.scope.get("user")
        await self.accept(subprotocol=self.scope.get("paw_subprotocol"))
        if await self.refuse_throttled_token():
            return
        if not await _signed_in(user):
            await self.close(code=4401)
            return
        self.groups_followed += [user_group(user.pk), revocation_group(user.pk)]
        session = self.scope.get("session")
        if self.scope.get("paw_auth") != "jwt" and session is not None and session.session_key:
            self.groups_followed.append(session_group(session.session_key))
        for group in self.groups_followed:
            await self.channel_layer.group_add(group, self.channel_name)
        self._tokens = float(RATE_BURST)
        self._refilled = time.monotonic()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_followed:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        now = time.monotonic()
        self._tokens = min(RATE_BURST, self._tokens + (now - self._refilled) * RATE_PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            metrics.throttled(scope="websocket")
            await self._error("rate_limited", "Too many messages; slow down.")
            return
        self._tokens -= 1
        if text_data is None or len(text_data) > 1024:
            await self._error("bad_message", 'Send {"type": "ping"}.')
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            await self._error("bad_json", "The message is not valid JSON.")
            return
        if not isinstance(content, dict) or content.get("type") != "ping":
            await self._error("unknown_type", 'This socket only takes {"type": "ping"}.')
            return
        await self.send_json({"type": "pong"})

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "code": code, "detail": detail})

    # --- from the groups ----------------------------------------------------------------

    async def conversation_updated(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {"type": "conversation.updated", "conversation": message["conversation"]}
        )

    async def conversation_removed(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "conversation.removed", "id": message["id"]})

    async def session_revoked(self, message: dict[str, Any]) -> None:
        """As :meth:`ConversationConsumer.session_revoked`."""
        token_id = message.get("token_id")
        if token_id is not None:
            if self.scope.get("paw_token_id") == token_id:
                await self.close(code=4401)
        elif self.scope.get("paw_auth") == "jwt" or message.get("sessions"):
            await self.close(code=4401)

    async def session_signed_out(self, message: dict[str, Any]) -> None:
        """This socket's browser session signed out: close with 4401."""
        await self.close(code=4401)
