"""Cron schedules: one transaction's worth of work each, like :mod:`conveyor.engine.triggering`.

The caller owns the transaction and publishes the returned dispatches after it commits. The
decisions (is it valid, when does it fire next, what does a late check start) come from the
pure :mod:`conveyor.engine.cron`.

The due check is safe to run from any number of workers and beats at once: it locks the
schedules it takes (``FOR UPDATE SKIP LOCKED``), starts their runs and advances
``next_run_at`` in the same transaction, and a run is stored at most once per (schedule, slot).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.engine.cron import FirePlan, parse_cron, plan_fires
from conveyor.engine.definitions import ScheduleSpec, Workflow
from conveyor.engine.ports import Store
from conveyor.engine.priority import choose as choose_priority
from conveyor.engine.queues import EXECUTION_QUEUE
from conveyor.engine.records import Advance, Dispatch, Fire, ScheduleRecord
from conveyor.engine.states import JobKind, ScheduleOrigin, TriggerSource
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import ScheduleError, ScheduleNotFound, WorkflowNotFound

log = logging.getLogger("conveyor.schedules")


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What one pass of the due check did."""

    claimed: int  # due schedules it took
    dispatches: list[Dispatch] = field(default_factory=list)  # start jobs of the new runs
    missed: int = 0  # slots that passed without a run (misfire policy, missing workflow)


# -- managing schedules --------------------------------------------------------------------


def add(
    store: Store, *, tenant: str, workflow: str, spec: ScheduleSpec, now: datetime
) -> ScheduleRecord:
    """Add a schedule of an applied workflow (an operator's, not a definition's)."""
    tenant_id = store.tenant_id(tenant)
    if store.latest_workflow(tenant_id, workflow) is None:
        raise WorkflowNotFound(
            f"tenant {tenant!r} has no workflow named {workflow!r}; apply its definition "
            f"first (conveyor workflow apply FILE)"
        )
    return store.add_schedule(
        tenant_id=tenant_id,
        name=spec.name or workflow,
        workflow_name=workflow,
        origin=ScheduleOrigin.MANUAL,
        enabled=True,
        run_count=0,
        created_at=now,
        updated_at=now,
        **_spec_values(spec, now),
    )


def sync_definition(store: Store, tenant: str, workflow: Workflow, now: datetime) -> None:
    """Make the tenant's schedules match those the definition declares: add new ones, update
    changed ones (keeping whether an operator paused them), remove those it dropped."""
    tenant_id = store.tenant_id(tenant)
    declared = dict(zip(workflow.schedule_names(), workflow.schedules, strict=True))
    for name, spec in declared.items():
        existing = store.schedule(tenant_id, name)
        if existing is None:
            store.add_schedule(
                tenant_id=tenant_id,
                name=name,
                workflow_name=workflow.name,
                origin=ScheduleOrigin.DEFINITION,
                enabled=True,
                run_count=0,
                created_at=now,
                updated_at=now,
                **_spec_values(spec, now),
            )
        elif existing.origin is not ScheduleOrigin.DEFINITION or (
            existing.workflow_name != workflow.name
        ):
            raise ScheduleError(
                f"workflow {workflow.name!r} declares a schedule named {name!r}, but that name "
                f"belongs to a schedule of workflow {existing.workflow_name!r} "
                f"({existing.origin.value}); give the declared one another `name`"
            )
        elif _changed(existing, spec):
            moved = (existing.cron, existing.timezone) != (spec.cron, spec.timezone)
            values = _spec_values(spec, now)
            if not moved:
                del values["next_run_at"]  # same slots: keep its place in them
            store.update_schedule(existing.id, now, **values)
    stale = store.schedules(tenant_id, workflow=workflow.name)
    store.delete_schedules(
        [s.id for s in stale if s.origin is ScheduleOrigin.DEFINITION and s.name not in declared]
    )


def pause(store: Store, tenant: str, name: str, now: datetime) -> ScheduleRecord:
    """Stop starting runs; the slots that pass while paused are never run."""
    found = _find(store, tenant, name)
    store.update_schedule(found.id, now, enabled=False)
    return _find(store, tenant, name)


def resume(store: Store, tenant: str, name: str, now: datetime) -> ScheduleRecord:
    """Start runs again from the first slot after now."""
    found = _find(store, tenant, name)
    if not found.enabled:
        next_run_at = parse_cron(found.cron, found.timezone).next_after(now)
        store.update_schedule(found.id, now, enabled=True, next_run_at=next_run_at)
    return _find(store, tenant, name)


