"""The SQL of API keys, webhook endpoints and deliveries, and workflow subscriptions (part of
:class:`SqlStore`). Every read an API call makes is filtered by its tenant here."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from conveyor.engine.records import (
    DeliveryReceipt,
    DeliveryRecord,
    EndpointRecord,
    TenantRef,
    TraceContext,
)
from conveyor.engine.states import DeliveryStatus, JobStatus, SignatureScheme, SubscriptionKind
from conveyor.exceptions import ConveyorError
from conveyor.models import (
    ApiKey,
    Execution,
    Job,
    Subscription,
    Tenant,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSignature,
    WorkflowVersion,
)
from conveyor.store.rows import endpoint_record, trace_context
from conveyor.store.session import upsert


class AccessQueries:
    session: Session

    # -- API keys ---------------------------------------------------------------------------

    def add_api_key(
        self, tenant_id: uuid.UUID, name: str, prefix: str, digest: str, now: datetime,
        *, operator: bool = False,
    ) -> uuid.UUID:  # fmt: skip
        key_id = uuid.uuid4()
        self.session.execute(
            insert(ApiKey).values(
                id=key_id, tenant_id=tenant_id, name=name, prefix=prefix, digest=digest,
                created_at=now, operator=operator,
            )
        )  # fmt: skip
        return key_id

    def api_key(self, prefix: str) -> tuple[str, TenantRef] | None:
        """The digest of the live key with that prefix and its tenant (with the key's name);
        None if there is none or it was revoked."""
        row = self.session.execute(
            select(ApiKey.digest, ApiKey.name.label("key"), ApiKey.operator, Tenant.id, Tenant.name)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        ).one_or_none()
        if row is None:
            return None
        return row.digest, TenantRef(id=row.id, name=row.name, key=row.key, operator=row.operator)

    def session_key(self, prefix: str) -> tuple[TenantRef, str | None] | None:
        """The live key with that prefix (its tenant, with the key's name) and the secret its
        dashboard sessions are signed with (None: signed out); None if revoked or unknown."""
        row = self.session.execute(
            select(ApiKey.name.label("key"), ApiKey.operator, ApiKey.session_secret, Tenant.id,
                   Tenant.name)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        ).one_or_none()  # fmt: skip
        if row is None:
            return None
        tenant = TenantRef(id=row.id, name=row.name, key=row.key, operator=row.operator)
        return tenant, row.session_secret

    def open_sessions(self, prefix: str, fresh: str) -> str:
        """The session secret of the key with that prefix: its own, or ``fresh`` when it has
        none (its first sign-in, or the first after a sign-out). One statement, so that two
        processes signing the same key in at once agree on one."""
        secret: str | None = self.session.execute(
            update(ApiKey)
            .where(ApiKey.prefix == prefix)
            .values(session_secret=func.coalesce(ApiKey.session_secret, fresh))
            .returning(ApiKey.session_secret)
        ).scalar_one()
        assert secret is not None  # coalesce'd with fresh
        return secret

    def end_sessions(self, prefix: str) -> None:
        """Sign the key's dashboard sessions out, on every process: no cookie signed with its
        secret reads again."""
        self.session.execute(
            update(ApiKey).where(ApiKey.prefix == prefix).values(session_secret=None)
        )

    def api_keys(self, tenant_id: uuid.UUID) -> list[ApiKey]:
        return list(
            self.session.scalars(
                select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
            )
        )

    def revoke_api_key(self, tenant_id: uuid.UUID, prefix: str, now: datetime) -> bool:
        result = self.session.execute(
            update(ApiKey)
            .where(
                ApiKey.tenant_id == tenant_id,
                ApiKey.prefix == prefix,
                ApiKey.revoked_at.is_(None),
            )
            .values(revoked_at=now)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # -- webhook endpoints and deliveries ------------------------------------------------------

    def add_endpoint(
        self,
        tenant_id: uuid.UUID,
        name: str,
        scheme: SignatureScheme,
        secret: str,
        now: datetime,
        *,
        wakes_event: str | None = None,
        wakes_key: str | None = None,
    ) -> EndpointRecord:
        row = WebhookEndpoint(
            tenant_id=tenant_id, name=name, scheme=scheme, secret=secret, rejected=0,
            created_at=now, wakes_event=wakes_event, wakes_key=wakes_key,
        )  # fmt: skip
        try:
            with self.session.begin_nested():
                self.session.add(row)
        except IntegrityError as exc:
            raise ConveyorError(
                f"a webhook endpoint named {name!r} exists already; pick another name"
            ) from exc
        return endpoint_record(row)

    def endpoint(self, endpoint_id: uuid.UUID) -> EndpointRecord | None:
        row = self.session.get(WebhookEndpoint, endpoint_id)
        return endpoint_record(row) if row else None

    def endpoints(self, tenant_id: uuid.UUID) -> list[EndpointRecord]:
        rows = self.session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.tenant_id == tenant_id)
            .order_by(WebhookEndpoint.name)
        )
        return [endpoint_record(r) for r in rows]

    def count_rejected(self, endpoint_id: uuid.UUID) -> None:
        self.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(rejected=WebhookEndpoint.rejected + 1)
        )

    def add_delivery(
        self,
        endpoint: EndpointRecord,
        delivery_id: str,
        event: str | None,
        payload: Any,
        now: datetime,
        trace: TraceContext | None = None,
    ) -> uuid.UUID | None:
        """Store a verified delivery; None if the endpoint has one with that id (a replay)."""
        row = WebhookDelivery(
            endpoint_id=endpoint.id, tenant_id=endpoint.tenant_id, delivery_id=delivery_id,
            event=event, payload=payload, status=DeliveryStatus.RECEIVED, executions=0,
            execution_ids=[], received_at=now, traceparent=trace.traceparent if trace else None,
            tracestate=trace.tracestate if trace else None,
        )  # fmt: skip
        try:
            with self.session.begin_nested():
                self.session.add(row)
        except IntegrityError:
            return None
        return row.id

    def note_signature(
        self, endpoint_id: uuid.UUID, digest: str, now: datetime, window: timedelta
    ) -> bool:
        """Note a body's signature as received by the endpoint now; False if it was noted
        less than ``window`` ago (a replay). One statement on the table's key: of two
        concurrent equal ones, the second waits for the first's commit and sees it."""
        statement = (
            upsert(self.session, WebhookSignature)
            .values(endpoint_id=endpoint_id, digest=digest, seen_at=now)
            .on_conflict_do_update(
                index_elements=["endpoint_id", "digest"],
                set_={"seen_at": now},
                where=WebhookSignature.seen_at < now - window,
            )
            .returning(WebhookSignature.digest)
        )
        return self.session.execute(statement).first() is not None

    def forget_signatures(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` signatures last received before ``before``, oldest first:
        past the replay window they refuse nothing. How many were deleted."""
        oldest = (
            select(WebhookSignature.endpoint_id, WebhookSignature.digest)
            .where(WebhookSignature.seen_at < before)
            .order_by(WebhookSignature.seen_at)
            .limit(limit)
        )
        key = tuple_(WebhookSignature.endpoint_id, WebhookSignature.digest)
        result = self.session.execute(
            delete(WebhookSignature).where(key.in_(oldest)),
            execution_options={"synchronize_session": False},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    def stored_delivery(self, endpoint_id: uuid.UUID, delivery_id: str) -> DeliveryReceipt | None:
        """The delivery the endpoint stored under the sender's id, as a repeat is answered."""
        row = self.session.execute(
            select(WebhookDelivery.id, WebhookDelivery.status, WebhookDelivery.execution_ids).where(
                WebhookDelivery.endpoint_id == endpoint_id,
                WebhookDelivery.delivery_id == delivery_id,
            )
        ).one_or_none()
        if row is None:
            return None
        made = None if row.execution_ids is None else tuple(map(uuid.UUID, row.execution_ids))
        return DeliveryReceipt(id=row.id, status=row.status, executions=made, repeated=True)

    def claim_delivery(self, delivery_id: uuid.UUID) -> DeliveryRecord | None:
        """Lock a delivery still waiting for the webhook worker; None once it was handled."""
        row = self.session.execute(
            select(
                WebhookDelivery,
                WebhookEndpoint.name,
                Tenant.name,
                WebhookEndpoint.wakes_event,
                WebhookEndpoint.wakes_key,
            )
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .join(Tenant, Tenant.id == WebhookDelivery.tenant_id)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == DeliveryStatus.RECEIVED,
            )
            .with_for_update(of=WebhookDelivery)
        ).one_or_none()
        if row is None:
            return None
        delivery, endpoint_name, tenant_name, wakes_event, wakes_key = row
        return DeliveryRecord(
            id=delivery.id,
            endpoint_id=delivery.endpoint_id,
            endpoint_name=endpoint_name,
            tenant_id=delivery.tenant_id,
            tenant_name=tenant_name,
            delivery_id=delivery.delivery_id,
            event=delivery.event,
            payload=delivery.payload,
            status=delivery.status,
            trace=trace_context(delivery.traceparent, delivery.tracestate),
            wakes_event=wakes_event,
            wakes_key=wakes_key,
        )

    def stale_deliveries(self, cutoff: datetime, limit: int) -> list[uuid.UUID]:
        """Deliveries stored before ``cutoff`` and still waiting for the webhook worker."""
        return list(
            self.session.scalars(
                select(WebhookDelivery.id)
                .where(
                    WebhookDelivery.status == DeliveryStatus.RECEIVED,
                    WebhookDelivery.received_at < cutoff,
                )
                .order_by(WebhookDelivery.received_at)
                .limit(limit)
            )
        )

    def finish_delivery(
        self,
        delivery_id: uuid.UUID,
        status: DeliveryStatus,
        executions: Sequence[uuid.UUID],
        now: datetime,
    ) -> None:
        self.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(
                status=status,
                executions=len(executions),
                execution_ids=[str(e) for e in executions],
                processed_at=now,
            )
        )

    # -- subscriptions ------------------------------------------------------------------------

    def replace_subscriptions(
        self,
        tenant_id: uuid.UUID,
        workflow_name: str,
        rows: Sequence[tuple[SubscriptionKind, str, list[str]]],
    ) -> None:
        """The workflow's subscriptions become exactly ``rows`` of (kind, source, events)."""
        self.session.execute(
            delete(Subscription).where(
                Subscription.tenant_id == tenant_id, Subscription.workflow_name == workflow_name
            )
        )
        if rows:
            self.session.execute(
                insert(Subscription),
                [
                    {"tenant_id": tenant_id, "workflow_name": workflow_name, "kind": kind,
                     "source": source, "events": events}
                    for kind, source, events in rows
                ],
            )  # fmt: skip

    def subscribers(
        self, tenant_id: uuid.UUID, kind: SubscriptionKind, source: str
    ) -> list[tuple[str, list[str]]]:
        """(workflow name, event filter) of every subscription to ``source``, by name."""
        rows = self.session.execute(
            select(Subscription.workflow_name, Subscription.events)
            .where(
                Subscription.tenant_id == tenant_id,
                Subscription.kind == kind,
                Subscription.source == source,
            )
            .order_by(Subscription.workflow_name)
        ).all()
        return [(r.workflow_name, list(r.events)) for r in rows]

    # -- tenant-scoped reads --------------------------------------------------------------------

    def execution_by_key(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        """The execution a trigger with this Idempotency-Key made, with its workflow's name."""
        row = self.session.execute(
            select(Execution.id, WorkflowVersion.name)
            .join(WorkflowVersion, WorkflowVersion.id == Execution.workflow_id)
            .where(Execution.tenant_id == tenant_id, Execution.idempotency_key == key)
        ).one_or_none()
        return (row.id, row.name) if row else None

    def owns_execution(self, tenant_id: uuid.UUID, execution_id: uuid.UUID) -> bool:
        found = self.session.scalar(
            select(Execution.id).where(
                Execution.id == execution_id, Execution.tenant_id == tenant_id
            )
        )
        return found is not None

    def execution_tenant(self, execution_id: uuid.UUID) -> TenantRef | None:
        """The tenant an execution belongs to; None if there is no such execution."""
        row = self.session.execute(
            select(Tenant.id, Tenant.name)
            .join(Execution, Execution.tenant_id == Tenant.id)
            .where(Execution.id == execution_id)
        ).one_or_none()
        return TenantRef(id=row.id, name=row.name) if row else None

    def dead_letters(self, tenant_id: uuid.UUID, limit: int) -> list[tuple[Job, str]]:
        """The tenant's dead-lettered jobs, newest first, with their workflow's name."""
        rows = self.session.execute(
            select(Job, WorkflowVersion.name)
            .join(WorkflowVersion, WorkflowVersion.id == Job.workflow_id)
            .where(Job.tenant_id == tenant_id, Job.status == JobStatus.DEAD_LETTER)
            .order_by(Job.created_at.desc())
            .limit(limit)
        ).all()
        return [(job, name) for job, name in rows]
