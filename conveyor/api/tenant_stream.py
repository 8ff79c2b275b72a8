"""A tenant's live stream (``GET /v1/stream``): each change of the status of its executions,
those triggered after it opened included, resumable from ``Last-Event-ID``.

The events are rows of ``stream_events``, written by a trigger in the transaction that
changes an execution's status (migration 0017), so they can be read again. An event's id is
its cursor ``<txid>-<id>``: on PostgreSQL the writing transaction's id and the row's, in which
order the events are read, and only below the oldest transaction still running (a sequence
alone would pass over an event whose transaction took an earlier number and committed later);
on SQLite ``0-<id>`` (its writers take turns).

One :class:`Poller` per API process reads the events of every tenant every :data:`POLL`
seconds, in one statement, while at least one tenant stream is open, and hands each stream its
tenant's events with the cursors they span. A stream that opens (or resumes after
``Last-Event-ID``) reads what it missed itself, through the pool and briefly, and whenever
the poller's span does not start where it stopped (it read too slowly); it holds no database
connection of its own. A resume replays at most :data:`REPLAY_MOST` events: past them the
stream sends ``reset`` and goes on from now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from conveyor.exceptions import StreamsUnavailable
from conveyor.service import Conveyor
from conveyor.service.reads import Cursor, Found, cursor_of, event_id

log = logging.getLogger("conveyor.api.streams")

POLL = 0.5  # seconds between the poller's reads
READ_MOST = 1000  # events one read takes
REPLAY_MOST = 1000  # events a resume replays before it gives up and sends ``reset``
BACKLOG = 100  # spans a slow stream keeps before it reads for itself
REREAD_AFTER = 1.0


@dataclass(frozen=True)
class Filters:
    tenant_id: uuid.UUID
    workflow: str | None = None
    dedupe_key: str | None = None

    def match(self, data: dict[str, Any]) -> bool:
        return (self.workflow is None or data["workflow"] == self.workflow) and (
            self.dedupe_key is None or data["dedupe_key"] == self.dedupe_key
        )


@dataclass(frozen=True)
class Span:
    """All the events of a tenant after ``start`` up to ``end``, in order."""

    start: Cursor
    end: Cursor
    events: list[tuple[Cursor, dict[str, Any]]]


class TenantFeed:
    __slots__ = ("_ended", "_spans", "_wake", "tenant_id")

    def __init__(self, tenant_id: uuid.UUID) -> None:
        self.tenant_id = tenant_id
        self._spans: deque[Span] = deque(maxlen=BACKLOG)  # the oldest fall off: a gap, re-read
        self._ended = False
        self._wake = asyncio.Event()

    def push(self, span: Span) -> None:
        self._spans.append(span)
        self._wake.set()

    def end(self) -> None:
        self._ended = True
        self._wake.set()

    async def next(self, within: float) -> list[Span] | None:
        """The spans read since the last call ([] if none within ``within`` seconds); None
        once the process shuts down."""
        if not (self._spans or self._ended):
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self._wake.wait()
        if self._ended:
            return None
        spans = list(self._spans)
        self._spans.clear()
        return spans


class Poller:
    """Reads every tenant's events for the tenant streams of the process (see the module)."""

    def __init__(
        self, read: Callable[[Cursor | None], tuple[list[Found], Cursor]], poll: float = POLL
    ) -> None:
        self._read, self._poll = read, poll
        self._feeds: set[TenantFeed] = set()
        self._cursor: Cursor | None = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="conveyor-tenant-streams")

    def subscribe(self, tenant_id: uuid.UUID) -> TenantFeed:
        if self._closing.is_set():
            raise StreamsUnavailable()
        feed = TenantFeed(tenant_id)
        self._feeds.add(feed)
        return feed

    def unsubscribe(self, feed: TenantFeed) -> None:
        self._feeds.discard(feed)

    async def close(self) -> None:
        self._closing.set()
        for feed in self._feeds:
            feed.end()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll):
                    await self._closing.wait()
            if not self._feeds:
                self._cursor = None  # nobody listened meanwhile: start again from now
                continue
            if self._closing.is_set():
                return
            try:
                found, cursor = await run_in_threadpool(self._read, self._cursor)
            except Exception:  # the next poll tries again
                log.exception("tenant streams: reading the events failed")
                continue
            start = self._cursor
            self._cursor = cursor
            if start is None:
                continue  # the first read only finds where now is
            by_tenant: dict[uuid.UUID, list[tuple[Cursor, dict[str, Any]]]] = {}
            for at, tenant_id, data in found:
                by_tenant.setdefault(tenant_id, []).append((at, data))
            for feed in self._feeds:
                feed.push(Span(start, cursor, by_tenant.get(feed.tenant_id, [])))


