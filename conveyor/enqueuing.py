"""Transactional enqueue: an application starts a workflow inside its own transaction.

    with Session(engine) as session, session.begin():
        session.add(Invoice(...))
        conveyor.enqueue(session, "send-invoice", {"invoice_id": 7})
    # committed: the execution exists and its message is sent; rolled back: neither

    with Session(engine) as session, session.begin():
        order.paid = True
        conveyor.send_event(session, "payment.confirmed", {"amount": 12}, key=order.id)
    # committed: the waits on that order's key resume; rolled back: they still wait

The execution and its start job are written with the caller's session (the same database
holds Conveyor's tables); the message is published only after that transaction commits, and
never if it rolls back. If the publish itself fails after the commit, the job stays queued and
the recovery sweep sends it.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from conveyor import tracing
from conveyor.engine import later, trigger_limits, triggering, waits
from conveyor.engine.ports import Dispatcher
from conveyor.engine.records import Dispatch
from conveyor.engine.states import Priority, TriggerSource
from conveyor.exceptions import StoreError
from conveyor.store import DEFAULT_TENANT, store_on
from conveyor.store.unit_of_work import older_snapshot

log = logging.getLogger("conveyor.enqueue")


def enqueue(
    session: Session,
    workflow: str,
    input: Any = None,
    *,
    tenant: str = DEFAULT_TENANT,
    priority: Priority | None = None,
    source: TriggerSource = TriggerSource.API,
    dedupe_key: str | None = None,
    dispatcher: Dispatcher | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
) -> uuid.UUID:
    """Create an execution in the caller's transaction; its id. With ``dedupe_key``, a
    pending or running execution with that key is returned instead of a new one. With
    ``run_at`` (an aware time) or ``delay`` (seconds) it starts then, waiting until then in
    the database (:class:`~conveyor.exceptions.StartTimeError` for a time refused).
    ``max_attempts`` and ``timeout`` (seconds a try) override the definition's for every node
    of this execution (:class:`~conveyor.exceptions.TriggerLimitError` out of bounds)."""
    now = datetime.now(UTC)
    begins = later.start_time(now, run_at=run_at, delay=delay)
    limits = trigger_limits.checked(max_attempts, timeout)
    with tracing.trigger_span(workflow, source.value) as trace:
        result = triggering.trigger(
            store_on(session),
            workflow_name=workflow,
            tenant=tenant,
            input=input,
            now=now,
            priority=priority,
            source=source,
            dedupe_key=dedupe_key,
            trace=trace,
            run_at=begins,
            limits=limits,
        )
        tracing.annotate(workflow=workflow, execution_id=str(result.execution_id))
    if result.dispatches:
        _pending(session, dispatcher).extend(result.dispatches)
    return result.execution_id


_KEY = "conveyor.pending"


def send_event(
    session: Session,
    event: str,
    payload: Any = None,
    *,
    key: str | None = None,
    tenant: str = DEFAULT_TENANT,
    keep_for: timedelta | None = None,
    dispatcher: Dispatcher | None = None,
) -> list[uuid.UUID]:
    """Send an application event in the caller's transaction: every workflow of the tenant
    subscribing to it is started and, with ``key``, every wait node waiting for (``event``,
    ``key``) is woken with ``payload`` as its output, and the event is kept (``keep_for``, else
    CONVEYOR_EVENT_RETENTION_SECONDS) for the waits that begin later. Committed, the work
    it made ready is published; rolled back, nothing happened. The executions it started."""
    _read_committed(session)
    now = datetime.now(UTC)
    keep = keep_for if keep_for is not None else _event_retention()
    with tracing.trigger_span(event, TriggerSource.EVENT.value) as trace:
        delivered = waits.deliver_event(
            store_on(session), tenant, event, payload, now, key=key, keep_for=keep, trace=trace
        )
    if delivered.dispatches:
        _pending(session, dispatcher).extend(delivered.dispatches)
    return [t.execution_id for t in delivered.started]


def _read_committed(session: Session) -> None:
    """An event finds the waits that began before it by reading them after it took their
    key's lock: a snapshot taken earlier in a REPEATABLE READ or SERIALIZABLE transaction
    would not show a wait committed meanwhile, and the event would miss it (as the wait had
    missed the event, not committed yet)."""
    level = older_snapshot(session)
    if level is not None:
        raise StoreError(
            f"conveyor.send_event needs a READ COMMITTED transaction, and this one is {level}: "
            "a wait that began after your transaction's snapshot would miss the event; send "
            "it in a READ COMMITTED transaction (PostgreSQL's default) or with "
            "Conveyor.send_event"
        )


def _event_retention() -> timedelta:
    from conveyor.config import get_settings

    return timedelta(seconds=get_settings().event_retention_seconds)


def _pending(session: Session, dispatcher: Dispatcher | None) -> list[Dispatch]:
    """The messages waiting for this session's commit; the first call hooks the session."""
    if _KEY not in session.info:
        session.info[_KEY] = []
        sender = dispatcher or _process_dispatcher()
        event.listen(session, "after_commit", lambda s: _send(s, sender))
        event.listen(session, "after_rollback", lambda s: s.info[_KEY].clear())
    pending: list[Dispatch] = session.info[_KEY]
    return pending


def _send(session: Session, dispatcher: Dispatcher) -> None:
    dispatches, session.info[_KEY] = session.info[_KEY], []
    if not dispatches:
        return
    try:
        dispatcher.publish(dispatches)
    except Exception:  # committed: the recovery sweep re-publishes queued jobs
        log.exception("publishing %d job(s) after commit failed", len(dispatches))


def _process_dispatcher() -> Dispatcher:
    from conveyor.wiring import dispatcher

    return dispatcher()
