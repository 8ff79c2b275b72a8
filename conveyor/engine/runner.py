"""Orchestration: the state transitions of executions, nodes and jobs.

Each function here is one transaction's worth of work against the store. The caller owns the
transaction and publishes the returned :class:`Dispatch` list only after it commits, so no
message ever names a job that is not in the database. Decisions (what is ready, what a failure
means) come from the pure modules :mod:`planning` and :mod:`retry`.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from conveyor.engine import node_types, planning, retry
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.priority import choose as choose_priority
from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import (
    Created,
    Dispatch,
    ExecutionRecord,
    Finish,
    JobRecord,
    NewJob,
    NodeHints,
    WorkflowRecord,
)
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    TriggerSource,
)
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import (
    ConveyorError,
    DuplicateExecution,
    IdempotencyConflict,
    InvalidTransition,
    NodeCancelled,
    NodeError,
    NodeTimeout,
    StoreError,
    TemplateBudgetExceeded,
    TemplateError,
    WorkerLost,
    WorkflowNotFound,
)
from conveyor.ids import new_id

if TYPE_CHECKING:
    from conveyor.store.sql import SqlStore


@dataclass(frozen=True, kw_only=True)
class Triggered:
    execution_id: uuid.UUID
    dispatches: list[Dispatch]
    replayed: bool = False  # an earlier trigger with the same idempotency key made it


@dataclass(frozen=True, kw_only=True)
class Failed:
    """What a failed try led to."""

    dispatches: list[Dispatch]
    outcome: JobStatus | None  # retry_wait, dead_letter or cancelled; None: taken meanwhile
    retry_in: float | None = None


@dataclass(frozen=True, kw_only=True)
class NodeRun:
    """A claimed node job with everything needed to run it outside any transaction."""

    job: JobRecord
    execution: ExecutionRecord
    workflow: Workflow
    node: Node
    context: dict[str, Any]

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def timeout(self) -> float | None:
        return self.workflow.timeout_for(self.node)


# -- definitions ---------------------------------------------------------------------------

_cache: OrderedDict[uuid.UUID, tuple[Workflow, planning.Plan]] = OrderedDict()
_cache_lock = threading.Lock()


def cached_workflow(workflow_id: uuid.UUID) -> tuple[Workflow, planning.Plan] | None:
    """A stored version this process has parsed already, or None."""
    with _cache_lock:
        return _cache.get(workflow_id)


def load_workflow(store: SqlStore, workflow_id: uuid.UUID) -> tuple[Workflow, planning.Plan]:
    """A stored version, parsed and planned once per process (versions never change)."""
    with _cache_lock:
        if workflow_id in _cache:
            _cache.move_to_end(workflow_id)
            return _cache[workflow_id]
    record = store.workflow(workflow_id)
    workflow = Workflow.model_validate(record.definition)
    entry = (workflow, planning.plan(workflow))
    with _cache_lock:
        _cache[workflow_id] = entry
        while len(_cache) > 512:
            _cache.popitem(last=False)
    return entry


def apply_workflow(
    store: SqlStore, tenant: str, definition: Workflow, now: datetime
) -> tuple[WorkflowRecord, bool]:
    """Store a new version when the definition changed; (latest version, whether it is new)."""
    workflow = parse_workflow(definition)
    tenant_id = store.tenant_id(tenant)
    latest = store.latest_workflow(tenant_id, workflow.name)
    digest = workflow.digest()
    if latest is not None and latest.digest == digest:
        return latest, False
    definition_json = workflow.model_dump(mode="json")
    return store.add_workflow_version(tenant_id, workflow.name, digest, definition_json, now), True


# -- trigger and plan ----------------------------------------------------------------------


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
    store: SqlStore,
    *,
    workflow_name: str,
    tenant: str,
    input: Any,
    now: datetime,
    priority: Priority | None = None,
    source: TriggerSource = TriggerSource.API,
    idempotency_key: str | None = None,
    dedupe_key: str | None = None,
) -> Triggered:
    """Create the execution in the caller's transaction. A small one (at most
    ``INLINE_PLAN_NODES`` nodes) is planned at once, its root jobs queued: one hop less for
    every run. A larger one gets a start job, and an execution worker plans it. With an
    idempotency key the tenant used before, the execution that key made is returned instead
    (for the same workflow; another workflow is an :class:`IdempotencyConflict`). With a
    deduplication key, a pending or running execution with that key is returned instead."""
    names = (tenant, workflow_name)
    target = _targets.get(names)
    for _ in range(3):
        known = target is not None  # from this process's memory: its version may be old
        if target is None:
            target = store.trigger_target(tenant, workflow_name)
        tenant_id, workflow_id = target
        if earlier := _earlier(store, tenant_id, workflow_name, idempotency_key, dedupe_key):
            return earlier
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
            input=input if input is not None else {}, created_at=now,
        )  # fmt: skip
        try:
            created, dispatches = _create(
                store, execution, workflow, shape, names, source, now, idempotency_key, dedupe_key
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
            return raced
        return Triggered(execution_id=execution.id, dispatches=dispatches)
    raise StoreError(
        f"workflow {workflow_name!r} of tenant {tenant!r} got new versions while it was "
        f"being triggered; trigger it again"
    )


def _create(
    store: SqlStore,
    execution: ExecutionRecord,
    workflow: Workflow,
    shape: planning.Plan,
    names: tuple[str, str],
    source: TriggerSource,
    now: datetime,
    idempotency_key: str | None,
    dedupe_key: str | None,
) -> tuple[Created, list[Dispatch]]:
    """Insert the execution: planned at once (``running``, node states, root jobs) when
    small, else ``pending`` with a start job; and the messages to publish."""
    if len(workflow.nodes) <= INLINE_PLAN_NODES:
        execution = replace(execution, status=ExecutionStatus.RUNNING)
        context = _context(execution, {})
        roots = [(workflow.node(root), context) for root in shape.roots]
        jobs = _new_jobs(workflow, roots, now, refuse=source in _CALLERS)
        created = store.create_execution(
            execution, names=names, trigger=source.value, now=now,
            idempotency_key=idempotency_key, dedupe_key=dedupe_key,
            waiting_on=shape.waiting_on, queued=shape.roots, jobs=jobs,
        )  # fmt: skip
        return created, _node_dispatches(execution, jobs, now)
    start_job = new_id()
    created = store.create_execution(
        execution, names=names, trigger=source.value, now=now,
        idempotency_key=idempotency_key, dedupe_key=dedupe_key, start_job=start_job,
    )  # fmt: skip
    dispatch = Dispatch(
        job_id=start_job, kind=JobKind.EXECUTION, queue=EXECUTION_QUEUE,
        priority=execution.priority, label=f"execution={execution.id} workflow={workflow.name}",
    )  # fmt: skip
    return created, [dispatch]


def _earlier(
    store: SqlStore,
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
        return Triggered(execution_id=execution_id, dispatches=[], replayed=True)
    return None


def start_execution(
    store: SqlStore, job_id: uuid.UUID, now: datetime, worker: str | None = None
) -> list[Dispatch]:
    """Plan an execution: a state row per node and a job per root node."""
    started = time.monotonic()
    job = store.claim_job(job_id, JobKind.EXECUTION, now)
    if job is None:
        return []  # a duplicate or stale message: the job is not queued any more
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
        return []
    workflow, shape = load_workflow(store, execution.workflow_id)
    store.start_execution(execution.id, len(workflow.nodes), now)
    dispatches = _plan(store, execution, workflow, shape, now)
    store.transition_job(job.id, JobStatus.PROCESSING, JobStatus.COMPLETED, completed_at=now)
    store.finish_attempt(
        job.id, job.try_number, AttemptStatus.SUCCEEDED, now, time.monotonic() - started
    )
    return dispatches


def _plan(
    store: SqlStore,
    execution: ExecutionRecord,
    workflow: Workflow,
    shape: planning.Plan,
    now: datetime,
) -> list[Dispatch]:
    """A state row per node, the roots' already queued, and a job per root node."""
    store.add_node_states(execution.id, shape.waiting_on, queued=shape.roots)
    context = _context(execution, {})
    roots = [(workflow.node(root), context) for root in shape.roots]
    return _enqueue_nodes(store, execution, workflow, roots, now, state_queued=True)


