"""What applications read, each call scoped to one tenant as the REST API's are: one execution
(the API's view of it), the executions found by filters page by page, the status view, and a
tenant's stream of status changes, the same rows ``GET /v1/stream`` sends."""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from conveyor import views
from conveyor.engine.states import ExecutionStatus, NodeStatus
from conveyor.exceptions import ExecutionNotFound, InvalidQuery
from conveyor.service.base import ServiceBase
from conveyor.store import DEFAULT_TENANT, SqlStore
from conveyor.store.listing import ExecutionFilter

# An event's cursor: on PostgreSQL (its transaction's id, its row's id), on SQLite (0, row id)
Cursor = tuple[int, int]
Found = tuple[Cursor, uuid.UUID, dict[str, Any]]  # (cursor, tenant id, what a stream sends)

STREAM_POLL = 0.5  # seconds between a stream's reads while it has caught up
STREAM_READ_MOST = 1000  # events one read takes
LIST_MOST = 1000  # executions a page holds at most (as the API's)

E = TypeVar("E", ExecutionStatus, NodeStatus)


def cursor_of(event_id: str, given_as: str = "Last-Event-ID") -> Cursor:
    """The cursor an event id names (:class:`InvalidQuery`, a ValueError, naming the problem
    and the form, for one that is none)."""
    txid, _, row = event_id.strip().partition("-")
    numbers = txid.isascii() and txid.isdigit() and row.isascii() and row.isdigit()
    if not (numbers and max(int(txid), int(row)) < 2**63):
        raise InvalidQuery(
            f"{given_as} {event_id[:80]!r} is not an event id of this stream (two numbers "
            f"joined by '-', as each event's id: line gives); send the id of the last event "
            f"received, or none to start from now"
        )
    return (int(txid), int(row))


def event_id(cursor: Cursor) -> str:
    return f"{cursor[0]}-{cursor[1]}"


@dataclass(frozen=True, kw_only=True)
class TenantEvent:
    """One event of a tenant's stream, as ``GET /v1/stream`` sends it."""

    id: str  # its cursor, "<txid>-<row id>": give it as ``after`` to resume after it
    kind: str  # "execution": an execution's status changed
    data: dict[str, Any]  # execution_id, workflow, version, status, dedupe_key, at


