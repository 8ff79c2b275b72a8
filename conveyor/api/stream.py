"""Live status of one execution as server-sent events.

Opening a stream: it is admitted against the caps (CONVEYOR_STREAMS_PER_TENANT and
CONVEYOR_STREAMS_PER_PROCESS: 429 past them), subscribes to the process's hub
(:mod:`conveyor.api.hub`: one LISTEN connection for every stream, polling on SQLite), and only
then reads the current state, through the pool and briefly; so no change falls between the
read and the announcements. A stream holds no database connection of its own while it is
open. It re-reads the state only when the hub says announcements may have been missed (its
connection was lost, the client read too slowly, or a second after the execution was first
registered: see :data:`~conveyor.api.hub.SETTLE`).

Events: ``execution`` (``{"status": ...}``) first with the current status, then on each
change; ``node`` (``{"node_id": ..., "status": ...}``) on each node's change. The stream ends
after the execution finishes, or when the API process shuts down (without a finished status:
open it again); a comment line after CONVEYOR_STREAMS_KEEPALIVE seconds (15) without an
event keeps idle connections open through proxies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from conveyor.api import tenant_stream
from conveyor.api.hub import Feed, Hub, ListenHub, PolledHub, Signal, State
from conveyor.api.schemas import Problem
from conveyor.config import Settings
from conveyor.engine.records import TenantRef
from conveyor.engine.states import ExecutionStatus
from conveyor.exceptions import NotFound, StreamsUnavailable, TooManyStreams
from conveyor.service import Conveyor
from conveyor.service.reads import cursor_of
from conveyor.store.listeners import channel as channel

log = logging.getLogger("conveyor.api.streams")

RETRY_AFTER = 10  # seconds a refused client is asked to wait
REREAD_AFTER = 1.0  # seconds before a failed re-read is tried again
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}

_EXECUTION_STATUSES = frozenset(s.value for s in ExecutionStatus)


def event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class Tracker:
    """What a stream has told its client: the execution's status and each node's. A change
    is sent once, however it is learnt (an announcement, or a read of the state)."""

    status: str = ""
    nodes: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return bool(self.status) and ExecutionStatus(self.status).finished

    def opened(self, state: State) -> bytes:
        """The first event: the execution's status; its nodes' are taken as known."""
        self.status, nodes = state
        self.nodes = dict(nodes)
        return event("execution", {"status": self.status})

    def read(self, state: State) -> list[bytes]:
        """The events that bring the client from what it was told to ``state``."""
        status, nodes = state
        told = [self._node(node_id, node_status) for node_id, node_status in nodes]
        told.append(self._execution(status))
        return [e for e in told if e is not None]

    def heard(self, notice: Mapping[str, Any]) -> bytes | None:
        """The event(s) of one announcement (or of a polled read of the whole state), if it
        tells the client something new."""
        if self.finished:
            return None
        if notice.get("kind") == "state" and notice.get("status") in _EXECUTION_STATUSES:
            return b"".join(self.read((notice["status"], notice["nodes"]))) or None
        status = notice.get("status")
        if not isinstance(status, str):
            return None
        if notice.get("kind") == "node" and isinstance(notice.get("node_id"), str):
            return self._node(notice["node_id"], status)
        if notice.get("kind") == "execution" and status in _EXECUTION_STATUSES:
            return self._execution(status)
        return None

    def _node(self, node_id: str, status: str) -> bytes | None:
        if self.nodes.get(node_id) == status:
            return None
        self.nodes[node_id] = status
        return event("node", {"node_id": node_id, "status": status})

    def _execution(self, status: str) -> bytes | None:
        if self.status == status:
            return None
        self.status = status
        return event("execution", {"status": status})


def refusal(
    tenant: TenantRef, held: int, total: int, *, per_tenant: int, per_process: int
) -> TooManyStreams | None:
    """Whether one more stream of ``tenant`` (who holds ``held`` of the ``total`` open) is
    refused, and the error that says why."""
    if held >= per_tenant:
        return TooManyStreams(
            f"tenant {tenant.name!r} has {held} live streams open on this API process, the "
            f"most CONVEYOR_STREAMS_PER_TENANT allows; close one or wait for one to end and "
            f"retry after Retry-After seconds (or have the operator raise the setting)"
        )
    if total >= per_process:
        return TooManyStreams(
            f"this API process has {total} live streams open, the most "
            f"CONVEYOR_STREAMS_PER_PROCESS allows; retry after Retry-After seconds, or on "
            f"another API process (or have the operator raise the setting)"
        )
    return None


class Admission:
    """The streams each tenant holds open in this process, against the caps."""

    def __init__(self, per_tenant: int, per_process: int) -> None:
        self.per_tenant, self.per_process = per_tenant, per_process
        self._held: Counter[uuid.UUID] = Counter()

    @property
    def open(self) -> int:
        return self._held.total()

    def held(self, tenant_id: uuid.UUID) -> int:
        return self._held[tenant_id]

    def admit(self, tenant: TenantRef) -> None:
        refused = refusal(
            tenant,
            self._held[tenant.id],
            self.open,
            per_tenant=self.per_tenant,
            per_process=self.per_process,
        )
        if refused is not None:
            raise refused
        self._held[tenant.id] += 1

    def release(self, tenant_id: uuid.UUID) -> None:
        self._held[tenant_id] -= 1
        if self._held[tenant_id] <= 0:
            del self._held[tenant_id]


class EventStream(StreamingResponse):
    """A stream's response: whatever way it ends (finished, client gone, never started),
    its slot and its feed are given back."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers=HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class Streams:
    """The live streams of one API process: the caps, and the hub that feeds them."""

    def __init__(
        self,
        hub: Hub,
        admission: Admission,
        keepalive: float = 15.0,
        poller: tenant_stream.Poller | None = None,
    ) -> None:
        self.hub, self.admission, self.keepalive = hub, admission, keepalive
        self.poller = poller

    async def open(
        self, service: Conveyor, tenant: TenantRef, execution_id: uuid.UUID
    ) -> EventStream:
        """The stream of an execution the tenant owns (raises :class:`TooManyStreams` or
        :class:`StreamsUnavailable`)."""
        self.admission.admit(tenant)
        closed = False

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.admission.release(tenant.id)
                if feed is not None:
                    self.hub.unsubscribe(feed)

        feed: Feed | None = None
        try:
            feed = await self.hub.subscribe(execution_id)
            state = await run_in_threadpool(_read, service, execution_id)
        except BaseException:
            close()
            raise
        tracker = Tracker()
        first = tracker.opened(state)
        return EventStream(_events(service, feed, tracker, first, self.keepalive), close)

    async def open_tenant(
        self,
        service: Conveyor,
        tenant: TenantRef,
        filters: tenant_stream.Filters,
        last_event_id: str | None,
    ) -> EventStream:
        """The tenant's stream (see :mod:`conveyor.api.tenant_stream`), counted against the
        same caps (raises :class:`TooManyStreams`, :class:`StreamsUnavailable`, or
        ValueError for a Last-Event-ID that is none of its ids)."""
        if last_event_id is not None:
            cursor_of(last_event_id)  # a bad one is refused before admission
        if self.poller is None:
            raise StreamsUnavailable()
        poller = self.poller
        self.admission.admit(tenant)
        closed = False
        feed: tenant_stream.TenantFeed | None = None

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.admission.release(tenant.id)
                if feed is not None:
                    poller.unsubscribe(feed)

        try:
            feed = poller.subscribe(tenant.id)
            cursor, first = await tenant_stream.opening(service, filters, last_event_id)
        except BaseException:
            close()
            raise
        chunks = tenant_stream.events(service, feed, filters, cursor, first, self.keepalive)
        return EventStream(chunks, close)

    async def close(self) -> None:
        """End every stream (each ends cleanly, without a finished status)."""
        if self.poller is not None:
            await self.poller.close()
        await self.hub.close()