def _context(execution: ExecutionRecord, outputs: dict[str, Any]) -> dict[str, Any]:
    """What a node's templates see: the execution and its needs' outputs."""
    return planning.template_context(
        execution_id=str(execution.id),
        workflow_input=execution.input,
        outputs=outputs,
        scheduled_for=execution.scheduled_for,
    )


def enqueue_ready(
    store: SqlStore, execution: ExecutionRecord, workflow: Workflow, node: Node, now: datetime
) -> Dispatch | None:
    """Enqueue a node whose needs have all settled, with their outputs in its context."""
    rows = store.node_rows(execution.id, node.needs)
    context = _context(execution, {need: row.output for need, row in rows.items()})
    found = _enqueue_nodes(store, execution, workflow, [(node, context)], now)
    return found[0] if found else None  # none: a delay node's job waits for its time


def _enqueue_nodes(
    store: SqlStore,
    execution: ExecutionRecord,
    workflow: Workflow,
    ready: list[tuple[Node, dict[str, Any]]],
    now: datetime,
    state_queued: bool = False,
) -> list[Dispatch]:
    """Jobs for nodes ready to run (one INSERT), their states queued (one UPDATE); the
    messages to publish (a delay node's job waits in the database for the promoter)."""
    if not ready:
        return []
    jobs = _new_jobs(workflow, ready, now)
    store.add_node_jobs(execution, jobs, now)
    if not state_queued:
        store.queue_nodes(execution.id, [j.node_id for j in jobs])
    return _node_dispatches(execution, jobs, now)


