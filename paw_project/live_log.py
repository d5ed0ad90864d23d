"""The live log: each conversation's newest events in Redis, sent the moment they get
their cursor (Redis mode only; docs/api.md, "The live path").

Per log (a conversation) there are three Redis names:

* ``paw:live:{<id>}:n``, a counter: the last cursor handed out;
* ``paw:live:{<id>}:s``, a stream: the newest events, entry id ``<cursor>-0``, fields
  ``m`` (the event's client form as JSON text, ``{"cursor", "run_id", "event"}``), ``k``
  (the notify kind) and ``t`` (when it was appended, epoch milliseconds);
* ``paw:live:<id>``, a Pub/Sub channel: each append as one message,
  ``<first cursor> <epoch ms>\\n<m>\\n<m>…`` (the ``m`` texts of the append, in order).

One Lua script (:data:`_APPEND`) hands out the cursors, adds the entries and publishes
them, atomically: the stream's order is the cursors' order whoever appends, and an
event is in the stream before any subscriber hears of it. So a reader that subscribes
first and then reads the stream after its last cursor misses nothing and gets nothing
twice (:class:`LiveHub` for the subscribers; :func:`read` for the stream).

PostgreSQL stays the durable copy: the writer stores each event with its cursor right
after the append (``conversations.services.events``). A stream loses only entries that
the reaper has checked are stored, a minute after their append (:func:`trim_stored`),
so a reader that reads the database below the stream's oldest entry finds everything;
it is removed when emptied, or :data:`STREAM_TTL_MS` after its last append. The counter
lives longer (:data:`COUNTER_TTL_MS`); when it is gone (a new conversation, Redis
restarted, or the conversation was idle for a week) the next append seeds it from the
writer's ``seed()``: for a conversation with stored events, the stored cursor plus
:data:`RESEED_GAP`, so a cursor handed out before a restart and not stored yet is never
handed out again. Cursors therefore increase but may skip numbers.

This module knows Redis and the message format, nothing of PAW's models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

logger = logging.getLogger(__name__)

#: A stream is removed this long after its last append (ms); before that, the reaper
#: trims what it has checked is stored (:func:`trim_stored`).
STREAM_TTL_MS = 24 * 3600 * 1000
#: A counter is removed this long after its last append (ms); then it is seeded again.
COUNTER_TTL_MS = 7 * 24 * 3600 * 1000
#: How far above the stored cursor the counter of a conversation with stored events is
#: seeded: more than the events writers may hold between their append and their storage
#: (a node's pipeline holds at most ``sandboxes.pipeline.MAX_UNSTORED_EVENTS``, 20,000).
RESEED_GAP = 100_000
#: The name a hub's connection gives itself (``CLIENT LIST`` shows it).
HUB_CLIENT_NAME = "paw-live-hub"
#: Seconds between two connection attempts of a hub whose connection broke.
HUB_RETRY_SECONDS = 0.5

# KEYS: counter, stream. ARGV: seed ("" when unknown), channel, stream ttl ms, counter
# ttl ms, count N, publish ("1" or "0"), N bodies (the client form's JSON without
# its "{" and cursor), N kinds. Returns the first cursor handed out, or the error NOSEED
# when the counter is gone and no seed was given.
_APPEND = """
local last = redis.call('GET', KEYS[1])
if last then
  last = tonumber(last)
else
  if ARGV[1] == '' then return redis.error_reply('NOSEED') end
  last = tonumber(ARGV[1])
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then
    local held = tonumber(string.match(top[1][1], '^(%d+)'))
    if held > last then last = held end
  end
end
local now = redis.call('TIME')
local ms = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000))
local n = tonumber(ARGV[5])
local first = last + 1
local lines = {}
for i = 1, n do
  last = last + 1
  local cursor = string.format('%d', last)
  local m = '{"cursor":' .. cursor .. ',' .. ARGV[6 + i]
  redis.call('XADD', KEYS[2], cursor .. '-0', 'm', m, 'k', ARGV[6 + n + i], 't', ms)
  lines[i] = m
