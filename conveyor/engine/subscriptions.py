"""Application events and webhook deliveries that start workflows: one transaction each, like
:mod:`conveyor.engine.triggering`. The caller publishes the returned dispatches after commit.

A workflow subscribes in its definition (``events:`` and ``webhooks:``); applying it rewrites
its rows in ``subscriptions``, so finding the workflows an event starts is one indexed read.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from conveyor.engine import triggering
from conveyor.engine.credentials import Verified
from conveyor.engine.definitions import Workflow
from conveyor.engine.ports import Store
from conveyor.engine.queues import QUEUE_FOR_KIND
from conveyor.engine.records import (
    DeliveryReceipt,
    DeliveryRecord,
    Dispatch,
    EndpointRecord,
    TraceContext,
)
from conveyor.engine.states import (
    DeliveryStatus,
    JobKind,
    Priority,
    SubscriptionKind,
    TriggerSource,
)
from conveyor.exceptions import ConveyorError, ReplayedDelivery

log = logging.getLogger("conveyor.subscriptions")


def sync(store: Store, tenant: str, workflow: Workflow) -> None:
    """Make the workflow's subscriptions those its definition declares."""
    tenant_id = store.tenant_id(tenant)
    known = {e.name for e in store.endpoints(tenant_id)}
    missing = sorted({w.endpoint for w in workflow.webhooks} - known)
    if missing:
        raise ConveyorError(
            f"workflow {workflow.name!r} listens to webhook endpoint(s) {', '.join(missing)} "
            f"that tenant {tenant!r} does not have; create each with "
            f"`conveyor webhooks create NAME --tenant {tenant}`"
        )
    rows: list[tuple[SubscriptionKind, str, list[str]]] = [
        (SubscriptionKind.EVENT, e, []) for e in dict.fromkeys(workflow.events)
    ]
    rows += [(SubscriptionKind.WEBHOOK, w.endpoint, list(w.events)) for w in workflow.webhooks]
    store.replace_subscriptions(tenant_id, workflow.name, rows)


def emit_event(
    store: Store,
    tenant: str,
    event_type: str,
    payload: Any,
    now: datetime,
    trace: TraceContext | None = None,
    run_at: datetime | None = None,
) -> list[triggering.Triggered]:
    """Start every workflow of the tenant that subscribes to the event type (their tries
    join ``trace``); at ``run_at`` when given (see :mod:`conveyor.engine.later`)."""
    rows = store.subscribers(store.tenant_id(tenant), SubscriptionKind.EVENT, event_type)
    # once a workflow, even if two applies racing left its subscription twice
    return [
        triggering.trigger(
            store,
            workflow_name=name,
            tenant=tenant,
            input={"event": event_type, "payload": payload},
            now=now,
            source=TriggerSource.EVENT,
            trace=trace,
            run_at=run_at,
        )
        for name in sorted({name for name, _ in rows})
    ]


def store_delivery(
    store: Store,
    endpoint: EndpointRecord,
    verified: Verified,
    now: datetime,
    replay_window: timedelta,
    trace: TraceContext | None = None,
) -> DeliveryReceipt:
    """Store a verified delivery for the webhook worker; its receipt. A delivery id the
    endpoint received before is a sender's retry (Standard Webhooks and GitHub retry on
    anything but a 2xx): nothing is stored or started, and the receipt is the first one's
    (``repeated``). A body whose signature the endpoint noted within ``replay_window``
    (GitHub's, which covers the body only) under another delivery id is a
    :class:`ReplayedDelivery`. Both are decided by unique keys, in this transaction: of two
    concurrent equal deliveries, one is stored."""
    stored = store.add_delivery(
        endpoint, verified.delivery_id, verified.event, verified.payload, now, trace
    )
    if stored is None:
        first = store.stored_delivery(endpoint.id, verified.delivery_id)
        assert first is not None  # the endpoint's key refused this delivery id
        return first
    if verified.signature is not None and not store.note_signature(
        endpoint.id, verified.signature, now, replay_window
    ):
        raise ReplayedDelivery()  # the transaction is rolled back: the delivery too
    return DeliveryReceipt(id=stored, status=DeliveryStatus.RECEIVED, executions=(), repeated=False)


def delivery_dispatch(delivery_id: uuid.UUID) -> Dispatch:
    """The message that hands a stored delivery to the webhook worker (high priority)."""
    return Dispatch(
        job_id=delivery_id,
        kind=JobKind.WEBHOOK,
        queue=QUEUE_FOR_KIND[JobKind.WEBHOOK],
        priority=Priority.HIGH,
        label=f"delivery={delivery_id}",
    )


def deliver_webhook(
    store: Store, delivery_id: uuid.UUID, now: datetime
) -> list[triggering.Triggered]:
    """Start the workflows a stored delivery matches, once: the delivery row is locked and
    marked handled in the same transaction (their tries join the trace it was received in)."""
    delivery = store.claim_delivery(delivery_id)
    if delivery is None:
        return []  # handled already (a duplicate message), or no such delivery
    return start_delivery(store, delivery, now)


def start_delivery(
    store: Store, delivery: DeliveryRecord, now: datetime, sent: bool = False
) -> list[triggering.Triggered]:
    """Start the workflows a claimed delivery matches and mark it handled: processed when it
    started one or was ``sent`` as an event for waits (kept for those not begun yet), else
    unmatched."""
    names = sorted(
        {
            name
            for name, events in store.subscribers(
                delivery.tenant_id, SubscriptionKind.WEBHOOK, delivery.endpoint_name
            )
            if not events or delivery.event in events
        }
    )
    started = [
        triggering.trigger(
            store,
            workflow_name=name,
            tenant=delivery.tenant_name,
            input={
                "event": delivery.event,
                "delivery_id": delivery.delivery_id,
                "payload": delivery.payload,
            },
            now=now,
            source=TriggerSource.WEBHOOK,
            trace=delivery.trace,
        )
        for name in names
    ]
    status = DeliveryStatus.PROCESSED if started or sent else DeliveryStatus.UNMATCHED
    store.finish_delivery(delivery.id, status, [t.execution_id for t in started], now)
    if status is DeliveryStatus.UNMATCHED:
        log.info(
            "webhook delivery %s to endpoint %s (event %s) matched no workflow and no wait",
            delivery.delivery_id,
            delivery.endpoint_name,
            delivery.event,
        )
    return started