# Who waits for a trigger's answer: a template over its budget is theirs to fix, told at once.
# An event, a webhook delivery or a schedule starting the run is not: its node fails, recorded
# (refusing would roll back every workflow the event starts, or a delivery retried forever).
_CALLERS = frozenset({TriggerSource.API, TriggerSource.CLI})


def _new_jobs(
    workflow: Workflow,
    ready: list[tuple[Node, dict[str, Any]]],
    now: datetime,
    *,
    refuse: bool = False,
) -> list[NewJob]:
    """A job per node ready to run; a delay node's is held until its time. With ``refuse``,
    a delay template over its budget is raised (a trigger's 422, nothing stored)."""
    jobs: list[NewJob] = []
    for node, context in ready:
        next_run_at = None
        if node_types.waits(node):
            try:
                next_run_at = now + timedelta(seconds=planning.delay_seconds(node, context))
            except TemplateBudgetExceeded:
                if refuse:
                    raise
            except ConveyorError:
                next_run_at = None  # the node runs now and fails with the same error, recorded
        jobs.append(
            NewJob(
                id=new_id(),
                node_id=node.id,
                max_retries=workflow.retry_for(node).max_attempts - 1,
                next_run_at=next_run_at,
            )
        )
    return jobs


def _node_dispatches(
    execution: ExecutionRecord, jobs: list[NewJob], now: datetime
) -> list[Dispatch]:
    """The messages of new node jobs (not of those held until later)."""
    return [
        Dispatch(
            job_id=j.id,
            kind=JobKind.NODE,
            queue=NODE_QUEUE,
            priority=execution.priority,
            label=f"execution={execution.id} node={j.node_id}",
            hints=NodeHints(
                tenant_id=execution.tenant_id,
                workflow_id=execution.workflow_id,
                priority=execution.priority,
                enqueued_at=now,
                node_id=j.node_id,
            ),
        )
        for j in jobs
        if j.next_run_at is None
    ]


# -- running a node ------------------------------------------------------------------------


def claim_node(
    store: SqlStore,
    job_id: uuid.UUID,
    now: datetime,
    worker: str | None = None,
    hints: NodeHints | None = None,
) -> NodeRun | None:
    """queued -> processing, a new attempt row, and the inputs the node will read (read by
    the claim itself when the message's hints name the node)."""
    hinted = _hinted_needs(hints)
    # with its attempt and node started, and the outputs of the hinted needs
    claimed = store.claim_node_job(job_id, now, worker, needs=hinted[1] if hinted else ())
    if claimed is None:
        return None
    job, execution, outputs = claimed
    assert job.node_id is not None
    if execution.status.finished:  # the claim started nothing: cancel the job
        store.transition_job(job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, completed_at=now)
        store.set_node(execution.id, job.node_id, NodeStatus.CANCELLED, finished_at=now)
        return None
    workflow, _ = load_workflow(store, execution.workflow_id)
    node = workflow.node(job.node_id)
    if outputs is None or hinted is None or hinted[0] != job.node_id:
        rows = store.node_rows(execution.id, node.needs)
        outputs = {need: row.output for need, row in rows.items()}
    context = _context(execution, outputs)
    return NodeRun(job=job, execution=execution, workflow=workflow, node=node, context=context)