end
redis.call('SET', KEYS[1], string.format('%d', last), 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ARGV[6] == '1' then
  redis.call('PUBLISH', ARGV[2], string.format('%d', first) .. ' ' .. ms .. '\\n' .. table.concat(lines, '\\n'))
end
return first
"""


def enabled() -> bool:
    """Whether events go live through the live log: in Redis mode (``PAW_REDIS_URL``)."""
    return bool(settings.REDIS_URL)


def counter_key(log_id: Any) -> str:
    return f"paw:live:{{{log_id}}}:n"


def stream_key(log_id: Any) -> str:
    return f"paw:live:{{{log_id}}}:s"


def channel_name(log_id: Any) -> str:
    return f"paw:live:{log_id}"


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def client() -> redis.Redis:
    """The process's Redis client for the live log (a thread-safe connection pool)."""
    url = settings.REDIS_URL
    with _clients_lock:
        found = _clients.get(url)
        if found is None:
            found = _clients[url] = redis.Redis.from_url(url, health_check_interval=30)
    return found


_scripts: dict[tuple[str, int], Any] = {}


def _script(connection: redis.Redis, source: str) -> Any:
    """``source`` registered on ``connection`` (once per client: it runs by its hash)."""
    key = (source, id(connection))
    script = _scripts.get(key)
    if script is None:
        script = _scripts[key] = connection.register_script(source)
    return script


class NeedsSeed(Exception):
    """The log's counter is gone (a Redis restart, a long idle spell): seed it."""


@dataclass(frozen=True, slots=True)
class Append:
    """Events to append to one log: ``bodies`` (each event's client form as JSON text
    *without* its opening ``{`` and its cursor: ``'"run_id": …, "event": {…}}'``), their
    notify ``kinds`` (``""`` for none), and whether to ``publish`` them now (else only the
    stream gets them; :func:`publish` sends them later)."""

    log_id: Any
    bodies: Sequence[str]
    kinds: Sequence[str]
    publish: bool = True


def append(
    log_id: Any,
    bodies: Sequence[str],
    kinds: Sequence[str],
    *,
    seed: Callable[[], int],
    publish: bool = True,
) -> int:
    """Append events to the log, publish them, and return the first cursor handed out
    (the others follow it one by one). With ``publish=False`` they are only added to the
    stream (readers reading back get them); :func:`publish` sends them later.

    ``seed()`` is called only when the counter is gone: the cursor to continue after (see
    the module docstring; the stream's newest entry wins if higher). One Redis round trip
    (two when seeding). Raises ``redis.RedisError`` when Redis cannot be reached."""
    return append_many([Append(log_id, bodies, kinds, publish)], seed=lambda _: seed())[0]


def append_many(appends: Sequence[Append], *, seed: Callable[[Any], int]) -> list[int]:
    """:func:`append` for several appends (to one log or several) in one round trip;
    appends to one log are applied in their order. Returns each one's first cursor.
    ``seed(log_id)`` is called for a log whose counter is gone. Raises
    ``redis.RedisError``."""
    if not appends or any(not item.bodies for item in appends):
        raise ValueError("nothing to append")
    connection = client()
    script = _script(connection, _APPEND)
    pipe = connection.pipeline(transaction=False)
    for item in appends:
        script(keys=_keys(item.log_id), args=_args(item, ""), client=pipe)
    results = pipe.execute(raise_on_error=False)
    firsts: list[int] = []
    seeded: dict[str, str] = {}
    for item, result in zip(appends, results, strict=True):
        if isinstance(result, redis.ResponseError) and "NOSEED" in str(result):
            # The counter is gone: seed it, then this append and every later one of the
            # same log (they found no counter either) go one by one, in order.
            key = counter_key(item.log_id)
            if key not in seeded:
                seeded[key] = str(seed(item.log_id))
                logger.info("live log %s: counter seeded at %s", item.log_id, seeded[key])
            result = script(keys=_keys(item.log_id), args=_args(item, seeded[key]))
        elif isinstance(result, Exception):
            raise result
        firsts.append(int(result))
    return firsts


def _keys(log_id: Any) -> list[str]:
    return [counter_key(log_id), stream_key(log_id)]


def _args(item: Append, seed: str) -> list[Any]:
    return [
        seed, channel_name(item.log_id), STREAM_TTL_MS, COUNTER_TTL_MS,
        len(item.bodies), int(item.publish), *item.bodies, *item.kinds,
    ]  # fmt: skip


def message(first: int, sent_ms: int, bodies: Sequence[str]) -> str:
    """A published append's text, as the script writes it (see the module docstring)."""
    lines = [f'{{"cursor":{first + index},{body}' for index, body in enumerate(bodies)]
    return f"{first} {sent_ms}\n" + "\n".join(lines)


def publish(log_id: Any, first: int, bodies: Sequence[str]) -> None:
    """Publish events already in the stream (appended with ``publish=False``): cursors
    ``first``… and their ``bodies`` as they were appended. Raises ``redis.RedisError``."""
    client().publish(channel_name(log_id), message(first, int(time.time() * 1000), bodies))


def last_cursor(log_id: Any) -> int | None:
    """The last cursor handed out in the log, or ``None`` when its counter is gone."""
    value = client().get(counter_key(log_id))
    return int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """One event of a stream: its ``cursor``, its client form as JSON ``text``
    (``{"cursor", "run_id", "event"}``), its notify ``kind`` and when it was appended
    (``appended_ms``, epoch milliseconds)."""

    cursor: int
    text: str
    kind: str
    appended_ms: int


def _entry(item: tuple[bytes, dict[bytes, bytes]]) -> LiveEntry:
    entry_id, fields = item
    return LiveEntry(
        cursor=int(entry_id.split(b"-", 1)[0]),
        text=fields[b"m"].decode(),
        kind=fields.get(b"k", b"").decode(),
        appended_ms=int(fields.get(b"t", b"0")),
    )


#: Entries a read asks Redis for at a time (a read stops at its byte budget in between).
READ_CHUNK = 32


def _range(after: int, until: int | None) -> tuple[str, str]:
    return (f"({after}-0" if after > 0 else "-", f"({until}-0" if until is not None else "+")


def _taken(
    items: list, entries: list[LiveEntry], size: int, limit: int, max_bytes: int | None
) -> tuple[bool, int, int]:
    """Add ``items`` to ``entries`` (whose texts hold ``size`` characters) within
    ``limit`` and the byte budget; the entry that goes past the budget is taken too, so
    the caller sees that there was more (it keeps at least one entry). ``(whether to read
    on, the last cursor taken, the texts' size now)``."""
    for item in items:
        entry = _entry(item)
        entries.append(entry)
        size += len(entry.text)
        if len(entries) >= limit or (max_bytes is not None and size > max_bytes):
            return False, entry.cursor, size
    return len(items) == READ_CHUNK, entries[-1].cursor if entries else 0, size


def read(
    log_id: Any,
    *,
    after: int,
    until: int | None = None,
    limit: int = 1000,
    max_bytes: int | None = None,
) -> tuple[int | None, list[LiveEntry]]:
    """``(oldest, entries)``: the oldest cursor the stream still holds (``None``: the
    stream is empty or gone) and up to ``limit`` of its entries with
    ``after < cursor < until``, in cursor order, stopping at the first one whose text
    takes them past ``max_bytes`` (included: the caller cuts). Whatever is older than
    ``oldest`` is stored, and is read from PostgreSQL. Raises ``redis.RedisError``."""
    key = stream_key(log_id)
    low, high = _range(after, until)
    pipe = client().pipeline(transaction=False)
    pipe.xrange(key, "-", "+", count=1)
    pipe.xrange(key, low, high, count=min(limit, READ_CHUNK))
    oldest, items = pipe.execute()
    entries: list[LiveEntry] = []
    more, last, size = _taken(items, entries, 0, limit, max_bytes)
    while more:
        items = client().xrange(key, _range(last, None)[0], high, count=READ_CHUNK)
        more, last, size = _taken(items, entries, size, limit, max_bytes)
    return (_entry(oldest[0]).cursor if oldest else None), entries


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


def _async_client() -> redis.asyncio.Redis:
    """The running loop's Redis client for reads (no thread hop for the websockets)."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        found = _async_clients[loop] = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    return found


async def aread(
    log_id: Any,
    *,
    after: int,
    until: int | None = None,
    limit: int = 1000,
    max_bytes: int | None = None,
) -> tuple[int | None, list[LiveEntry]]:
    """:func:`read` from an event loop."""
    key = stream_key(log_id)
    low, high = _range(after, until)
    async with _async_client().pipeline(transaction=False) as pipe:
        pipe.xrange(key, "-", "+", count=1)
        pipe.xrange(key, low, high, count=min(limit, READ_CHUNK))
        oldest, items = await pipe.execute()
    entries: list[LiveEntry] = []
    more, last, size = _taken(items, entries, 0, limit, max_bytes)
    while more:
        items = await _async_client().xrange(key, _range(last, None)[0], high, count=READ_CHUNK)
        more, last, size = _taken(items, entries, size, limit, max_bytes)
    return (_entry(oldest[0]).cursor if oldest else None), entries


async def alast_cursor(log_id: Any) -> int | None:
    """:func:`last_cursor` from an event loop."""
    value = await _async_client().get(counter_key(log_id))
    return int(value) if value is not None else None


def streams() -> Iterator[str]:
    """The ids of every log that has a stream (for the reconciler; scans the keyspace)."""
    for key in client().scan_iter(match="paw:live:{*}:s", count=500):
        text = key.decode()
        yield text[len("paw:live:{") : -len("}:s")]


def entries_older_than(
    log_id: Any, *, appended_before_ms: int, limit: int = 1000
) -> list[LiveEntry]:
    """The stream's oldest entries appended before ``appended_before_ms`` (epoch ms),
    oldest first (at most ``limit``)."""
    found = []
    for item in client().xrange(stream_key(log_id), "-", "+", count=limit):
        entry = _entry(item)
        if entry.appended_ms >= appended_before_ms:
            break
        found.append(entry)
    return found


def trim_stored(log_id: Any, *, through: int) -> None:
    """Drop the stream's entries up to cursor ``through``, which the caller checked are
    stored in the database (readers read those there); an emptied stream is removed (the
    counter stays)."""
    pipe = client().pipeline(transaction=False)
    pipe.xtrim(stream_key(log_id), minid=f"{through + 1}-0")
    pipe.xlen(stream_key(log_id))
    _, left = pipe.execute()
    if not left:
        _delete_if_empty(stream_key(log_id))  # still empty: an append may have come


_DELETE_IF_EMPTY = """
if redis.call('XLEN', KEYS[1]) == 0 then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _delete_if_empty(key: str) -> None:
    _script(client(), _DELETE_IF_EMPTY)(keys=[key])


def forget(log_id: Any) -> None:
    """Remove the log's stream and counter (its conversation was deleted)."""
    client().delete(stream_key(log_id), counter_key(log_id))


# --- Subscribers ---------------------------------------------------------------------------


class Subscriber(Protocol):
    """What a :class:`LiveHub` calls, from its event loop, without awaiting: it must not
    block (queue the work)."""

    def live_batch(self, first: int, sent_ms: int, texts: list[str]) -> None:
        """An append of events ``first``, ``first + 1``, …: their client forms as JSON
        texts, published at ``sent_ms`` (epoch ms)."""

    def live_resync(self) -> None:
        """Messages may have been lost (the hub's connection broke): read the log."""


def parse_message(data: bytes) -> tuple[int, int, list[str]]:
    """``(first cursor, sent ms, texts)`` of a published append (see the module docstring)."""
    text = data.decode()
    head, _, body = text.partition("\n")
    first, _, sent = head.partition(" ")
    return int(first), int(sent), body.split("\n")


class LiveHub:
    """One Pub/Sub connection per event loop for all the loop's subscribers: a channel is
    subscribed while at least one subscriber follows it, and each message is handed to
    every subscriber of its channel (``Subscriber.live_batch``).

    :meth:`follow` returns once Redis confirmed the subscription, so what is appended after
    it returns reaches the subscriber. When the connection breaks, the hub reconnects,
    subscribes again and calls ``live_resync()`` on everyone. Use :func:`hub` to get the
    running loop's hub; it stops its reader when its last subscriber leaves.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._followers: dict[str, set[Subscriber]] = {}
        self._confirmations: dict[str, list[asyncio.Future]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def follow(self, log_id: Any, subscriber: Subscriber) -> None:
        """Hand ``subscriber`` every append of the log from now on. Raises
        ``redis.RedisError`` when Redis cannot be reached."""
        channel = channel_name(log_id)
        async with self._lock:
            followers = self._followers.setdefault(channel, set())
            followers.add(subscriber)
            if len(followers) > 1:
                return
            try:
                await self._ensure_reader()
                confirmed = asyncio.get_running_loop().create_future()
                self._confirmations.setdefault(channel, []).append(confirmed)
                await self._pubsub.subscribe(channel)
            except BaseException:
                followers.discard(subscriber)
                if not followers:
                    del self._followers[channel]
                raise
        await asyncio.wait_for(confirmed, timeout=10)

    async def leave(self, log_id: Any, subscriber: Subscriber) -> None:
        """Stop handing the log's appends to ``subscriber``."""
        channel = channel_name(log_id)
        async with self._lock:
            followers = self._followers.get(channel)
            if followers is None or subscriber not in followers:
                return
            followers.discard(subscriber)
            if followers:
                return
            del self._followers[channel]
            if self._pubsub is not None:
                with contextlib.suppress(redis.RedisError, OSError):
                    await self._pubsub.unsubscribe(channel)
            if not self._followers:
                await self._stop_reader()

    async def _ensure_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        self._pubsub = await _connected_pubsub(self._url)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._pubsub))

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        pubsub, self._pubsub = self._pubsub, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        if pubsub is not None:
            await _close_pubsub(pubsub)

    async def _read(self, pubsub: Any) -> None:
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=False, timeout=None)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                logger.warning("live log: subscription lost (%s); reconnecting", exc)
                await self._reconnect(pubsub)
                return
            if message is None:
                continue
            kind = message.get("type")
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            if kind == "subscribe":
                for confirmed in self._confirmations.pop(channel, []):
                    if not confirmed.done():
                        confirmed.set_result(None)
                continue
            if kind != "message":
                continue
            try:
                first, sent_ms, texts = parse_message(message["data"])
            except ValueError:
                logger.warning("live log: malformed message on %s", channel)
                continue
            for subscriber in list(self._followers.get(channel, ())):
                try:
                    subscriber.live_batch(first, sent_ms, texts)
                except Exception:
                    logger.exception("live log: a subscriber failed")

    async def _reconnect(self, broken: Any) -> None:
        """A new connection with the same subscriptions; everyone is told to resync."""
        await _close_pubsub(broken)
        while True:
            await asyncio.sleep(HUB_RETRY_SECONDS)
            async with self._lock:
                if not self._followers:
                    self._reader = self._pubsub = None
                    return
                try:
                    pubsub = await _connected_pubsub(self._url)
                    await pubsub.subscribe(*self._followers)
                except (redis.RedisError, OSError) as exc:
                    logger.warning("live log: still no subscription (%s)", exc)
                    continue
                self._pubsub = pubsub
                self._reader = asyncio.get_running_loop().create_task(self._read(pubsub))
                followers = [s for group in self._followers.values() for s in group]
            for subscriber in followers:
                try:
                    subscriber.live_resync()
                except Exception:
                    logger.exception("live log: a subscriber failed")
            return


async def _connected_pubsub(url: str) -> Any:
    """A Pub/Sub object on a new connection that never reconnects by itself: redis-py
    would resubscribe silently and the messages of the gap would be lost unnoticed; the
    hub reconnects itself and tells its subscribers to resync."""
    connection = redis.asyncio.Redis.from_url(
        url, retry=Retry(NoBackoff(), 0), client_name=HUB_CLIENT_NAME
    )
    pubsub = connection.pubsub()
    await pubsub.connect()  # the reader needs a connection to wait on
    pubsub.paw_redis = connection
    return pubsub


async def _close_pubsub(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()
    with contextlib.suppress(Exception):
        await pubsub.paw_redis.aclose()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveHub] = weakref.WeakKeyDictionary()


def hub() -> LiveHub:
    """The running event loop's :class:`LiveHub` (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = LiveHub(settings.REDIS_URL)
    return found
