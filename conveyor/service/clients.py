"""What applications call (through the API, the CLI or :func:`conveyor.enqueue`): apply a
definition, trigger, emit an event, receive a webhook, cancel."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor import nodes, tracing
from conveyor.engine import (
    cancellation,
    credentials,
    later,
    subscriptions,
    trigger_limits,
    triggering,
    validation,
    waits,
    workflows,
)
from conveyor.engine.definitions import Workflow
from conveyor.engine.records import DeliveryReceipt, TenantRef, WorkflowRecord
from conveyor.engine.states import Priority, TriggerSource
from conveyor.exceptions import (
    AuthError,
    DefinitionError,
    NotFound,
    ReplayedDelivery,
    SignatureError,
)
from conveyor.scheduler import schedules
from conveyor.service.base import ServiceBase, log, utcnow
from conveyor.store import DEFAULT_TENANT, SqlStore


@dataclass(frozen=True, kw_only=True)
class Submitted:
    """A trigger's answer: the execution, whether an earlier trigger made it, and what a
    deduplication key active on it did with the input (None: the key was not active)."""

    execution_id: uuid.UUID
    replayed: bool
    dedupe: str | None = None


class Clients(ServiceBase):
    """Applying, triggering and cancelling, each one or two transactions, published after
    commit."""

    def apply(
        self, workflow: Workflow, tenant: str = DEFAULT_TENANT
    ) -> tuple[WorkflowRecord, bool]:
        """Store the definition if it changed, and make its declared schedules match it.
        :class:`DefinitionError` when a python node's inputs do not fit the function
        registered in this process under its name (whoever built the definition: the API,
        the CLI or an application's own code); a function registered elsewhere only is
        checked when it runs."""
        if problems := validation.input_errors(workflow, nodes.function_parameters):
            raise DefinitionError(problems, f"workflow {workflow.name!r}")

        def work(store: SqlStore) -> tuple[WorkflowRecord, bool]:
            applied = workflows.apply_workflow(store, tenant, workflow, utcnow())
            schedules.sync_definition(store, tenant, workflow, utcnow())
            subscriptions.sync(store, tenant, workflow)
            return applied

        return self.db.run(work)

    def trigger(
        self,
        workflow: str,
        input: Any = None,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        source: TriggerSource = TriggerSource.API,
        run_at: datetime | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> uuid.UUID:
        """Start an execution; its start job is published once the row is committed. With
        ``run_at`` (aware) or ``delay`` (seconds), it waits, pending, until then.
        ``max_attempts`` and ``timeout`` (seconds a try) override the definition's for every
        node of this execution."""
        return self.start(
            workflow, input, tenant=tenant, priority=priority, source=source, run_at=run_at,
            delay=delay, max_attempts=max_attempts, timeout=timeout,
        )[0]  # fmt: skip

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        source: TriggerSource = TriggerSource.API,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """Like :meth:`trigger`; with an idempotency key the tenant used before, the
        execution it made is returned instead. (execution id, whether it was made before)."""
        made = self.submit(
            workflow, input, tenant=tenant, priority=priority, source=source,
            idempotency_key=idempotency_key, dedupe_key=dedupe_key, run_at=run_at, delay=delay,
            max_attempts=max_attempts, timeout=timeout,
        )  # fmt: skip
        return made.execution_id, made.replayed

    def submit(
        self,
        workflow: str,
        input: Any = None,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        source: TriggerSource = TriggerSource.API,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> Submitted:
        """Like :meth:`start`, saying what a deduplication key active on another execution
        did with the input (the workflow's dedupe policy): ``dedupe`` is
        ``"deduplicated"`` (the input dropped), ``"replaced"`` (the active execution, not
        started, runs with it) or ``"follow_up"`` (it runs once the active one finishes)."""
        now = utcnow()
        begins = later.start_time(now, run_at=run_at, delay=delay)
        limits = trigger_limits.checked(max_attempts, timeout)
        with tracing.trigger_span(workflow, source.value) as trace:
            # Its writes are one statement each (PostgreSQL): no transaction round trips.
            result = self.db.autocommit(
                lambda s: triggering.trigger(
                    s,
                    workflow_name=workflow,
                    tenant=tenant,
                    input=input,
                    priority=priority,
                    source=source,
                    now=now,
                    idempotency_key=idempotency_key,
                    dedupe_key=dedupe_key,
                    trace=trace,
                    run_at=begins,
                    limits=limits,
                )
            )
            tracing.annotate(
                workflow=workflow, execution_id=str(result.execution_id), replayed=result.replayed
            )
            self._publish_now(result.dispatches, f"execution {result.execution_id}")
        dedupe = result.dedupe.value if result.dedupe else None
        return Submitted(execution_id=result.execution_id, replayed=result.replayed, dedupe=dedupe)

    def emit(
        self,
        tenant: str,
        event_type: str,
        payload: Any,
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> list[uuid.UUID]:
        """Start every workflow of the tenant that subscribes to the event type (at ``run_at``
        or after ``delay`` seconds when given: they wait, pending, until then)."""
        now = utcnow()
        begins = later.start_time(now, run_at=run_at, delay=delay)
        with tracing.trigger_span(event_type, TriggerSource.EVENT.value) as trace:
            started = self.db.run(
                lambda s: subscriptions.emit_event(
                    s, tenant, event_type, payload, now, trace, run_at=begins
                )
            )
            self._publish_now([d for t in started for d in t.dispatches], "the event's executions")
        return [t.execution_id for t in started]

    def send_event(
        self,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
        tenant: str = DEFAULT_TENANT,
        keep_for: timedelta | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> waits.Delivered:
        """One application event: every workflow of the tenant subscribing to it started
        (at ``run_at`` or after ``delay`` seconds when given) and, with ``key``, every wait
        node waiting for (``event``, ``key``) woken at once with ``payload`` as its output,
        the event kept (``keep_for``, else CONVEYOR_EVENT_RETENTION_SECONDS) for the waits
        that begin later. Published after commit."""
        now = utcnow()
        begins = later.start_time(now, run_at=run_at, delay=delay)
        keep = keep_for if keep_for is not None else self.event_retention
        with tracing.trigger_span(event, TriggerSource.EVENT.value) as trace:
            delivered = self.db.run(
                lambda s: waits.deliver_event(
                    s,
                    tenant,
                    event,
                    payload,
                    now,
                    key=key,
                    keep_for=keep,
                    trace=trace,
                    run_at=begins,
                )
            )
            self._forget(delivered.after.forget)
            self._publish_now(delivered.dispatches, f"event {event!r}'s work")
        return delivered

    def authenticate(self, key: str) -> TenantRef:
        """The tenant an API key acts for, or :class:`AuthError`."""
        prefix = credentials.key_prefix(key)
        with self.db.transaction() as store:
            found = store.api_key(prefix)
        if found is None or not credentials.key_matches(key, found[0]):
            raise AuthError()
        return found[1]

    def receive_webhook(
        self, endpoint_id: uuid.UUID, body: bytes, headers: Mapping[str, str]
    ) -> DeliveryReceipt:
        """Verify and store a delivery, then hand it to the webhook worker; its receipt.

        A bad signature stores nothing but a count on the endpoint (and a log line without
        the body); a delivery id the endpoint received before starts nothing again and is
        answered with the first one's receipt (``repeated``); a GitHub body it received
        within ``replay_window`` under another delivery id is a :class:`ReplayedDelivery`.
        """
        with self.db.transaction() as store:
            endpoint = store.endpoint(endpoint_id)
        if endpoint is None:
            raise NotFound(f"no webhook endpoint has id {endpoint_id}")
        try:
            verified = credentials.verify(endpoint.scheme, endpoint.secret, body, headers)
        except SignatureError as exc:
            self.db.run(lambda s: s.count_rejected(endpoint.id))
            log.warning("webhook to endpoint %s refused: %s", endpoint.name, exc)
            raise
        with tracing.trigger_span(f"webhook {endpoint.name}", TriggerSource.WEBHOOK.value) as trace:
            try:
                stored = self.db.run(
                    lambda s: subscriptions.store_delivery(
                        s, endpoint, verified, utcnow(), self.replay_window, trace
                    )
                )
            except ReplayedDelivery as exc:
                log.warning("webhook to endpoint %s refused: %s", endpoint.name, exc)
                raise
            tracing.annotate(delivery=str(stored.id), repeated=stored.repeated)
            if not stored.repeated:
                self._publish_now(
                    [subscriptions.delivery_dispatch(stored.id)], f"delivery {stored.id}"
                )
        return stored

    def cancel(self, execution_id: uuid.UUID) -> None:
        """Cancel the execution and its children; a child's parent node fails (not retried),
        and what that makes ready is published."""
        stopped = self.db.run(lambda s: cancellation.cancel_execution(s, execution_id, utcnow()))
        if stopped.dispatches:
            self._publish_now(stopped.dispatches, f"what cancelling {execution_id} made ready")
        self._forget(stopped.forget)
        if stopped.more:  # a tree wider than a transaction's share: the rest, a share each
            self._stop_orphans()