def _hinted_needs(hints: NodeHints | None) -> tuple[str, list[str]] | None:
    """The hinted node and its needs, when its definition is in this process's cache."""
    if hints is None or hints.node_id is None:
        return None
    cached = cached_workflow(hints.workflow_id)
    if cached is None:
        return None
    try:
        node = cached[0].node(hints.node_id)
    except KeyError:  # a hint naming no node of that version: the claim reads the job's
        return None
    return node.id, sorted(set(node.needs))


def complete_alone(
    store: SqlStore, run: NodeRun, output: Any, now: datetime, duration: float
) -> bool:
    """Record a successful try in one statement, for the caller to run alone (no
    transaction round trips), in the common cases where the database can: the node makes no
    successor ready (each still waits on another node), and, if nothing waits on it, the
    execution's output is its own output's to make should it be the last. False when the
    case is another (a successor becomes ready, an output to read, the execution or the job
    no longer running): nothing was changed, and :func:`complete_node` does it."""
    _, shape = load_workflow(store, run.execution.workflow_id)
    successors = shape.successors[run.node.id]
    finish = None
    if not successors:
        finish = _known_finish(run, shape, now, {run.node.id: output})
        if finish is None:
            return False  # it may be the last: the execution's output must be read
    branch = output.get("branch") if node_types.branches(run.node) else None
    return store.complete_running(
        run.job, run.node.id, output=output, branch=branch, now=now, duration=duration,
        successors=sorted(successors), finish=finish,
    )  # fmt: skip


def complete_node(
    store: SqlStore, run: NodeRun, output: Any, now: datetime, duration: float
) -> list[Dispatch]:
    """Record a successful try and start every successor that became ready."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    branch = output.get("branch") if node_types.branches(run.node) else None
    if store.complete_running(
        job, node_id, output=output, branch=branch, now=now, duration=duration
    ):  # the common case, in one statement where the database can
        return _settle(store, run, now, output)
    status = _status(store, execution_id)
    cancelled = status is not None and status.finished
    # A node that returns after its execution was cancelled (or failed elsewhere) keeps its
    # output for inspection but is recorded as cancelled: it may have stopped on ctx.cancelled.
    job_status, node_status = (
        (JobStatus.CANCELLED, NodeStatus.CANCELLED)
        if cancelled
        else (JobStatus.COMPLETED, NodeStatus.COMPLETED)
    )
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, job_status, try_number=job.try_number, completed_at=now,
        last_error=None,
    ):  # fmt: skip
        return []  # reclaimed meanwhile
    store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    store.set_node(
        execution_id,
        node_id,
        node_status,
        output=output,
        branch=branch,
        finished_at=now,
        error=f"execution {status.value} while the node ran" if cancelled and status else None,
    )
    if cancelled:
        return []
    return _settle(store, run, now, output)


def complete_stopped(
    store: SqlStore, run: NodeRun, output: Any, error: NodeCancelled, now: datetime,
    duration: float,
) -> Failed | None:  # fmt: skip
    """Record a try that returned after it was told to stop (``ctx.cancelled``): it may have
    stopped early, so what it returned may be partial. While its execution is still finished,
    the node is cancelled with that output kept (:func:`complete_node`; None). If the
    execution runs again, the stop was undone while the node ended (a dead letter requeued
    meanwhile): the try counts as stopped, as one that ended with ``error``, and the node
    runs again; its output is not taken for a successor's input."""
    status = _status(store, run.execution.id)
    if status is None or status.finished:
        complete_node(store, run, output, now, duration)
        return None
    return fail_node(store, run, error, now, duration)


