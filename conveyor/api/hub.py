"""Where the live streams of an API process hear about changes: one LISTEN connection for all.

On PostgreSQL a :class:`ListenHub` holds the process's only streaming connection. It LISTENs
to an execution's channel (and registers the execution in ``stream_listeners``, see
:mod:`conveyor.store.listeners`) while at least one stream watches it, and hands each
announcement to the :class:`Feed` of every stream on that execution. Streams come and go
without costing a connection: 500 streams cost one, not 500.

A hub whose connection drops reconnects (backing off up to :data:`RECONNECT_MOST` seconds),
LISTENs again, and only then tells every stream to re-read the state, so a change made while
it was away is not missed. A stream whose client reads too slowly is told the same instead of
piling up announcements (:data:`BACKLOG`).

On SQLite (the embedded default) there is nothing to listen to: a :class:`PolledHub` reads
every watched execution every :data:`POLL` seconds, in one statement however many streams
watch, and hands each stream what it read (the stream sends only what changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
from starlette.concurrency import run_in_threadpool

from conveyor.exceptions import StreamsUnavailable
from conveyor.store import listeners

log = logging.getLogger("conveyor.api.streams")

POLL = 0.5
BACKLOG = 1000
RECONNECT_MOST = 5.0
OPEN_TIMEOUT = 10.0
# The triggers look for a registration when a status is written, not when it commits: a
# transaction that wrote before the registration and commits after the first read is neither
# announced nor read. The streams of a newly registered execution re-read once after this
# many seconds, longer than the engine's transactions take between a write and its commit.
SETTLE = 1.0
REFRESH = 300.0  # seconds between re-writes of the registrations (store.listeners.REFRESH)
APPLICATION_NAME = "conveyor-streams"
# A connection that dies silently (a host or a network gone) is noticed within ~25 s.
TCP_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

Notice = dict[str, Any]
State = tuple[str, list[tuple[str, str]]]  # the execution's status, and (node id, status)s


class Signal(enum.Enum):
    IDLE = "idle"  # nothing happened before the timeout
    RESYNC = "resync"  # announcements may have been missed: read the state again
    END = "end"  # the process is shutting down: end the stream


class Feed:
    """What one stream is told, in order: announcements, or to re-read, or to end."""

    __slots__ = ("_ended", "_notices", "_stale", "_wake", "execution_id")

    def __init__(self, execution_id: uuid.UUID) -> None:
        self.execution_id = execution_id
        self._notices: deque[Notice] = deque()
        self._stale = self._ended = False
        self._wake = asyncio.Event()

    def push(self, notice: Notice) -> None:
        if len(self._notices) >= BACKLOG:
            self.stale()  # a re-read costs one query; the backlog could cost any memory
            return
        self._notices.append(notice)
        self._wake.set()

    def stale(self) -> None:
        """What was announced so far is covered by a read that starts after this call."""
        self._notices.clear()
        self._stale = True
        self._wake.set()

    def end(self) -> None:
        self._ended = True
        self._wake.set()

    async def next(self, within: float) -> list[Notice] | Signal:
        """The announcements heard since the last call, or a signal; waits up to ``within``
        seconds."""
        if not (self._notices or self._stale or self._ended):
            self._wake.clear()
            try:
                async with asyncio.timeout(within):
                    await self._wake.wait()
            except TimeoutError:
                return Signal.IDLE
        if self._ended:
            return Signal.END
        if self._stale:
            self._stale = False
            return Signal.RESYNC
        notices = list(self._notices)
        self._notices.clear()
        return notices


class Hub(Protocol):
    """The port the streams use; one per API process."""

    async def start(self) -> None: ...

    async def subscribe(self, execution_id: uuid.UUID) -> Feed:
        """A feed on the execution, once every later change will reach it (raises
        :class:`StreamsUnavailable` if that cannot be promised in time)."""
        ...

    def unsubscribe(self, feed: Feed) -> None: ...

    async def close(self) -> None:
        """End every feed; no new one is given."""
        ...


class PolledHub:
    """SQLite: nothing announces changes, so one task reads every watched execution every
    :data:`POLL` seconds (one statement for all) and hands each stream what it read; the
    stream sends what differs from what it told its client."""

    def __init__(self, read: Callable[[list[uuid.UUID]], dict[uuid.UUID, State]]) -> None:
        self._read = read
        self._watches: dict[uuid.UUID, set[Feed]] = {}
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="conveyor-streams-poll")

    async def subscribe(self, execution_id: uuid.UUID) -> Feed:
        if self._closing.is_set():
            raise StreamsUnavailable()
        feed = Feed(execution_id)
        self._watches.setdefault(execution_id, set()).add(feed)
        return feed

    def unsubscribe(self, feed: Feed) -> None:
        feeds = self._watches.get(feed.execution_id)
        if feeds is not None:
            feeds.discard(feed)
            if not feeds:
                del self._watches[feed.execution_id]

    async def close(self) -> None:
        self._closing.set()
        for feeds in self._watches.values():
            for feed in feeds:
                feed.end()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL):
                    await self._closing.wait()
            if self._watches and not self._closing.is_set():
                try:
                    await self._poll()
                except Exception:  # the next poll tries again
                    log.exception("live streams: polling the watched executions failed")

    async def _poll(self) -> None:
        watched = list(self._watches)
        states = await run_in_threadpool(self._read, watched)
        for execution_id in watched:
            state = states.get(execution_id)
            for feed in self._watches.get(execution_id, ()):
                if state is None:
                    feed.stale()  # deleted: the stream's own read finds it gone, and ends
                else:
                    feed.push({"kind": "state", "status": state[0], "nodes": state[1]})


class _Watch:
    """The streams of one execution, and the future they wait on until it is listened to."""

    __slots__ = ("feeds", "ready")

    def __init__(self) -> None:
        self.feeds: set[Feed] = set()
        self.ready: asyncio.Future[None] | None = None


_NOBODY = _Watch()


class ListenHub:
    """PostgreSQL: one connection LISTENs for every stream of the process.

    Only the hub's task uses the connection. Streams change what it should listen to
    (:attr:`_watches`) and wake it; it applies the changes in one round trip between waits
    for announcements, so a burst of new streams costs a few statements, not one each."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._watches: dict[uuid.UUID, _Watch] = {}
        self._listened: set[uuid.UUID] = set()  # by the current connection
        self._registered: dict[uuid.UUID, uuid.UUID] = {}  # execution -> its row's id
        self._changed = asyncio.Event()
        self._closing = False
        self._resync = False
        self._task: asyncio.Task[None] | None = None
        self.connections = 0  # made so far; more than one means it reconnected

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="conveyor-streams")

    async def subscribe(self, execution_id: uuid.UUID) -> Feed:
        if self._closing:
            raise StreamsUnavailable()
        watch = self._watches.setdefault(execution_id, _Watch())
        feed = Feed(execution_id)
        watch.feeds.add(feed)
        if execution_id in self._listened:
            return feed
        if watch.ready is None or watch.ready.done():
            watch.ready = asyncio.get_running_loop().create_future()
            self._changed.set()
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await asyncio.shield(watch.ready)
        except TimeoutError:
            self.unsubscribe(feed)
            raise StreamsUnavailable() from None
        except BaseException:
            self.unsubscribe(feed)
            raise
        return feed

    def unsubscribe(self, feed: Feed) -> None:
        watch = self._watches.get(feed.execution_id)
        if watch is not None:
            watch.feeds.discard(feed)
            if not watch.feeds:
                self._changed.set()

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        for watch in self._watches.values():
            for feed in watch.feeds:
                feed.end()
            if watch.ready is not None and not watch.ready.done():
                watch.ready.set_exception(StreamsUnavailable())
                watch.ready.exception()  # retrieved: nobody may be left to await it
        self._changed.set()
        if self._task is not None:
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(self._task)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task

    async def _run(self) -> None:
        delay = 0.1
        while not self._closing:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    prepare_threshold=None,  # its LISTENs are new text each time
                    application_name=APPLICATION_NAME,
                    **TCP_KEEPALIVES,
                ) as conn:
                    self.connections += 1
                    delay = 0.1
                    await self._serve(conn)
            except psycopg.Error as exc:
                if self._closing:
                    break
                log.warning(
                    "live streams: the LISTEN connection failed (%s); reconnecting",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
            except Exception:  # a bug must not leave every stream of the process deaf
                log.exception("live streams: the LISTEN loop failed; reconnecting")
            if not self._closing:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wait_closing()
                delay = min(delay * 2, RECONNECT_MOST)

    async def _wait_closing(self) -> None:
        while not self._closing:
            self._changed.clear()
            await self._changed.wait()

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._listened.clear()
        # a new connection after a lost one: what was announced meanwhile went unheard
        self._resync = self.connections > 1
        refreshed = time.monotonic()
        while True:
            self._changed.clear()
            if self._closing:
                await self._release(conn)
                return
            await self._apply(conn)
            if time.monotonic() - refreshed >= REFRESH:
                await self._refresh(conn)
                refreshed = time.monotonic()
            if not self._changed.is_set():
                await self._wait(conn, REFRESH - (time.monotonic() - refreshed))

    async def _refresh(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Date the registrations anew; write back any that were deleted (and have their
        streams re-read what went unannounced)."""
        if not self._registered:
            return
        executions = list(self._registered)
        ids = [self._registered[e] for e in executions]
        cursor = await conn.execute(listeners.REFRESH, (ids, executions))
        self._settle([execution_id for execution_id, gone in await cursor.fetchall() if gone])

    async def _apply(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """LISTEN to the executions streams watch, UNLISTEN the others, and register them."""
        wanted = {e for e, watch in self._watches.items() if watch.feeds}
        listen = wanted - self._listened
        unlisten = self._listened - wanted
        gone = [e for e in self._registered if e not in wanted]
        self._listened -= unlisten  # a stream opened meanwhile waits for the next round
        if listen or unlisten:
            await conn.execute(listeners.listen_changes(listen, unlisten))
        if listen:
            executions = list(listen)
            ids = [self._registered.setdefault(e, uuid.uuid4()) for e in executions]
            await conn.execute(listeners.REGISTER, (ids, executions))
            asyncio.get_running_loop().call_later(SETTLE, self._settle, executions)
        if gone:
            await conn.execute(listeners.UNREGISTER, ([self._registered[e] for e in gone],))
            for execution_id in gone:
                del self._registered[execution_id]
        self._listened |= listen
        for execution_id in listen:
            ready = self._watches[execution_id].ready
            if ready is not None and not ready.done():
                ready.set_result(None)
        if self._resync:
            self._resync = False
            for watch in self._watches.values():
                for feed in watch.feeds:
                    feed.stale()
        for execution_id in [e for e, w in self._watches.items() if not w.feeds]:
            if execution_id not in self._listened:
                del self._watches[execution_id]

    def _settle(self, executions: list[uuid.UUID]) -> None:
        for execution_id in executions:
            for feed in self._watches.get(execution_id, _NOBODY).feeds:
                feed.stale()

    async def _wait(self, conn: psycopg.AsyncConnection[Any], most: float) -> None:
        """Hand out announcements until a stream changes what to listen to (or ``most``
        seconds pass)."""
        reader = asyncio.create_task(self._read(conn))
        waker = asyncio.create_task(self._changed.wait())
        try:
            await asyncio.wait(
                (reader, waker), timeout=max(0.0, most), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            reader.cancel()
            waker.cancel()
            lost, _ = await asyncio.gather(reader, waker, return_exceptions=True)
        if isinstance(lost, Exception):
            raise lost

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for notify in conn.notifies():
            execution_id = listeners.execution_of(notify.channel)
            watch = self._watches.get(execution_id) if execution_id else None
            if watch is None or not watch.feeds:
                continue
            try:
                notice = json.loads(notify.payload)
            except ValueError:
                notice = None
            if not isinstance(notice, dict) or notice.get("kind") not in ("node", "execution"):
                # not the triggers': someone's NOTIFY by hand
                log.warning(
                    "live streams: ignored a notice on %s: %.80r", notify.channel, notify.payload
                )
                continue
            for feed in watch.feeds:
                feed.push(notice)

    async def _release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """At shutdown: stop listening, and delete this process's registrations."""
        with contextlib.suppress(psycopg.Error):
            await conn.execute(listeners.UNLISTEN_ALL)
            if self._registered:
                await conn.execute(listeners.UNREGISTER, (list(self._registered.values()),))
                self._registered.clear()
