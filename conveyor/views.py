"""The stable JSON shapes of executions and workflows, shared by the CLI (``--json``) and the
REST API. Built from the store's rows; UUIDs are strings, timestamps ISO 8601 in UTC, enums
their string values (see docs/cli.md)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from typing_extensions import TypedDict  # pydantic (the API) needs it before Python 3.12

from conveyor.engine.records import FollowUp, WorkflowRecord
from conveyor.engine.states import ACTIVE_EXECUTION, AttemptStatus, JobStatus
from conveyor.models import Execution, ExecutionRerun, Job, JobAttempt, NodeState
from conveyor.store.listing import ExecutionFilter

if TYPE_CHECKING:
    from conveyor.store.listing import StatusCount
    from conveyor.store.sql_store import SqlStore


class AttemptJson(TypedDict):
    number: int
    status: str
    error: str | None
    traceback: str | None  # a failed try's, cut (engine.failure.TRACEBACK_CHARS)
    worker: str | None
    started_at: str
    finished_at: str | None
    duration: float | None
    timed_out: bool


class JobJson(TypedDict):
    id: str
    kind: str
    node: str | None
    queue: str
    status: str
    priority: str
    next_run_at: str | None
    last_error: str | None
    heartbeat_at: str | None  # last renewed by the worker running it (processing only)
    attempts: list[AttemptJson]


class FailedItemJson(TypedDict):
    index: int
    job_id: str
    error: str | None


class ItemsJson(TypedDict):
    """A map node's items summed up (never listed here: ``executions show --items``)."""

    total: int
    left: int  # not settled yet
    failed: int  # dead after their tries
    statuses: dict[str, int]  # the items' jobs counted by status
    failures: list[FailedItemJson]  # the first failed ones, by index (at most FAILURES_SHOWN)


class ItemJson(TypedDict):
    """One item of a map node (``executions show --items``, the API's items route)."""

    index: int
    job_id: str
    status: str
    item: Any
    output: Any
    error: str | None
    attempts: int
    started_at: str | None
    finished_at: str | None
    child: str | None  # a map of children's item: the child execution its latest try started


class NodeJson(TypedDict):
    id: str
    status: str
    branch: str | None
    # A workflow node: the child execution its latest try started (None: none, another type
    # of node, or a map of children: its items' children are listed with their index)
    child: str | None
    attempts: int
    snoozes: int
    output: Any
    error: str | None
    started_at: str | None
    finished_at: str | None
    duration: float | None
    # While the node runs: the worker holding it, its last heartbeat and that heartbeat's age
    # in seconds when read (a worker renews it every CONVEYOR_HEARTBEAT_INTERVAL seconds).
    worker: str | None
    heartbeat_at: str | None
    heartbeat_age: float | None
    items: ItemsJson | None  # a map node's, once it made its items; None otherwise


class ExecutionSummaryJson(TypedDict):
    id: str
    workflow: str
    version: int
    status: str
    priority: str
    trigger: str
    error: str | None
    created_at: str
    # when it was to start: a trigger's run_at (it waits, pending, until then) or the slot of
    # the schedule that started it; None for a run started at once
    scheduled_for: str | None
    started_at: str | None
    finished_at: str | None
    duration: float | None
    # a child's parent execution (a workflow node of it started this one); None: not a child
    parent_execution_id: str | None


class ParentJson(TypedDict):
    """The workflow node that started a child: its execution, workflow (None once the
    parent was deleted by retention), node, job and the try of that job."""

    execution_id: str
    workflow: str | None
    node: str
    job_id: str
    try_number: int
    item_index: int | None  # the node maps: the item whose try started it


class ChildJson(ExecutionSummaryJson):
    """A child, as its parent lists it: which node (and item of a map) and try of that node
    started it."""

    node: str
    try_number: int
    item_index: int | None


class FollowUpJson(TypedDict):
    status: str  # "pending": it starts when the execution completes or fails
    input: Any  # the latest input left; None when over FOLLOW_UP_SHOWN_BYTES (see input_bytes)
    input_bytes: int  # the input's size as JSON
    left_at: str | None  # when the latest input was left (None: not recorded)


# A follow-up's input larger than this, as JSON, is shown by its size alone
FOLLOW_UP_SHOWN_BYTES = 65_536


class RerunJson(TypedDict):
    from_node: str
    input: Any  # given to that node in place of its rendered inputs; None: its templates
    requested_by: str  # the API key's name, or "cli:<os user>"
    requested_at: str


