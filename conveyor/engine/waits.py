"""Wait nodes: a try that waits, holding no worker slot and no permit, for an application event
whose name and correlation key match, then ends with the event's payload as its output.

A wait node's try is claimed as any node's. Then one transaction (:func:`begin_wait`) renders
its key and timeout and either takes an event kept for it (one of the tenant's events of that
name and key that arrived since its execution started, the earliest) and completes the node
with its payload, or leaves the job ``waiting_event`` and its node ``waiting`` with a row in
``waits``. An event (:func:`send_event`) is kept for the waits that begin later (until its
retention ends) and wakes, in its own transaction, every wait on its (tenant, name, key)
that waits now: one event may wake many waits, and a wait wakes once (the first event to
resume its job wins; a later one finds no wait). A wait whose timeout has come is settled by
the duty thread (:func:`expire_waits`): its node takes its ``on_timeout`` branch, or fails.

No lost wake-up: a wait's start and an event's arrival both take the lock of their
correlation (:meth:`~conveyor.engine.ports.Waits.lock_correlation`) before they look for the
other, so whichever comes second sees what the first committed, on PostgreSQL under READ
COMMITTED (each statement reads what was committed when it began, after the lock was taken)
and on SQLite (its transactions take turns). Everything lives in the database: a worker's
crash or restart loses no wait and no event.
"""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.engine import bounds, node_types, subscriptions, templates
from conveyor.engine.claiming import NodeRun
from conveyor.engine.definitions import Node
from conveyor.engine.failure import Failed, fail_node
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    AfterCommit,
    DeliveryRecord,
    Dispatch,
    EventRecord,
    TraceContext,
    WaitRecord,
)
from conveyor.engine.states import JobStatus, NodeStatus
from conveyor.engine.success import complete_node
from conveyor.engine.triggering import Triggered
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    ConveyorError,
    NodeCancelled,
    NonRetryableError,
    WaitTimedOut,
)
from conveyor.ids import new_id

log = logging.getLogger("conveyor.waits")

# How long an event is kept for the waits that begin after it when the setting is not given
# (CONVEYOR_EVENT_RETENTION_SECONDS): a week.
DEFAULT_RETENTION = timedelta(days=7)
# The name of the events that record approvals' decisions (their key: the approval's id, its
# job's), which no application may send.
APPROVAL_EVENT = "conveyor.approval"
# The largest name and key an event may have (their columns').
MAX_NAME = 200
MAX_KEY = 200


@dataclass(frozen=True, kw_only=True)
class Began:
    """What a wait node's try came to: it waits (``waiting``), took a kept event and
    completed (``woke``), or failed before it could wait (``failed``, with the ``error``: its
    key or timeout did not render, or its execution stopped). None of them: the try was
    reclaimed meanwhile, and nothing was done."""

    after: AfterCommit
    waiting: bool = False
    woke: bool = False
    failed: Failed | None = None
    error: ConveyorError | None = None


@dataclass(frozen=True, kw_only=True)
class Sent:
    """What an event did: the waits it woke (their job ids, and their executions), and what
    is left to do after commit (their successors' messages)."""

    woke: list[uuid.UUID]
    after: AfterCommit
    executions: list[uuid.UUID] = field(default_factory=list)


def begin_wait(
    store: Store, run: NodeRun, now: datetime, rng: random.Random | None = None
) -> Began:
    """The claimed try of a wait node, in one transaction: its node completed with a kept
    event's payload, or its job ``waiting_event`` (while try ``run.job.try_number`` is
    current) with its wait row. A key or timeout that does not render fails the try, not
    retried; an execution that finished before this transaction took its row lock ends the
    try cancelled."""
    try:
        event, key = waits_for(run)
        timeout_at = timeout_of(run.node, run.context, now)
    except ConveyorError as exc:
        failed = fail_node(store, run, exc, now, 0.0, rng)
        return Began(after=failed.after, failed=failed, error=exc)
    tenant_id = run.execution.tenant_id
    store.lock_correlation(tenant_id, event, key)  # first, as an event's arrival takes it
    status = store.execution_status(run.execution.id, lock=True)
    if status is None or status.finished:
        ended = status.value if status is not None else "deleted"
        stopped = NodeCancelled(f"its execution was {ended} before the wait began")
        failed = fail_node(store, run, stopped, now, 0.0, rng)
        return Began(after=failed.after, failed=failed, error=stopped)
    # A decision is never made before its approval waits: it has no kept event to take.
    asks = node_types.asks_a_person(run.node)
    kept = None
    if not asks:
        since = run.execution.created_at
        kept = store.first_event(tenant_id, event, key, since, now, execution_id=run.execution.id)
    if kept is not None:
        after = complete_node(store, run, kept.payload, now, 0.0, branch="on_event")
        return Began(after=after, woke=True)
    job = run.job
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.WAITING_EVENT, try_number=job.try_number
    ):
        return Began(after=AfterCommit())  # reclaimed meanwhile: its next try waits
    store.set_node(run.execution.id, run.node.id, NodeStatus.WAITING)
    store.add_wait(
        WaitRecord(
            job_id=job.id,
            try_number=job.try_number,
            tenant_id=tenant_id,
            execution_id=run.execution.id,
            node_id=run.node.id,
            event=event,
            key=key,
            since=run.execution.created_at,
            timeout_at=timeout_at,
            created_at=now,
        )
    )
    return Began(after=AfterCommit(), waiting=True)