def remove(store: Store, tenant: str, name: str) -> None:
    """Delete an operator's schedule; its past runs stay (their schedule becomes empty)."""
    found = _find(store, tenant, name)
    if found.origin is ScheduleOrigin.DEFINITION:
        raise ScheduleError(
            f"schedule {name!r} is declared in workflow {found.workflow_name!r}'s definition; "
            f"remove it there and apply the definition again, or pause it "
            f"(`conveyor schedules pause {name}`)"
        )
    store.delete_schedules([found.id])


def _find(store: Store, tenant: str, name: str) -> ScheduleRecord:
    found = store.schedule(store.tenant_id(tenant), name)
    if found is None:
        raise ScheduleNotFound(
            f"tenant {tenant!r} has no schedule named {name!r}; list them with "
            f"`conveyor schedules list --tenant {tenant}`"
        )
    return found


def _spec_values(spec: ScheduleSpec, now: datetime) -> dict[str, Any]:
    cron = parse_cron(spec.cron, spec.timezone)
    return {
        "cron": cron.expression,
        "timezone": cron.timezone,
        "input": spec.input,
        "priority": spec.priority,
        "misfire": spec.misfire,
        "catch_up": spec.catch_up,
        "next_run_at": cron.next_after(now),
    }


def _changed(existing: ScheduleRecord, spec: ScheduleSpec) -> bool:
    return (
        existing.cron,
        existing.timezone,
        existing.input,
        existing.priority,
        existing.misfire,
        existing.catch_up,
    ) != (spec.cron, spec.timezone, spec.input, spec.priority, spec.misfire, spec.catch_up)


# -- the due check -------------------------------------------------------------------------


def untraced(fires: list[Fire]) -> AbstractContextManager[list[Fire]]:
    return nullcontext(fires)


def check_due(
    store: Store,
    now: datetime,
    *,
    limit: int,
    grace: float,
    traced: Callable[[list[Fire]], AbstractContextManager[list[Fire]]] = untraced,
) -> Checked:
    """Take up to ``limit`` due schedules, start their runs, advance each to its next slot.
    ``traced`` gives the fires their trace context while they are stored (the service's
    :func:`conveyor.tracing.fire_spans`: a trigger span each)."""
    due = store.claim_due_schedules(now, limit)
    if not due:
        return Checked(claimed=0)
    workflows = store.latest_workflows({(s.tenant_id, s.workflow_name) for s in due})
    fires: list[Fire] = []
    plans: dict[uuid.UUID, FirePlan] = {}
    missed = 0
    for schedule in due:
        try:
            plan = plan_fires(
                parse_cron(schedule.cron, schedule.timezone),
                due=schedule.next_run_at,
                now=now,
                policy=schedule.misfire,
                catch_up=schedule.catch_up,
                grace=grace,
            )
        except ScheduleError as exc:  # stored before a rule changed: stop it, keep the rest
            log.error("schedule %s is paused: %s", schedule.name, exc)
            store.update_schedule(schedule.id, now, enabled=False)
            continue
        plans[schedule.id] = plan
        missed += plan.missed
        if plan.missed:
            log.warning(
                "schedule %s missed %d slot(s) since %s; misfire policy %r started %d run(s)",
                schedule.name,
                plan.missed,
                schedule.next_run_at.isoformat(),
                schedule.misfire.value,
                len(plan.fire_at),
            )
        record = workflows.get((schedule.tenant_id, schedule.workflow_name))
        if record is None:
            log.error(
                "schedule %s: workflow %r has no version", schedule.name, schedule.workflow_name
            )
            missed += len(plan.fire_at)
            continue
        workflow, _ = load_workflow(store, record.id)
        priority = choose_priority(schedule.priority, workflow.priority, TriggerSource.SCHEDULE)
        fires += [
            Fire(schedule=schedule, workflow_id=record.id, slot=slot, priority=priority)
            for slot in plan.fire_at
        ]
    with traced(fires) as fires:
        started = store.add_fired_executions(fires, now)
    counts = Counter(fire.schedule.id for fire, _ in started)
    store.advance_schedules(
        [
            Advance(schedule_id=sid, next_run_at=plan.next_run_at, started=counts[sid])
            for sid, plan in plans.items()
        ],
        now,
    )
    dispatches = [
        Dispatch(
            job_id=job_id,
            kind=JobKind.EXECUTION,
            queue=EXECUTION_QUEUE,
            priority=f.priority,
            label=f"schedule={f.schedule.name}",
            workflow=f.schedule.workflow_name,
        )
        for f, job_id in started
    ]
    return Checked(claimed=len(due), dispatches=dispatches, missed=missed)