class ExecutionJson(ExecutionSummaryJson):
    # limits its trigger gave, overriding the definition's (None: the definition's)
    max_attempts: int | None
    timeout: float | None
    input: Any
    output: Any
    # the run a newer trigger with its dedupe key left on it while active (dedupe policy
    # follow_up, or replace once started); None: none
    follow_up: FollowUpJson | None
    depth: int  # how many parents it has (0: no workflow node started it)
    parent: ParentJson | None
    # the children its workflow nodes started (every try's), newest first: the newest
    # CHILDREN_SHOWN of children_count (GET /v1/executions/{id}/children pages through all)
    children: list[ChildJson]
    children_count: int
    nodes: list[NodeJson]
    jobs: list[JobJson]
    reruns: list[RerunJson]  # who re-ran it from which node, oldest first


# How many children an execution's view lists (its newest); the rest are paged through.
CHILDREN_SHOWN = 100


class StatusCountJson(TypedDict):
    workflow: str
    status: str
    count: int
    oldest: str  # the first created, ISO 8601
    newest: str  # the last created
    average_attempts: float  # tries of their jobs per execution


def status_count_json(row: StatusCount) -> StatusCountJson:
    return {
        "workflow": row.workflow,
        "status": row.status.value,
        "count": row.count,
        "oldest": iso(row.oldest) or "",
        "newest": iso(row.newest) or "",
        "average_attempts": round(row.attempts / row.count, 2),
    }


class WorkflowJson(TypedDict):
    id: str
    name: str
    version: int
    description: str
    nodes: int
    digest: str
    created_at: str


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def execution_summary(row: Execution, workflow: str, version: int) -> ExecutionSummaryJson:
    return {
        "id": str(row.id),
        "workflow": workflow,
        "version": version,
        "status": row.status.value,
        "priority": row.priority.value,
        "trigger": row.trigger,
        "error": row.error,
        "created_at": iso(row.created_at) or "",
        "scheduled_for": iso(row.scheduled_for),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration": seconds(row.started_at, row.finished_at),
        "parent_execution_id": str(row.parent_execution_id) if row.parent_execution_id else None,
    }


def child_json(
    row: Execution, workflow: str, version: int, item_index: int | None = None
) -> ChildJson:
    return {
        **execution_summary(row, workflow, version),
        "node": row.parent_node_id or "",
        "try_number": row.parent_try or 0,
        "item_index": item_index,
    }


def children_json(store: SqlStore, rows: Sequence[tuple[Execution, str, int]]) -> list[ChildJson]:
    """Children as listed, each with its item's index when a map of children started it."""
    indices = store.item_indices({e.parent_job_id for e, _, _ in rows if e.parent_job_id})
    return [
        child_json(e, name, version, indices.get(e.parent_job_id) if e.parent_job_id else None)
        for e, name, version in rows
    ]


def items_json(
    store: SqlStore,
    execution_id: uuid.UUID,
    node_id: str,
    *,
    after: int | None,
    limit: int,
    status: JobStatus | None,
) -> list[ItemJson]:
    """A page of a map node's items, each with the child its latest try started (a map of
    children's)."""
    rows = store.execution_items(execution_id, node_id, after=after, limit=limit, status=status)
    started = store.started_children([job.id for job, _ in rows])
    return [item_json(job, attempts, started.get(job.id)) for job, attempts in rows]


# The failed items of an execution's maps an execution's view lists (the counts say the rest).
FAILURES_SHOWN = 20


def execution_view(store: SqlStore, execution_id: uuid.UUID) -> ExecutionJson:
    """One execution as shown to people: its nodes (a map's items summed up), its jobs
    with every attempt (not its maps' items'), and its links: the parent's node that started
    it, and the children its nodes started."""
    row = store.execution_row(execution_id)
    nodes = store.execution_nodes(execution_id)
    mapped = any(n.items_total is not None for n in nodes)
    parent, parent_item = None, None
    if row.parent_execution_id is not None:
        parent = store.workflow_of(row.parent_execution_id)
    if row.parent_job_id is not None:
        parent_item = store.item_indices([row.parent_job_id]).get(row.parent_job_id)
    kids = store.list_executions(None, where=ExecutionFilter(parent=execution_id),
                                 limit=CHILDREN_SHOWN)  # fmt: skip
    return execution_json(
        row,
        store.workflow(row.workflow_id),
        nodes,
        store.execution_jobs(execution_id),
        store.execution_reruns(execution_id) if row.reruns else [],
        store.item_counts(execution_id) if mapped else {},
        store.failed_items(execution_id, FAILURES_SHOWN) if mapped else [],
        parent_workflow=parent[0] if parent else None,
        parent_item=parent_item,
        children=children_json(store, kids),
        children_count=len(kids)
        if len(kids) < CHILDREN_SHOWN
        else store.children_count(execution_id),
    )