def send_event(
    store: Store,
    tenant_id: uuid.UUID,
    event: str,
    key: str,
    payload: Any,
    now: datetime,
    keep_for: timedelta = DEFAULT_RETENTION,
) -> Sent:
    """An application event, in the caller's transaction: kept for ``keep_for`` for the waits
    that begin later, and every wait on (tenant, ``event``, ``key``) waiting now woken, its
    node completed with ``payload``. Waits of other tenants never match."""
    check_event(event, key)
    store.lock_correlation(tenant_id, event, key)
    store.add_event(
        EventRecord(
            id=new_id(),
            tenant_id=tenant_id,
            name=event,
            key=key,
            payload=payload,
            created_at=now,
            expires_at=now + keep_for,
        )
    )
    woke, executions, after = [], [], AfterCommit()
    for wait in store.waits_for(tenant_id, event, key):
        run = resume(store, wait)
        if run is None:
            continue  # woken already, timed out, or stopped with its execution
        woke.append(wait.job_id)
        executions.append(wait.execution_id)
        after += complete_node(store, run, payload, now, waited_for(wait, now), branch="on_event")
    return Sent(woke=woke, after=after, executions=executions)


@dataclass(frozen=True, kw_only=True)
class Delivered:
    """What one application event did: the executions its subscriptions started, and the
    waits it woke (their jobs and executions; none without a key)."""

    started: list[Triggered]
    woke: list[uuid.UUID]
    after: AfterCommit
    woke_executions: list[uuid.UUID] = field(default_factory=list)

    @property
    def dispatches(self) -> list[Dispatch]:
        return [d for t in self.started for d in t.dispatches] + self.after.dispatches


def deliver_event(
    store: Store,
    tenant: str,
    event: str,
    payload: Any,
    now: datetime,
    *,
    key: str | None = None,
    keep_for: timedelta = DEFAULT_RETENTION,
    trace: TraceContext | None = None,
    run_at: datetime | None = None,
) -> Delivered:
    """One application event, in one transaction: every workflow of the tenant subscribing to
    it started (:func:`~conveyor.engine.subscriptions.emit_event`) and, with a ``key``, the
    waits on it woken and the event kept for those that begin later (:func:`send_event`)."""
    if key is not None:
        check_event(event, key)
    started = subscriptions.emit_event(store, tenant, event, payload, now, trace, run_at=run_at)
    if key is None:
        return Delivered(started=started, woke=[], after=AfterCommit())
    sent = send_event(store, store.tenant_id(tenant), event, key, payload, now, keep_for)
    return Delivered(
        started=started, woke=sent.woke, after=sent.after, woke_executions=sent.executions
    )


def deliver_webhook(
    store: Store, delivery_id: uuid.UUID, now: datetime, keep_for: timedelta = DEFAULT_RETENTION
) -> Delivered:
    """A stored webhook delivery handled, once, in one transaction: when its endpoint wakes
    waits (:func:`wake_by_delivery`) sent as an application event, then the workflows it
    matches started (:func:`~conveyor.engine.subscriptions.start_delivery`)."""
    delivery = store.claim_delivery(delivery_id)
    if delivery is None:  # handled already (a duplicate message), or no such delivery
        return Delivered(started=[], woke=[], after=AfterCommit())
    sent = wake_by_delivery(store, delivery, now, keep_for)
    started = subscriptions.start_delivery(store, delivery, now, sent=sent is not None)
    if sent is None:
        return Delivered(started=started, woke=[], after=AfterCommit())
    return Delivered(
        started=started, woke=sent.woke, after=sent.after, woke_executions=sent.executions
    )


