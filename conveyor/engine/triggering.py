"""Trigger and plan: an execution made in the caller's transaction, planned at once when small
(its root jobs queued), else by an execution worker from its start job."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from conveyor.engine import planning
from conveyor.engine.definitions import DedupePolicy, Workflow
from conveyor.engine.ports import Store
from conveyor.engine.priority import choose as choose_priority
from conveyor.engine.queues import EXECUTION_QUEUE
from conveyor.engine.ready import context_of, enqueue_nodes, new_jobs, node_dispatches
from conveyor.engine.records import (
    Created,
    Dispatch,
    ExecutionRecord,
    Limits,
    ParentLink,
    TraceContext,
    WorkflowRecord,
)
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    Priority,
    TriggerSource,
)
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    DuplicateExecution,
    IdempotencyConflict,
    StoreError,
    TemplateBudgetExceeded,
    WorkflowNotFound,
)
from conveyor.ids import new_id


@dataclass(frozen=True, kw_only=True)
class Triggered:
    execution_id: uuid.UUID
    dispatches: list[Dispatch]
    replayed: bool = False  # an earlier trigger with the same idempotency key made it
    # What a deduplication key active on another execution did (None: not deduplicated)
    dedupe: DedupeOutcome | None = None


class DedupeOutcome(StrEnum):
    """What a trigger did with its input, its deduplication key being active elsewhere."""

    DEDUPLICATED = "deduplicated"  # keep_first: the active execution; the input dropped
    REPLACED = "replaced"  # replace: the active execution, not started, runs with this input
    FOLLOW_UP = "follow_up"  # a follow-up with this input starts when the active one ends


class _Targets:
    """(tenant name, workflow name) -> (tenant id, id of the latest version), as last seen
    by this process: a trigger then needs no read. The insert checks that the version is
    still the latest (a version applied elsewhere since makes it plan again)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[str, str], tuple[uuid.UUID, uuid.UUID]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, names: tuple[str, str]) -> tuple[uuid.UUID, uuid.UUID | None] | None:
        with self._lock:
            return self._seen.get(names)

    def put(self, names: tuple[str, str], target: tuple[uuid.UUID, uuid.UUID]) -> None:
        with self._lock:
            self._seen[names] = target
            self._seen.move_to_end(names)
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)

    def forget(self, names: tuple[str, str]) -> None:
        with self._lock:
            self._seen.pop(names, None)


_targets = _Targets()


# Executions of at most this many nodes are planned by the transaction that triggers them;
# planning a larger one is left to the execution workers, to keep a trigger short.
INLINE_PLAN_NODES = 100


def trigger(
    store: Store,
    *,
    workflow_name: str,
    tenant: str,
    input: Any,
    now: datetime,
    priority: Priority | None = None,
    source: TriggerSource = TriggerSource.API,
    idempotency_key: str | None = None,
    dedupe_key: str | None = None,
    trace: TraceContext | None = None,
    run_at: datetime | None = None,
    limits: Limits | None = None,
    followed: bool = False,
) -> Triggered:
    """Create the execution in the caller's transaction. A small one (at most
    ``INLINE_PLAN_NODES`` nodes) is planned at once, its root jobs queued: one hop less for
    every run. A larger one gets a start job, and an execution worker plans it. With an
    idempotency key the tenant used before, the execution that key made is returned instead
    (for the same workflow; another workflow is an :class:`IdempotencyConflict`). With a
    deduplication key, a pending or running execution with that key is returned instead.
    ``trace``: the trace context its tries join (stored with it). ``run_at`` (checked by
    :func:`conveyor.engine.later.start_time`, after ``now``): the execution waits, pending,
    its start job held in the database until then (see :mod:`conveyor.engine.later`).
    ``limits`` (checked by :func:`conveyor.engine.trigger_limits.checked`): stored with the
    execution, overriding its definition's maximum attempts and timeout. ``followed``: a
    follow-up started by the transaction finishing the execution before it, which a root
    template over its budget must not roll back (its node fails, recorded)."""
    names = (tenant, workflow_name)
    target = _targets.get(names)
    for _ in range(3):
        known = target is not None  # from this process's memory: its version may be old
        if target is None:
            target = store.trigger_target(tenant, workflow_name)
        tenant_id, workflow_id = target
        if earlier := _earlier(store, tenant_id, workflow_name, idempotency_key, dedupe_key):
            deduped = _deduped(store, earlier, input, now)
            if deduped is None:  # it finished since: look again, then make a new one
                continue
            return deduped
        if workflow_id is None:
            raise WorkflowNotFound(
                f"tenant {tenant!r} has no workflow named {workflow_name!r}; "
                f"apply its definition first (conveyor workflow apply FILE)"
            )
        workflow, shape = load_workflow(store, workflow_id)
        execution = ExecutionRecord(
            id=new_id(), tenant_id=tenant_id, workflow_id=workflow_id,
            status=ExecutionStatus.PENDING,
            priority=choose_priority(priority, workflow.priority, source),
            input=input if input is not None else {}, created_at=now, trace=trace,
            scheduled_for=run_at, limits=limits,
        )  # fmt: skip
        try:
            created, dispatches = _create(
                store,
                execution,
                workflow,
                shape,
                names,
                source,
                now,
                idempotency_key,
                dedupe_key,
                followed,
            )
        except TemplateBudgetExceeded:
            if not known:
                raise
            # the remembered version's template, which a newer version may have mended
            created = Created.STALE
        if created is Created.STALE:  # a newer version, applied since the version was known
            _targets.forget(names)
            target = None
            continue
        _targets.put(names, (tenant_id, workflow_id))
        if created is Created.KEY_TAKEN:  # a retry racing this one stored its execution first
            raced = _earlier(store, tenant_id, workflow_name, idempotency_key, dedupe_key)
            if raced is None:
                raise DuplicateExecution("its idempotency or deduplication key is taken")
            deduped = _deduped(store, raced, input, now)
            if deduped is None:
                continue
            return deduped
        return Triggered(execution_id=execution.id, dispatches=dispatches)
    raise StoreError(
        f"workflow {workflow_name!r} of tenant {tenant!r} got new versions while it was "
        f"being triggered; trigger it again"
    )