def execution_json(
    row: Execution,
    workflow: WorkflowRecord,
    nodes: Sequence[NodeState],
    jobs: Sequence[tuple[Job, list[JobAttempt]]],
    reruns: Sequence[ExecutionRerun] = (),
    item_counts: dict[str, dict[JobStatus, int]] | None = None,
    failed_items: Sequence[Job] = (),
    *,
    parent_workflow: str | None = None,
    parent_item: int | None = None,
    children: Sequence[ChildJson] = (),
    children_count: int = 0,
) -> ExecutionJson:
    by_node = {job.node_id: (job, attempts) for job, attempts in jobs if job.node_id}
    latest_child: dict[str, str] = {}
    for child in reversed(children):  # oldest first: the latest try's child stays
        if child["item_index"] is None:  # (a map's are its items')
            latest_child[child["node"]] = child["id"]
    now = datetime.now(UTC)
    counts = item_counts or {}
    return {
        **execution_summary(row, workflow.name, workflow.version),
        "max_attempts": row.max_attempts,
        "timeout": row.timeout,
        "input": row.input,
        "output": row.output,
        "follow_up": _follow_up_json(row),
        "depth": row.depth,
        "parent": _parent_json(row, parent_workflow, parent_item),
        "children": list(children),
        "children_count": children_count,
        "nodes": [
            _node_json(
                n,
                by_node.get(n.node_id),
                now,
                _items_json(n, counts, failed_items),
                latest_child.get(n.node_id),
            )
            for n in nodes
        ],
        "jobs": [_job_json(job, attempts) for job, attempts in jobs],
        "reruns": [_rerun_json(r) for r in reruns],
    }


def _rerun_json(row: ExecutionRerun) -> RerunJson:
    return {
        "from_node": row.from_node,
        "input": row.input,
        "requested_by": row.requested_by,
        "requested_at": iso(row.requested_at) or "",
    }


def _follow_up_json(row: Execution) -> FollowUpJson | None:
    """The follow-up left on an active execution; one left on a cancelled execution never
    runs, and a finished one's was taken (started) as it finished."""
    if row.follow_up is None or row.status not in ACTIVE_EXECUTION:
        return None
    value = row.follow_up.get("input")
    # ASCII (json.dumps escapes the rest): its length is its size in bytes
    size = len(json.dumps(value, separators=(",", ":")))
    return {
        "status": "pending",
        "input": value if size <= FOLLOW_UP_SHOWN_BYTES else None,
        "input_bytes": size,
        "left_at": iso(FollowUp.left_at_of(row.follow_up)),
    }


def _items_json(
    row: NodeState, counts: dict[str, dict[JobStatus, int]], failed: Sequence[Job]
) -> ItemsJson | None:
    if row.items_total is None:
        return None
    statuses = counts.get(row.node_id, {})
    return {
        "total": row.items_total,
        "left": row.items_left or 0,
        "failed": row.items_failed or 0,
        "statuses": {status.value: n for status, n in sorted(statuses.items())},
        "failures": [
            {"index": j.item_index or 0, "job_id": str(j.id), "error": j.last_error}
            for j in failed
            if j.node_id == row.node_id
        ],
    }


def item_json(row: Job, attempts: list[JobAttempt], child: uuid.UUID | None = None) -> ItemJson:
    tries = [a for a in attempts if a.status is not AttemptStatus.SNOOZED]
    return {
        "index": row.item_index or 0,
        "job_id": str(row.id),
        "status": row.status.value,
        "item": row.item,
        "output": row.output,
        "error": row.last_error,
        "attempts": len(tries),
        "started_at": iso(attempts[0].started_at) if attempts else None,
        "finished_at": iso(row.completed_at),
        "child": str(child) if child else None,
    }


def _parent_json(
    row: Execution, workflow: str | None, item_index: int | None = None
) -> ParentJson | None:
    if row.parent_execution_id is None or row.parent_node_id is None:
        return None
    return {
        "execution_id": str(row.parent_execution_id),
        "workflow": workflow,
        "node": row.parent_node_id,
        "job_id": str(row.parent_job_id),
        "try_number": row.parent_try or 0,
        "item_index": item_index,
    }