async def _events(
    service: Conveyor, feed: Feed, tracker: Tracker, first: bytes, keepalive: float
) -> AsyncIterator[bytes]:
    yield first
    written = time.monotonic()
    while not tracker.finished:
        got = await feed.next(max(0.0, keepalive - (time.monotonic() - written)))
        if got is Signal.END:
            return
        chunks: list[bytes] = []
        if got is Signal.RESYNC:
            try:
                state = await run_in_threadpool(_read, service, feed.execution_id)
            except NotFound:
                return  # deleted by the retention sweep
            except DBAPIError as exc:
                log.warning("live stream of %s: reading it failed (%s)", feed.execution_id, exc)
                feed.stale()
                await asyncio.sleep(REREAD_AFTER)
                continue
            chunks = tracker.read(state)
        elif isinstance(got, list):
            chunks = [e for e in map(tracker.heard, got) if e]
        if chunks:
            yield b"".join(chunks)
            written = time.monotonic()
        elif time.monotonic() - written >= keepalive:
            yield b": keepalive\n\n"
            written = time.monotonic()


def refused(exc: TooManyStreams | StreamsUnavailable) -> JSONResponse:
    """429 (too many streams) or 503 (none can be served now), with when to try again."""
    return JSONResponse(
        Problem(detail=str(exc)).model_dump(),
        status_code=429 if isinstance(exc, TooManyStreams) else 503,
        headers={"Retry-After": str(RETRY_AFTER)},
    )


@asynccontextmanager
async def serving(service: Conveyor, settings: Settings) -> AsyncIterator[Streams]:
    """The process's streams, for the app's lifespan: on exit every stream ends."""
    url = service.db.engine.url
    hub: Hub
    if url.get_backend_name() == "postgresql":
        hub = ListenHub(url.set(drivername="postgresql").render_as_string(hide_password=False))
    else:
        hub = PolledHub(lambda ids: _read_many(service, ids))
    admission = Admission(settings.streams_per_tenant, settings.streams_per_process)
    poller = tenant_stream.Poller(
        lambda after: tenant_stream.read_events(service, after, None, tenant_stream.READ_MOST)
    )
    streams = Streams(hub, admission, settings.streams_keepalive, poller)
    await hub.start()
    await poller.start()
    try:
        yield streams
    finally:
        await streams.close()


def _read_many(service: Conveyor, execution_ids: list[uuid.UUID]) -> dict[uuid.UUID, State]:
    with service.db.transaction() as store:
        return store.live_states(execution_ids)


def _read(service: Conveyor, execution_id: uuid.UUID) -> State:
    with service.db.transaction() as store:
        return store.live_state(execution_id)