def sse(cursor: Cursor, data: dict[str, Any]) -> bytes:
    return f"id: {event_id(cursor)}\nevent: execution\ndata: {json.dumps(data)}\n\n".encode()


def reset(cursor: Cursor) -> bytes:
    detail = (
        f"more than {REPLAY_MOST} events since Last-Event-ID: read the executions again "
        f"(GET /v1/executions); the stream goes on from now"
    )
    data = {"detail": detail}
    return f"id: {event_id(cursor)}\nevent: reset\ndata: {json.dumps(data)}\n\n".encode()


def read_events(
    service: Conveyor, after: Cursor | None, filters: Filters | None, limit: int
) -> tuple[list[Found], Cursor]:
    """Events after ``after`` (None: none, only where now is): every tenant's for the poller,
    one stream's with its filters."""
    if filters is None:
        return service.events_after(after, limit)
    return service.events_after(
        after, limit, tenant_id=filters.tenant_id, workflow=filters.workflow,
        dedupe_key=filters.dedupe_key,
    )  # fmt: skip


async def opening(
    service: Conveyor, filters: Filters, last_event_id: str | None
) -> tuple[Cursor, list[bytes]]:
    """Where a new stream starts, and what it replays first."""
    if last_event_id is None:
        _, now = await run_in_threadpool(read_events, service, None, filters, 0)
        return now, []
    after = cursor_of(last_event_id)
    found, cursor = await run_in_threadpool(read_events, service, after, filters, REPLAY_MOST + 1)
    if len(found) > REPLAY_MOST:
        _, now = await run_in_threadpool(read_events, service, None, filters, 0)
        return now, [reset(now)]
    return cursor, [sse(at, data) for at, _, data in found]


async def events(
    service: Conveyor,
    feed: TenantFeed,
    filters: Filters,
    cursor: Cursor,
    first: list[bytes],
    keepalive: float,
) -> AsyncIterator[bytes]:
    """The stream's chunks: the replay, then each event as the poller reads it."""
    yield b": stream open\n\n" + b"".join(first)
    written = time.monotonic()
    while True:
        spans = await feed.next(max(0.0, keepalive - (time.monotonic() - written)))
        if spans is None:
            return
        chunks: list[bytes] = []
        for span in spans:
            if span.end <= cursor:
                continue
            if span.start > cursor:  # a gap (spans fell off a slow stream): read it
                try:
                    found, read_to = await run_in_threadpool(
                        read_events, service, cursor, filters, READ_MOST
                    )
                except DBAPIError as exc:
                    log.warning("tenant stream: reading the events failed (%s)", exc)
                    await asyncio.sleep(REREAD_AFTER)
                    break  # the next span finds the gap again
                chunks += [sse(at, data) for at, _, data in found]
                cursor = read_to
                if span.start > cursor:
                    continue  # more than one read behind: the next span reads on
            chunks += [sse(at, d) for at, d in span.events if at > cursor and filters.match(d)]
            cursor = max(cursor, span.end)
        if chunks:
            yield b"".join(chunks)
            written = time.monotonic()
        elif time.monotonic() - written >= keepalive:
            yield b": keepalive\n\n"
            written = time.monotonic()