def _node_json(
    row: NodeState,
    job: tuple[Job, list[JobAttempt]] | None,
    now: datetime,
    items: ItemsJson | None = None,
    child: str | None = None,
) -> NodeJson:
    attempts = job[1] if job is not None else []
    snoozes = sum(1 for a in attempts if a.status is AttemptStatus.SNOOZED)
    beat = (
        job[0].heartbeat_at if job is not None and job[0].status == JobStatus.PROCESSING else None
    )
    running = [a.worker for a in attempts if a.status == AttemptStatus.RUNNING]
    return {
        "id": row.node_id,
        "status": row.status.value,
        "branch": row.branch,
        "child": child,
        "attempts": len(attempts) - snoozes,
        "snoozes": snoozes,
        "output": row.output,
        "error": row.error,
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration": seconds(row.started_at, row.finished_at),
        "worker": running[-1] if beat is not None and running else None,
        "heartbeat_at": iso(beat),
        "heartbeat_age": seconds(beat, now) if beat is not None else None,
        "items": items,
    }


def _job_json(row: Job, attempts: list[JobAttempt]) -> JobJson:
    return {
        "id": str(row.id),
        "kind": row.kind.value,
        "node": row.node_id,
        "queue": row.queue,
        "status": row.status.value,
        "priority": row.priority.value,
        "next_run_at": iso(row.next_run_at),
        "last_error": row.last_error,
        "heartbeat_at": iso(row.heartbeat_at) if row.status == JobStatus.PROCESSING else None,
        "attempts": [_attempt_json(a) for a in attempts],
    }


def _attempt_json(row: JobAttempt) -> AttemptJson:
    return {
        "number": row.attempt_number,
        "status": row.status.value,
        "error": row.error,
        "traceback": row.traceback,
        "worker": row.worker,
        "started_at": iso(row.started_at) or "",
        "finished_at": iso(row.finished_at),
        "duration": round(row.duration, 3) if row.duration is not None else None,
        "timed_out": row.timed_out,
    }


def workflow_json(record: WorkflowRecord) -> WorkflowJson:
    definition = record.definition
    return {
        "id": str(record.id),
        "name": record.name,
        "version": record.version,
        "description": str(definition.get("description", "")),
        "nodes": len(definition.get("nodes", [])),
        "digest": record.digest,
        "created_at": iso(record.created_at) or "",
    }


class DeadLetterJson(TypedDict):
    job_id: str
    execution_id: str
    tenant: str
    workflow: str
    node: str | None
    item_index: int | None  # a map's item: its index in the list (None: a node's own job)
    # A workflow node's (or a map of children's item's): the child execution its last try
    # started, whose failure this records
    child_execution_id: str | None
    # In a child execution: its parent (rerun the parent from its node, not this)
    parent_execution_id: str | None
    status: str  # dead_letter, or discarded (the archive)
    error: str | None
    tries: int
    dead_at: str | None  # when it was dead-lettered (discarded, for the archive)


def dead_letter_json(
    row: Job,
    workflow: str,
    tenant: str,
    child_id: uuid.UUID | None = None,
    parent_id: uuid.UUID | None = None,
) -> DeadLetterJson:
    return {
        "job_id": str(row.id),
        "execution_id": str(row.execution_id),
        "tenant": tenant,
        "workflow": workflow,
        "node": row.node_id,
        "item_index": row.item_index,
        "child_execution_id": str(child_id) if child_id else None,
        "parent_execution_id": str(parent_id) if parent_id else None,
        "status": row.status.value,
        "error": row.last_error,
        "tries": row.tries_before + row.retry_count + 1,
        "dead_at": iso(row.completed_at),
    }


class DeadLetterDetailJson(DeadLetterJson):
    attempts: list[AttemptJson]


def dead_letter_view(store: SqlStore, job_id: uuid.UUID) -> DeadLetterDetailJson:
    """A dead letter with every try it ever made."""
    for job, attempts in store.dead_letter_history(job_id):
        return {**dead_letter_json(*job), "attempts": [_attempt_json(a) for a in attempts]}
    raise ValueError(job_id)  # pragma: no cover - the caller checked it exists


# Job statuses of work that goes on without anything from outside (run, wait for a time, a
# permit or a child).
_MOVING = frozenset({"queued", "parked", "processing", "retry_wait", "scheduled", "waiting_child"})


def waits_for_events_only(view: ExecutionJson) -> bool:
    """Whether an unfinished execution has a wait node waiting for its event and nothing
    else under way: only an event (or a wait's timeout) moves it on."""
    statuses = {job["status"] for job in view["jobs"]}
    return "waiting_event" in statuses and not statuses & _MOVING