def wake_by_delivery(
    store: Store, delivery: DeliveryRecord, now: datetime, keep_for: timedelta
) -> Sent | None:
    """A delivery to an endpoint that wakes waits, sent as the application event its
    endpoint names (``wakes_event`` rendered, else the delivery's type) under the key its
    ``wakes_key`` renders over the delivery (``event``, ``payload``, ``delivery_id``), its
    payload the delivery's. None when the endpoint wakes none, or when the delivery gives no
    name or key (it is only logged: the sender has nothing to fix by retrying)."""
    if delivery.wakes_key is None:
        return None
    scope = {"event": delivery.event, "payload": delivery.payload,
             "delivery_id": delivery.delivery_id}  # fmt: skip
    try:
        name = _text(templates.render_value(delivery.wakes_event or "{{ event }}", scope))
        key = _text(templates.render_value(delivery.wakes_key, scope))
        check_event(name, key)
    except ConveyorError as exc:
        log.info(
            "webhook delivery %s to endpoint %s wakes no wait: %s",
            delivery.delivery_id, delivery.endpoint_name, exc,
        )  # fmt: skip
        return None
    return send_event(store, delivery.tenant_id, name, key, delivery.payload, now, keep_for)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def expire_waits(store: Store, now: datetime, limit: int) -> tuple[int, AfterCommit]:
    """Up to ``limit`` waits whose timeout has come, settled in this transaction: the node
    completes on its ``on_timeout`` branch (its output says it timed out) when it names one,
    else fails (:class:`~conveyor.exceptions.WaitTimedOut`, not retried). How many, and what
    is left to do after commit."""
    settled, after = 0, AfterCommit()
    for wait in store.due_waits(now, limit):
        run = resume(store, wait)
        if run is None:
            continue
        settled += 1
        waited = waited_for(wait, now)
        if "on_timeout" in run.node.config:
            output = {"timed_out": True, "event": wait.event, "key": wait.key}
            after += complete_node(store, run, output, now, waited, branch="on_timeout")
            continue
        timed_out = WaitTimedOut(
            f"wait node {wait.node_id!r} timed out after {waited:g} s without event "
            f"{wait.event!r} for key {wait.key!r}; send it sooner, raise config.timeout, or "
            f"name nodes under config.on_timeout to go on without it"
        )
        after += fail_node(store, run, timed_out, now, waited).after
    return settled, after


def resume(store: Store, wait: WaitRecord) -> NodeRun | None:
    """The waiting try as a running one, its outcome to be recorded next (None: it no longer
    waits). The wait's row goes first, then the job: the order the timeout's sweep locks them
    in too."""
    store.end_wait(wait.job_id)
    job = store.resume_waiting(wait.job_id, wait.try_number, JobStatus.WAITING_EVENT)
    if job is None:
        return None
    execution = store.execution(wait.execution_id)
    workflow, _ = load_workflow(store, execution.workflow_id)
    return NodeRun(
        job=job, execution=execution, workflow=workflow, node=workflow.node(wait.node_id),
        context={},
    )  # fmt: skip


def waited_for(wait: WaitRecord, now: datetime) -> float:
    return max(0.0, (now - wait.created_at).total_seconds())


def check_event(event: str, key: str) -> None:
    """:class:`ConveyorError` naming the fix for an event name or key no wait can match."""
    if not event or len(event) > MAX_NAME:
        raise ConveyorError(f"an event's name must have 1 to {MAX_NAME} characters")
    if event == APPROVAL_EVENT:
        raise ConveyorError(
            f"{APPROVAL_EVENT!r} is the name Conveyor records approvals' decisions under; "
            f"decide an approval with `conveyor approvals approve|reject ID` or "
            f"POST /v1/approvals/ID/approve|reject, or send an event of another name"
        )
    if not key or len(key) > MAX_KEY:
        raise ConveyorError(
            f"an event's key must have 1 to {MAX_KEY} characters (the value a wait node's "
            f"config.key renders to, e.g. the order id)"
        )


def waits_for(run: NodeRun) -> tuple[str, str]:
    """The (event name, key) ``run``'s wait waits for: its config's for a wait node; for an
    approval, its decision's, keyed by its job's id (the approval's id)."""
    if node_types.asks_a_person(run.node):
        return APPROVAL_EVENT, str(run.job.id)
    return run.node.config["event"], wait_key(run.node, run.context)


def wait_key(node: Node, context: dict[str, Any]) -> str:
    """The correlation key ``node`` waits for, rendered from its config."""
    value = templates.render_value(node.config["key"], context)
    key = value if isinstance(value, str) else "" if value is None else str(value)
    if not key or len(key) > MAX_KEY:
        raise NonRetryableError(
            f"wait node {node.id!r}: config.key rendered to {bounds.shown(value)}; it must "
            f"give 1 to {MAX_KEY} characters (e.g. the order id this execution waits for)"
        )
    return key


def timeout_of(node: Node, context: dict[str, Any], now: datetime) -> datetime | None:
    """When ``node`` stops waiting: ``now`` plus its ``timeout`` in seconds, or the time its
    template gives (ISO 8601; without an offset, UTC). None: it waits until its event."""
    timeout = node.config.get("timeout")
    if timeout is None:
        return None
    value = templates.render_value(timeout, context)
    fix = "config.timeout must give a number of seconds, or an ISO 8601 time"
    if isinstance(value, str):
        try:
            seconds: float = float(value)
        except ValueError:
            try:
                at = datetime.fromisoformat(value)
            except ValueError as exc:
                raise NonRetryableError(f"{bounds.shown(value)} is neither; {fix}") from exc
            return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise NonRetryableError(f"wait timeout {bounds.shown(value)} is not a time; {fix}")
    if problem := bounds.delay_problem(seconds):
        raise NonRetryableError(f"wait timeout: {problem}; {fix}")
    return now + timedelta(seconds=seconds)