def fail_node(
    store: SqlStore,
    run: NodeRun,
    error: BaseException,
    now: datetime,
    duration: float,
    rng: random.Random | None = None,
) -> Failed:
    """Record a failed try: wait and retry, or dead-letter and fail (or continue) the run."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    message = describe(error)
    retryable = is_retryable(error)
    store.finish_attempt(
        job.id,
        job.try_number,
        AttemptStatus.FAILED,
        now,
        duration,
        error=message,
        timed_out=isinstance(error, NodeTimeout),
    )
    status = _status(store, execution_id)
    if status is not None and status.finished:  # stopped because it was cancelled or failed
        if not store.transition_job(
            job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
            completed_at=now, last_error=message,
        ):  # fmt: skip
            return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
        store.set_node(execution_id, node_id, NodeStatus.CANCELLED, finished_at=now, error=message)
        return Failed(dispatches=[], outcome=JobStatus.CANCELLED)
    # The execution runs: a NodeCancelled means a cancel that was undone since.
    decision = (
        retry.decide_stopped(job.attempt)
        if isinstance(error, NodeCancelled)
        else retry.decide_failure(
            run.workflow.retry_for(run.node), attempt=job.attempt, retryable=retryable, rng=rng
        )
    )
    if decision.retry_in is not None:
        due = now + timedelta(seconds=decision.retry_in)
        if not store.schedule_retry(job.id, due, message, try_number=job.try_number):
            return Failed(dispatches=[], outcome=None)
        store.set_node(execution_id, node_id, NodeStatus.QUEUED, error=message)
        return Failed(dispatches=[], outcome=JobStatus.RETRY_WAIT, retry_in=decision.retry_in)
    if not store.transition_job(
        job.id,
        JobStatus.PROCESSING,
        JobStatus.DEAD_LETTER,
        try_number=job.try_number,
        completed_at=now,
        last_error=f"{message} ({decision.reason})",
    ):
        return Failed(dispatches=[], outcome=None)
    store.set_node(execution_id, node_id, NodeStatus.FAILED, finished_at=now, error=message)
    if run.node.continue_on_failure:
        return Failed(dispatches=_settle(store, run, now), outcome=JobStatus.DEAD_LETTER)
    store.cancel_unstarted(execution_id, now)
    store.finish_execution(
        execution_id,
        ExecutionStatus.FAILED,
        now,
        error=f"node {node_id!r} failed after {job.attempt} attempt(s): {message}",
    )
    return Failed(dispatches=[], outcome=JobStatus.DEAD_LETTER)


def _status(store: SqlStore, execution_id: uuid.UUID) -> ExecutionStatus | None:
    """The execution's status for a node's outcome: a finished one is read again under its
    row lock, so that an operator's requeue resuming it is seen, not raced."""
    status = store.execution_status(execution_id)
    if status is not None and status.finished:
        status = store.execution_status(execution_id, lock=True)
    return status


def reclaim(
    store: SqlStore, job: JobRecord, now: datetime, rng: random.Random | None = None
) -> Failed:
    """A node job whose worker stopped sending heartbeats: its try failed (the worker may
    have died of the node itself), and the retry policy decides what comes next."""
    execution = store.execution(job.execution_id)
    workflow, _ = load_workflow(store, job.workflow_id)
    assert job.node_id is not None
    run = NodeRun(
        job=job, execution=execution, workflow=workflow, node=workflow.node(job.node_id),
        context={},
    )  # fmt: skip
    error = WorkerLost("the worker running it stopped sending heartbeats")
    return fail_node(store, run, error, now, 0.0, rng)


def is_retryable(error: BaseException) -> bool:
    """Node errors say so themselves; a template error fails the same way every time."""
    if isinstance(error, NodeError):
        return error.retryable
    return not isinstance(error, TemplateError)


def describe(error: BaseException) -> str:
    text = (str(error) or error.__class__.__name__).replace("\x00", "")
    if isinstance(error, ConveyorError):
        return text
    return f"{error.__class__.__name__}: {text}"


def _settle(store: SqlStore, run: NodeRun, now: datetime, output: Any = None) -> list[Dispatch]:
    """Propagate a settled node to its successors; finish the execution when all settled.
    The caller has read the execution's status: it is not finished."""
    execution, workflow = run.execution, run.workflow
    _, shape = load_workflow(store, execution.workflow_id)
    dispatches: list[Dispatch] = []
    settled = 1
    frontier = [run.node.id]
    while frontier:
        done = frontier.pop()
        successors = sorted(shape.successors[done])  # sorted: one lock order
        if not successors:
            continue
        left = store.decrement_waiting(execution.id, successors)
        ready = [workflow.node(s) for s in successors if left[s] == 0]
        if not ready:
            continue
        # Their needs' rows, all at once. A ready node never needs another ready one: that
        # one has not settled, so the first would still be waiting on it. Outputs only for a
        # delay node (its delay may be a template): a node's claim reads its needs' outputs.
        delays = any(node_types.waits(n) for n in ready)
        needs_of_ready = {need for n in ready for need in n.needs}
        rows = store.node_rows(execution.id, needs_of_ready, outputs=delays)
        runnable: list[tuple[Node, dict[str, Any]]] = []
        for successor in ready:
            needs = {
                need: planning.NeedState(status=rows[need].status, branch=rows[need].branch)
                for need in successor.needs
            }
            if planning.readiness(workflow, successor, needs) is planning.Readiness.SKIP:
                store.set_node(execution.id, successor.id, NodeStatus.SKIPPED, finished_at=now)
                settled += 1
                frontier.append(successor.id)
                continue
            outputs = {need: rows[need].output for need in successor.needs} if delays else {}
            runnable.append((successor, _context(execution, outputs)))
        dispatches += _enqueue_nodes(store, execution, workflow, runnable, now)
    known = {} if output is None else {run.node.id: output}
    finish = _known_finish(run, shape, now, known)
    remaining = store.settle_nodes(execution.id, settled, finish)  # last: it locks the row
    if remaining == 0 and finish is None:
        _finish(store, run, shape, now, known)
    return dispatches