def _create(
    store: Store,
    execution: ExecutionRecord,
    workflow: Workflow,
    shape: planning.Plan,
    names: tuple[str, str] | None,
    source: TriggerSource,
    now: datetime,
    idempotency_key: str | None,
    dedupe_key: str | None,
    followed: bool = False,
) -> tuple[Created, list[Dispatch]]:
    """Insert the execution: planned at once (``running``, node states, root jobs) when
    small, else ``pending`` with a start job; and the messages to publish. ``names``: the
    (tenant, workflow) it is the latest version of; None for a version read in this unit of
    work (a child's)."""
    later = execution.scheduled_for is not None and execution.scheduled_for > now
    if len(workflow.nodes) <= INLINE_PLAN_NODES and not later:
        execution = replace(execution, status=ExecutionStatus.RUNNING)
        context = context_of(execution, {})
        roots = [(workflow.node(root), context) for root in shape.roots]
        refuse = source in _CALLERS and not followed
        jobs = new_jobs(workflow, roots, now, refuse=refuse, limits=execution.limits)
        created = store.create_execution(
            execution, names=names, trigger=source.value, now=now,
            idempotency_key=idempotency_key, dedupe_key=dedupe_key,
            waiting_on=shape.waiting_on, queued=shape.roots, jobs=jobs,
        )  # fmt: skip
        return created, node_dispatches(execution, workflow.name, jobs, now)
    start_job = new_id()
    created = store.create_execution(
        execution, names=names, trigger=source.value, now=now,
        idempotency_key=idempotency_key, dedupe_key=dedupe_key, start_job=start_job,
    )  # fmt: skip
    dispatch = Dispatch(
        job_id=start_job, kind=JobKind.EXECUTION, queue=EXECUTION_QUEUE,
        priority=execution.priority, label=f"execution={execution.id}", workflow=workflow.name,
    )  # fmt: skip
    return created, [] if later else [dispatch]  # a later one's is published when promoted


def _earlier(
    store: Store,
    tenant_id: uuid.UUID,
    workflow_name: str,
    idempotency_key: str | None,
    dedupe_key: str | None,
) -> Triggered | None:
    """The execution an earlier trigger with the same key made (any status for an
    idempotency key, pending or running for a deduplication key)."""
    for key, found in (
        (idempotency_key, idempotency_key and store.execution_by_key(tenant_id, idempotency_key)),
        (dedupe_key, dedupe_key and store.active_by_dedupe(tenant_id, dedupe_key)),
    ):
        if not found:
            continue
        execution_id, made_for = found
        if made_for != workflow_name:
            raise IdempotencyConflict(
                f"key {key!r} already started workflow {made_for!r} (execution "
                f"{execution_id}); use another key for {workflow_name!r}"
            )
        deduped = DedupeOutcome.DEDUPLICATED if key is dedupe_key else None
        return Triggered(execution_id=execution_id, dispatches=[], replayed=True, dedupe=deduped)
    return None


def _deduped(store: Store, earlier: Triggered, input: Any, now: datetime) -> Triggered | None:
    """The answer to a trigger whose deduplication key is active on ``earlier``: under the
    workflow's dedupe policy, the newer input replaces the active execution's while that has
    not started (replace), else is left as its follow-up (follow_up, and replace once
    started); keep_first drops it. The policy of the active execution's version applies.
    None: the active execution finished meanwhile (a new one is to be made)."""
    if earlier.dedupe is None:
        return earlier  # an idempotency key's replay
    # the active execution's version decides: the one its finish reads for a follow-up
    active = store.execution(earlier.execution_id)
    policy = load_workflow(store, active.workflow_id)[0].dedupe.policy
    if policy is DedupePolicy.KEEP_FIRST:
        return earlier
    input = input if input is not None else {}
    if policy is DedupePolicy.REPLACE and store.replace_unstarted_input(
        earlier.execution_id, input
    ):
        return replace(earlier, dedupe=DedupeOutcome.REPLACED)
    if store.leave_follow_up(earlier.execution_id, input, now):
        return replace(earlier, dedupe=DedupeOutcome.FOLLOW_UP)
    return None  # it finished since it was found