class Reads(ServiceBase):
    """Executions read for one tenant: another tenant's execution is not found, exactly as
    an id that does not exist; an unknown tenant is a
    :class:`~conveyor.exceptions.TenantNotFound`."""

    def execution(
        self, execution_id: uuid.UUID | str, *, tenant: str = DEFAULT_TENANT
    ) -> views.ExecutionJson:
        """One execution as ``GET /v1/executions/{id}`` shows it: its nodes with outputs and
        errors, its jobs with every attempt, the follow-up left on it."""
        wanted = _execution_id(execution_id)
        with self.db.transaction() as store:
            _owned(store, tenant, wanted)
            return views.execution_view(store, wanted)

    def execution_status(
        self, execution_id: uuid.UUID | str, *, tenant: str = DEFAULT_TENANT
    ) -> ExecutionStatus:
        """An execution's status alone: one row read, where :meth:`execution` reads its
        nodes, jobs and tries (what a client's wait polls). ExecutionNotFound as there."""
        wanted = _execution_id(execution_id)
        with self.db.transaction() as store:
            _owned(store, tenant, wanted)
            status = store.execution_status(wanted)
        if status is None:  # removed by the retention sweep since
            raise ExecutionNotFound(f"tenant {tenant!r} has no execution with id {wanted}")
        return status

    def executions(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        status: ExecutionStatus | str | None = None,
        workflow: str | None = None,
        node_status: NodeStatus | str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        dedupe_key: str | None = None,
        idempotency_key: str | None = None,
        after: uuid.UUID | str | None = None,
        limit: int = 50,
    ) -> list[views.ExecutionSummaryJson]:
        """The tenant's executions, newest first, narrowed by the filters given (as
        ``GET /v1/executions``; a time without an offset is UTC). To page on, pass the last id
        of a page as ``after``: executions created meanwhile neither repeat nor shift rows."""
        if not 1 <= limit <= LIST_MOST:
            raise InvalidQuery(f"limit {limit} is out of bounds: give 1 to {LIST_MOST}")
        where = _filter(
            status, workflow, node_status, created_after, created_before, dedupe_key,
            idempotency_key,
        )  # fmt: skip
        last = _execution_id(after) if after is not None else None
        with self.db.transaction() as store:
            rows = store.list_executions(
                store.tenant_id(tenant), where=where, after=last, limit=limit
            )
            return [views.execution_summary(e, name, version) for e, name, version in rows]

    def status_counts(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        status: ExecutionStatus | str | None = None,
        workflow: str | None = None,
        node_status: NodeStatus | str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> list[views.StatusCountJson]:
        """The status view (``GET /v1/executions/summary``): the tenant's executions counted
        by workflow and status, with the oldest and newest and the average tries each."""
        where = _filter(status, workflow, node_status, created_after, created_before)
        with self.db.transaction() as store:
            counts = store.status_counts(store.tenant_id(tenant), where)
            return [views.status_count_json(c) for c in counts]

    def stream(
        self,
        tenant: str = DEFAULT_TENANT,
        *,
        workflow: str | None = None,
        dedupe_key: str | None = None,
        after: str | None = None,
        poll: float = STREAM_POLL,
    ) -> Generator[TenantEvent, None, None]:
        """Each change of the status of the tenant's executions from now on (those triggered
        later included), one workflow's or one dedupe key's if given, in order: the events
        ``GET /v1/stream`` sends. With ``after`` (an event's id), every event since it first,
        however many. It reads every ``poll`` seconds while it has caught up, each read a
        short transaction (no connection held between), and goes on until the caller stops
        iterating (or the database stays unreachable past a read's retries: its error is
        raised; resume with ``after``). The tenant and ``after`` are checked here, before
        the first event."""
        start = cursor_of(after, "after") if after is not None else None
        with self.db.transaction() as store:
            tenant_id = store.tenant_id(tenant)
            if start is None:
                start = store.stream_horizon()  # now: what happens from here on is sent
        return self._follow(start, tenant_id, workflow, dedupe_key, poll)

    def _follow(
        self,
        cursor: Cursor,
        tenant_id: uuid.UUID,
        workflow: str | None,
        dedupe_key: str | None,
        poll: float,
    ) -> Generator[TenantEvent, None, None]:
        while True:
            found, cursor = self.events_after(
                cursor, STREAM_READ_MOST, tenant_id=tenant_id, workflow=workflow,
                dedupe_key=dedupe_key,
            )  # fmt: skip
            for at, _, data in found:
                yield TenantEvent(id=event_id(at), kind="execution", data=data)
            if len(found) < STREAM_READ_MOST:
                time.sleep(poll)

    def events_after(
        self,
        after: Cursor | None,
        limit: int,
        *,
        tenant_id: uuid.UUID | None = None,
        workflow: str | None = None,
        dedupe_key: str | None = None,
    ) -> tuple[list[Found], Cursor]:
        """Up to ``limit`` events after the cursor ``after`` (every tenant's unless one is
        given), and the cursor to read on from; with ``after`` None, none, only where now
        is. The one read of the tenant streams: :meth:`stream`'s and the API's. Read again
        on a lost connection or a locked SQLite (it changes nothing)."""

        def read(store: SqlStore) -> tuple[list[Found], Cursor]:
            if after is None:
                return [], store.stream_horizon()
            return store.stream_events(
                after, limit=limit, tenant_id=tenant_id, workflow=workflow, dedupe_key=dedupe_key
            )

        return self.db.run(read)


def _owned(store: SqlStore, tenant: str, execution_id: uuid.UUID) -> None:
    """ExecutionNotFound unless the tenant owns the execution."""
    if not store.owns_execution(store.tenant_id(tenant), execution_id):
        raise ExecutionNotFound(
            f"tenant {tenant!r} has no execution with id {execution_id}; list them with "
            f"Conveyor.executions(tenant={tenant!r})"
        )


def _execution_id(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidQuery(
            f"{value!r} is not an execution id (a UUID, as a trigger returns)"
        ) from None


def _filter(
    status: ExecutionStatus | str | None,
    workflow: str | None,
    node_status: NodeStatus | str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    dedupe_key: str | None = None,
    idempotency_key: str | None = None,
) -> ExecutionFilter:
    return ExecutionFilter(
        status=_member(ExecutionStatus, status, "status"),
        workflow=workflow,
        node_status=_member(NodeStatus, node_status, "node_status"),
        created_after=_aware(created_after),
        created_before=_aware(created_before),
        dedupe_key=dedupe_key,
        idempotency_key=idempotency_key,
    )


def _member(kind: type[E], value: E | str | None, name: str) -> E | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise InvalidQuery(f"{name} {value!r} is none of {choices}") from None


def _aware(value: datetime | None) -> datetime | None:
    """A time without an offset is taken as UTC, as every time Conveyor shows is."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
