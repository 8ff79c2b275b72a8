"""The in-memory adapter of the store port, assembled: webhook deliveries and cron schedules
here, the rest in :mod:`conveyor.testing.memory_executions`,
:mod:`conveyor.testing.memory_jobs` and :mod:`conveyor.testing.memory_reruns`."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import fields, replace
from datetime import datetime, timedelta
from typing import Any

from conveyor.engine import step_parts
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    Advance,
    DeliveryReceipt,
    DeliveryRecord,
    EndpointRecord,
    Fire,
    NewJob,
    ScheduleRecord,
    Stepped,
    Succeeded,
    TraceContext,
)
from conveyor.engine.states import (
    DeliveryStatus,
    ExecutionStatus,
    SignatureScheme,
    SubscriptionKind,
    TriggerSource,
)
from conveyor.exceptions import ConveyorError, ScheduleError
from conveyor.ids import new_id
from conveyor.testing.memory_items import MemoryMapItems
from conveyor.testing.memory_reruns import MemoryReruns
from conveyor.testing.memory_waits import MemoryWaits
from conveyor.testing.tables import DeliveryRow, ExecutionRow, SubscriptionRow, stored

_SCHEDULE_FIELDS = frozenset(f.name for f in fields(ScheduleRecord))


class MemoryDeliveries(MemoryReruns):
    """Webhook endpoints, their verified deliveries, and the subscriptions they start."""

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
        if any((e.tenant_id, e.name) == (tenant_id, name) for e in self.tables.endpoints.values()):
            raise ConveyorError(
                f"a webhook endpoint named {name!r} exists already; pick another name"
            )
        endpoint = EndpointRecord(
            id=new_id(), tenant_id=tenant_id, name=name, scheme=scheme, secret=secret, rejected=0,
            wakes_event=wakes_event, wakes_key=wakes_key,
        )  # fmt: skip
        self.tables.endpoints[endpoint.id] = endpoint
        return endpoint

    def endpoints(self, tenant_id: uuid.UUID) -> list[EndpointRecord]:
        mine = [e for e in self.tables.endpoints.values() if e.tenant_id == tenant_id]
        return sorted(mine, key=lambda e: e.name)

    def note_signature(
        self, endpoint_id: uuid.UUID, digest: str, now: datetime, window: timedelta
    ) -> bool:
        seen = self.tables.signatures.get((endpoint_id, digest))
        if seen is not None and seen >= now - window:
            return False
        self.tables.signatures[endpoint_id, digest] = now
        return True

    def add_delivery(
        self,
        endpoint: EndpointRecord,
        delivery_id: str,
        event: str | None,
        payload: Any,
        now: datetime,
        trace: TraceContext | None = None,
    ) -> uuid.UUID | None:
        taken = any(
            (d.endpoint_id, d.delivery_id) == (endpoint.id, delivery_id)
            for d in self.tables.deliveries.values()
        )
        if taken:
            return None
        row = DeliveryRow(
            id=new_id(), endpoint_id=endpoint.id, tenant_id=endpoint.tenant_id,
            delivery_id=delivery_id, event=event, payload=stored(payload),
            status=DeliveryStatus.RECEIVED, execution_ids=[], received_at=now,
            traceparent=trace.traceparent if trace else None,
            tracestate=trace.tracestate if trace else None,
        )  # fmt: skip
        self.tables.deliveries[row.id] = row
        return row.id

    def stored_delivery(self, endpoint_id: uuid.UUID, delivery_id: str) -> DeliveryReceipt | None:
        row = next(
            (d for d in self.tables.deliveries.values()
             if (d.endpoint_id, d.delivery_id) == (endpoint_id, delivery_id)),
            None,
        )  # fmt: skip
        if row is None:
            return None
        made = None if row.execution_ids is None else tuple(map(uuid.UUID, row.execution_ids))
        return DeliveryReceipt(id=row.id, status=row.status, executions=made, repeated=True)

    def claim_delivery(self, delivery_id: uuid.UUID) -> DeliveryRecord | None:
        row = self.tables.deliveries.get(delivery_id)
        if row is None or row.status is not DeliveryStatus.RECEIVED:
            return None
        return DeliveryRecord(
            id=row.id, endpoint_id=row.endpoint_id,
            endpoint_name=self.tables.endpoints[row.endpoint_id].name, tenant_id=row.tenant_id,
            tenant_name=self.tables.tenants[row.tenant_id].name, delivery_id=row.delivery_id,
            event=row.event, payload=row.payload, status=row.status, trace=row.trace,
            wakes_event=self.tables.endpoints[row.endpoint_id].wakes_event,
            wakes_key=self.tables.endpoints[row.endpoint_id].wakes_key,
        )  # fmt: skip

    def finish_delivery(
        self,
        delivery_id: uuid.UUID,
        status: DeliveryStatus,
        executions: Sequence[uuid.UUID],
        now: datetime,
    ) -> None:
        if (row := self.tables.deliveries.get(delivery_id)) is not None:
            self.tables.deliveries[delivery_id] = replace(
                row, status=status, executions=len(executions),
                execution_ids=[str(e) for e in executions], processed_at=now,
            )  # fmt: skip

    def replace_subscriptions(
        self,
        tenant_id: uuid.UUID,
        workflow_name: str,
        rows: Sequence[tuple[SubscriptionKind, str, list[str]]],
    ) -> None:
        self.tables.subscriptions[tenant_id, workflow_name] = tuple(
            SubscriptionRow(
                tenant_id=tenant_id,
                workflow_name=workflow_name,
                kind=kind,
                source=source,
                events=tuple(events),
            )
            for kind, source, events in rows
        )

    def subscribers(
        self, tenant_id: uuid.UUID, kind: SubscriptionKind, source: str
    ) -> list[tuple[str, list[str]]]:
        found = [
            row
            for (tenant, _), rows in self.tables.subscriptions.items()
            if tenant == tenant_id
            for row in rows
            if (row.kind, row.source) == (kind, source)
        ]
        return [(r.workflow_name, list(r.events)) for r in sorted(found, key=_by_workflow)]


def _by_workflow(row: SubscriptionRow) -> str:
    return row.workflow_name


class InMemoryStore(MemoryDeliveries, MemoryMapItems, MemoryWaits):
    """The :class:`~conveyor.engine.ports.Store` port in plain Python, over
    :class:`~conveyor.testing.tables.Tables` (one unit of work's view of them: see
    :class:`~conveyor.testing.InMemoryDatabase`). The contracts are the port's docstrings;
    tests/contract holds this store and the SQL ones to the same cases."""

    def complete_step(
        self,
        succeeded: Succeeded,
        successor: NewJob,
        *,
        worker: str | None,
        claim: bool,
    ) -> Stepped | None:
        """Its parts in turn (:mod:`conveyor.engine.step_parts`)."""
        return step_parts.complete_step(self, succeeded, successor, worker=worker, claim=claim)

    def add_schedule(self, **values: Any) -> ScheduleRecord:
        tenant_id, name = values["tenant_id"], values["name"]
        if any((s.tenant_id, s.name) == (tenant_id, name) for s in self.tables.schedules.values()):
            raise ScheduleError(
                f"a schedule named {name!r} exists already; pick another name, "
                f"or remove it first (`conveyor schedules remove {name}`)"
            )
        columns = {"id": new_id(), "last_run_at": None, "run_count": 0, **values}
        record = ScheduleRecord(**{k: v for k, v in columns.items() if k in _SCHEDULE_FIELDS})
        self.tables.schedules[record.id] = replace(record, input=stored(record.input))
        return self.tables.schedules[record.id]

    def schedule(self, tenant_id: uuid.UUID, name: str) -> ScheduleRecord | None:
        return next(
            (
                s
                for s in self.tables.schedules.values()
                if (s.tenant_id, s.name) == (tenant_id, name)
            ),
            None,
        )

    def schedules(
        self, tenant_id: uuid.UUID | None, *, workflow: str | None = None
    ) -> list[ScheduleRecord]:
        found = [
            s
            for s in self.tables.schedules.values()
            if tenant_id in (None, s.tenant_id) and workflow in (None, s.workflow_name)
        ]
        return sorted(found, key=lambda s: s.name)

    def update_schedule(self, schedule_id: uuid.UUID, now: datetime, **values: Any) -> None:
        if (found := self.tables.schedules.get(schedule_id)) is not None:
            self.tables.schedules[schedule_id] = replace(found, **values)

    def delete_schedules(self, ids: Collection[uuid.UUID]) -> None:
        for schedule_id in ids:
            self.tables.schedules.pop(schedule_id, None)
        for execution in list(self.tables.executions.values()):  # ON DELETE SET NULL
            if execution.schedule_id in ids:
                self._set_execution(execution, schedule_id=None)

    def claim_due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        due = [s for s in self.tables.schedules.values() if s.enabled and s.next_run_at <= now]
        return sorted(due, key=lambda s: s.next_run_at)[:limit]

    def add_fired_executions(
        self, fires: Sequence[Fire], now: datetime
    ) -> list[tuple[Fire, uuid.UUID]]:
        fired = {
            (e.schedule_id, e.scheduled_for)
            for e in self.tables.executions.values()
            if e.schedule_id is not None
        }
        started: list[tuple[Fire, uuid.UUID]] = []
        for fire in fires:
            if (fire.schedule.id, fire.slot) in fired:
                continue  # stored already: left alone, as ON CONFLICT DO NOTHING does
            fired.add((fire.schedule.id, fire.slot))
            execution = ExecutionRow(
                id=new_id(), tenant_id=fire.schedule.tenant_id, workflow_id=fire.workflow_id,
                status=ExecutionStatus.PENDING, priority=fire.priority,
                trigger=TriggerSource.SCHEDULE.value, input=stored(fire.schedule.input),
                schedule_id=fire.schedule.id, scheduled_for=fire.slot, created_at=now,
                traceparent=fire.trace.traceparent if fire.trace else None,
                tracestate=fire.trace.tracestate if fire.trace else None,
            )  # fmt: skip
            self.tables.executions[execution.id] = execution
            started.append((fire, new_id()))
            self._add_start_job(execution.record(), started[-1][1], now)
        return started

    def advance_schedules(self, advances: Sequence[Advance], now: datetime) -> None:
        for advance in advances:
            if (found := self.tables.schedules.get(advance.schedule_id)) is None:
                continue
            self.tables.schedules[found.id] = replace(
                found, next_run_at=advance.next_run_at, run_count=found.run_count + advance.started,
                last_run_at=now if advance.started else found.last_run_at,
            )  # fmt: skip


_: type[Store] = InMemoryStore  # mypy checks here that it implements every method of the port