def _known_finish(
    run: NodeRun, shape: planning.Plan, now: datetime, known: dict[str, Any]
) -> Finish | None:
    """How the execution completes if this settle proves its last, when the outputs in
    hand are all its output reads (the usual case of a sink): the settle completes it in
    the same statement. None: the outputs must be read (or the output fails to render)."""
    if not planning.output_reads(run.workflow, shape.sinks) <= known.keys():
        return None
    try:
        output = planning.execution_output(
            run.workflow, shape.sinks, known, _context(run.execution, known)
        )
    except ConveyorError:
        return None  # _finish fails the execution with the error
    return Finish(output=output, now=now)


def _finish(
    store: SqlStore,
    run: NodeRun,
    shape: planning.Plan,
    now: datetime,
    known: dict[str, Any],
) -> None:
    """Complete the execution with its output (or fail it, if the output cannot be made);
    ``known``: outputs already in hand, not read again."""
    execution = run.execution
    rows = store.node_rows(execution.id, [n.id for n in run.workflow.nodes if n.id not in known])
    outputs = {**{node_id: row.output for node_id, row in rows.items()}, **known}
    context = _context(execution, outputs)
    try:
        output = planning.execution_output(run.workflow, shape.sinks, outputs, context)
    except ConveyorError as exc:
        store.finish_execution(
            execution.id, ExecutionStatus.FAILED, now, error=f"workflow output failed: {exc}"
        )
        return
    store.finish_execution(execution.id, ExecutionStatus.COMPLETED, now, output=output)


# -- operator actions and maintenance ------------------------------------------------------


def cancel_execution(store: SqlStore, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
    """Cancel pending nodes now; running nodes see the status and are asked to stop. Returns
    the node jobs cancelled before they ran (the limiter forgets them)."""
    status = store.execution(execution_id).status
    if status.finished:
        raise InvalidTransition(
            f"execution {execution_id} is already {status.value}; only pending or running "
            f"executions can be cancelled"
        )
    cancelled = store.cancel_unstarted(execution_id, now)
    if not store.finish_execution(
        execution_id, ExecutionStatus.CANCELLED, now, error="cancelled by request"
    ):  # it finished meanwhile; raising rolls back the cancellations above
        raise InvalidTransition(f"execution {execution_id} finished before it could be cancelled")
    return cancelled


def promote_due(store: SqlStore, now: datetime, limit: int = 500) -> list[Dispatch]:
    """Queue the retry and delay jobs whose time has come."""
    return [dispatch_of(j) for j in store.promote_due(now, limit)]


def age_queued(
    store: SqlStore, now: datetime, age_after: float, limit: int = 500
) -> list[Dispatch]:
    """Serve low jobs queued longer than ``age_after`` seconds as normal (re-published)."""
    return [dispatch_of(j) for j in store.age_queued(now - timedelta(seconds=age_after), limit)]


def dispatch_of(job: JobRecord) -> Dispatch:
    """The message that publishes a job."""
    hints = None
    if job.kind is JobKind.NODE and job.enqueued_at is not None:
        hints = NodeHints(
            tenant_id=job.tenant_id,
            workflow_id=job.workflow_id,
            priority=job.priority,
            enqueued_at=job.enqueued_at,
            node_id=job.node_id,
        )
    return Dispatch(
        job_id=job.id, kind=job.kind, queue=job.queue, priority=job.priority, label=job.label,
        hints=hints,
    )  # fmt: skip
