"""The conversation websocket, kept open across drops.

:class:`ConversationSocket` connects to
``ws(s)://HOST/ws/conversations/<id>/?after=N&frames=batch``
(authenticated by the subprotocols ``paw, <token>``, with the ``Origin`` PAW requires),
so PAW replays every stored event after cursor ``N`` and then streams live ones, in cursor
order. When the connection drops it reconnects with exponential backoff (0.5 s doubling
to 10 s, with jitter), again from the last cursor its reader has seen, and says so with a
``{"type": "paw_client.connected"}`` message so the reader can check what happened
meanwhile. Close codes 4401 (after one token renewal), 4403 and 4404 are final.

Frames: ``run.event`` (one event) and ``run.events`` (``events``: several, the same
fields without ``type``; what ``frames=batch`` asks PAW for) are both accepted;
:func:`frame_events` turns either into a list.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin, Subprotocol

from paw_client.errors import AuthenticationFailed, ConnectionFailed, NotFound, PermissionDenied

if TYPE_CHECKING:
    from paw_client.client import Client

#: Backoff between reconnection attempts, seconds: first, factor, most.
BACKOFF_FIRST, BACKOFF_FACTOR, BACKOFF_MAX = 0.5, 2.0, 10.0
#: Consecutive failed connection attempts before giving up (about a minute and a half).
MAX_ATTEMPTS = 12
#: Largest frame accepted (bytes): a replay page of 500 events can be big.
MAX_FRAME_BYTES = 16 * 1024 * 1024
CONNECTED = "paw_client.connected"


def frame_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events a frame carries: ``[{"cursor", "run_id", "event"}, ...]`` for
    ``run.event`` and ``run.events``, ``[]`` for any other frame."""
    if message.get("type") == "run.event":
        return [message]
    if message.get("type") == "run.events":
        return [e for e in message.get("events") or [] if isinstance(e, dict)]
    return []


def websocket_url(base_url: str, conversation_id: str, after: int) -> tuple[str, str]:
    """``(websocket URL, Origin)`` of a conversation for PAW at ``base_url``."""
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    prefix = parts.path.rstrip("/")
    path = f"{prefix}/ws/conversations/{conversation_id}/?after={after}&frames=batch"
    url = f"{scheme}://{parts.netloc}{path}"
    return url, f"{parts.scheme}://{parts.netloc}"


class ConversationSocket:
    """One conversation's websocket for a reader that tracks its own cursor.

    ``receive(after, timeout)`` returns the next message (a dict), ``None`` when nothing
    came within ``timeout`` seconds, or the ``paw_client.connected`` marker after every
    (re)connection. ``after`` is the reader's last cursor, used when it must reconnect.
    Raises :class:`AuthenticationFailed`, :class:`PermissionDenied`, :class:`NotFound`
    (close codes 4401, 4403, 4404) and :class:`ConnectionFailed` after ``MAX_ATTEMPTS``
    failed attempts in a row."""

    def __init__(self, client: Client, conversation_id: str) -> None:
        self._client = client
        self.conversation_id = conversation_id
        self._connection: ClientConnection | None = None
        self._failures = 0
        self._renewed = False
        self._token: str | None = None  # the token the current connection was opened with
        #: Connections made so far (the first and every reconnection).
        self.connections = 0

    def receive(self, *, after: int, timeout: float) -> dict[str, Any] | None:
        if self._connection is None:
            self._connect(after)
            return {"type": CONNECTED}
        try:
            text = self._connection.recv(timeout=timeout)
        except TimeoutError:
            self._failures = 0  # a quiet, healthy connection
            return None
        except ConnectionClosed as closed:
            self._drop()
            self._closed(closed.rcvd.code if closed.rcvd else None)
            return self.receive(after=after, timeout=timeout)
        self._failures = 0
        self._renewed = False
        try:
            message = json.loads(text)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    def send(self, message: dict[str, Any]) -> None:
        """Send a message if connected (best effort: a dropped one is the server's to redo)."""
        if self._connection is not None:
            try:
                self._connection.send(json.dumps(message))
            except ConnectionClosed:
                self._drop()

    def close(self) -> None:
        self._drop()

    def _drop(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):  # already broken: nothing to tell
                connection.close()

    def _closed(self, code: int | None) -> None:
        """React to a close code: final ones raise, others back off before reconnecting."""
        if code == 4401:
            if not self._renewed and self._client._credentials.renew_after_401(self._token):
                self._renewed = True
                return
            raise AuthenticationFailed("The websocket refused the credentials (4401).", status=401)
        if code == 4403:
            raise PermissionDenied("Not your conversation (4403).", status=403)
        if code == 4404:
            raise NotFound("No such conversation (it may have been deleted) (4404).", status=404)
        self._back_off()

    def _back_off(self) -> None:
        self._failures += 1
        if self._failures >= MAX_ATTEMPTS:
            raise ConnectionFailed(
                f"The websocket of conversation {self.conversation_id} failed "
                f"{self._failures} times in a row."
            )
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * BACKOFF_FACTOR ** (self._failures - 1))
        time.sleep(delay * random.uniform(0.75, 1.25))

    def _connect(self, after: int) -> None:
        while True:
            url, origin = websocket_url(self._client.base_url, self.conversation_id, after)
            token = self._token = self._client._credentials.bearer()
            protocols = [Subprotocol("paw"), Subprotocol(token)] if token else None
            try:
                self._connection = connect(
                    url,
                    subprotocols=protocols,
                    origin=Origin(origin),
                    open_timeout=10,
                    close_timeout=2,
                    max_size=MAX_FRAME_BYTES,
                    user_agent_header=self._client.user_agent,
                )
            except InvalidStatus as refused:
                status = refused.response.status_code
                if status == 403:
                    raise PermissionDenied(
                        "PAW refused the websocket handshake (403): is the server's host "
                        "in PAW_ALLOWED_HOSTS?",
                        status=403,
                    ) from refused
                self._back_off()
            except (OSError, TimeoutError, InvalidHandshake):
                self._back_off()
            else:
                self.connections += 1
                return