def follow_up(
    store: Store, execution_id: uuid.UUID, workflow: Workflow, now: datetime
) -> list[Dispatch]:
    """In the transaction that finished the execution (completed or failed): the follow-up a
    newer trigger left on it, started (its messages to publish after commit). Nothing to
    read for a workflow whose dedupe policy is keep_first."""
    if workflow.dedupe.policy is DedupePolicy.KEEP_FIRST:
        return []
    left = store.take_follow_up(execution_id)
    if left is None:
        return []
    made = trigger(
        store, workflow_name=left.workflow, tenant=left.tenant, input=left.input, now=now,
        dedupe_key=left.dedupe_key, priority=left.priority, source=left.source, followed=True,
    )  # fmt: skip
    return made.dispatches


def start_child(
    store: Store,
    *,
    version: WorkflowRecord,
    input: Any,
    parent: ExecutionRecord,
    link: ParentLink,
    now: datetime,
) -> Triggered:
    """A child execution of ``version`` (read by the caller in this transaction), started by
    the workflow node ``link`` names, made as a trigger makes one: planned at once when
    small (its root jobs to publish), else with a start job. It runs at its parent's
    priority, in its trace, one level deeper. A second start for the same job and try finds
    the key taken and makes nothing (``replayed``)."""
    workflow, shape = load_workflow(store, version.id)
    execution = ExecutionRecord(
        id=new_id(), tenant_id=parent.tenant_id, workflow_id=version.id,
        status=ExecutionStatus.PENDING, priority=parent.priority,
        input=input if input is not None else {}, created_at=now, trace=parent.trace,
        parent=link, depth=parent.depth + 1,
    )  # fmt: skip
    created, dispatches = _create(
        store, execution, workflow, shape, None, TriggerSource.WORKFLOW, now, None, None
    )
    if created is not Created.CREATED:
        return Triggered(execution_id=execution.id, dispatches=[], replayed=True)
    return Triggered(execution_id=execution.id, dispatches=dispatches)


@dataclass(frozen=True, kw_only=True)
class Planned:
    """What a plan made: the messages to publish and, when it planned one, the execution and
    its workflow's name."""

    dispatches: list[Dispatch]
    execution: ExecutionRecord | None = None
    workflow: str = ""


def start_execution(
    store: Store, job_id: uuid.UUID, now: datetime, worker: str | None = None
) -> Planned:
    """Plan an execution: a state row per node and a job per root node."""
    started = time.monotonic()
    job = store.claim_job(job_id, JobKind.EXECUTION, now)
    if job is None:
        return Planned(dispatches=[])  # a duplicate or stale message: not queued any more
    store.add_attempt(job, worker, now)
    execution = store.execution(job.execution_id)
    if execution.status is not ExecutionStatus.PENDING:
        store.transition_job(job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, completed_at=now)
        store.finish_attempt(
            job.id,
            job.try_number,
            AttemptStatus.FAILED,
            now,
            0.0,
            error=f"execution is {execution.status.value}",
        )
        return Planned(dispatches=[])
    workflow, shape = load_workflow(store, execution.workflow_id)
    store.start_execution(execution.id, len(workflow.nodes), now)
    dispatches = _plan(store, execution, workflow, shape, now)
    store.transition_job(job.id, JobStatus.PROCESSING, JobStatus.COMPLETED, completed_at=now)
    store.finish_attempt(
        job.id, job.try_number, AttemptStatus.SUCCEEDED, now, time.monotonic() - started
    )
    return Planned(dispatches=dispatches, execution=execution, workflow=workflow.name)


def _plan(
    store: Store,
    execution: ExecutionRecord,
    workflow: Workflow,
    shape: planning.Plan,
    now: datetime,
) -> list[Dispatch]:
    """A state row per node, the roots' already queued, and a job per root node."""
    store.add_node_states(execution.id, shape.waiting_on, queued=shape.roots)
    context = context_of(execution, {})
    roots = [(workflow.node(root), context) for root in shape.roots]
    return enqueue_nodes(store, execution, workflow, roots, now, state_queued=True)


# Who waits for a trigger's answer: a template over its budget is theirs to fix, told at once.
# An event, a webhook delivery or a schedule starting the run is not: its node fails, recorded
# (refusing would roll back every workflow the event starts, or a delivery retried forever).
_CALLERS = frozenset({TriggerSource.API, TriggerSource.CLI})
