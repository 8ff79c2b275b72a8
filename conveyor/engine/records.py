"""Frozen values the engine reads from the store; separate from the ORM classes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from conveyor.engine.cron import MisfirePolicy
from conveyor.engine.states import (
    DeliveryStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    ScheduleOrigin,
    SignatureScheme,
    TriggerSource,
)


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    id: uuid.UUID
    kind: JobKind
    queue: str
    status: JobStatus
    priority: Priority
    max_retries: int
    retry_count: int
    tries_before: int = 0  # tries made before an operator last requeued it
    enqueued_at: datetime | None = None  # when it was last queued (created, promoted, requeued)
    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    execution_id: uuid.UUID
    node_id: str | None
    # its workflow's name, from the statements whose jobs are published (promoted, aged, found
    # lost): the message is named without loading the definition; "" where not read
    workflow: str = ""
    # A map's item (see conveyor.engine.mapping): its index in the list and its value; None
    # for every other job (a map node's own job, which makes the items, included).
    item_index: int | None = None
    item: Any = None

    @property
    def attempt(self) -> int:
        """The 1-based number of the try this claim starts, as the retry policy counts it
        (from 1 again after a requeue)."""
        return self.retry_count + 1

    @property
    def try_number(self) -> int:
        """The number of its ``job_attempts`` row: every try the job ever made counts."""
        return self.tries_before + self.retry_count + 1


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A node job about to be inserted (its execution's fields come from the execution)."""

    id: uuid.UUID
    node_id: str
    max_retries: int
    next_run_at: datetime | None = None  # a delay node's: held until then


@dataclass(frozen=True, kw_only=True)
class NewItem:
    """A map's item job about to be inserted: queued, or ``held`` (no message) until the item
    a window before it settles and makes room in the map's window."""

    id: uuid.UUID
    index: int
    item: Any
    held: bool = False
    # The index of the held item this one releases when it settles: the item a window after
    # it (None: there is none). A settle finds it by the map's key (execution, node, index),
    # whatever the table's statistics say, and whichever job a re-run map gave that index.
    releases: int | None = None

    @property
    def data(self) -> dict[str, Any]:
        """The item job's ``data``: the index of the held item it releases, if any."""
        return {} if self.releases is None else {"releases": self.releases}


@dataclass(frozen=True, kw_only=True)
class ItemsLeft:
    """A map's counter after one more of its items settled: the items not settled yet, the
    failed ones so far, and the held item the settle released (None: none was held)."""

    left: int
    failed: int
    released: JobRecord | None = None


@dataclass(frozen=True, kw_only=True)
class Succeeded:
    """A node's successful try, for a store to record: its job (in the try that succeeded),
    its node, its output and the branch that output took, when and how long it ran, and its
    execution as the try's claim read it."""

    job: JobRecord
    node_id: str
    output: Any
    branch: str | None
    now: datetime
    duration: float
    execution: ExecutionRecord


@dataclass(frozen=True, kw_only=True)
class Stepped:
    """A chain's step recorded in one unit (:meth:`~conveyor.engine.ports.Jobs.complete_step`):
    the next node's job ``claimed`` for the worker that recorded it (the job, its execution,
    the outputs its claim read), or None: queued, its message to publish."""

    claimed: tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ItemRow:
    """A settled item of a map, as its node's output is made of them."""

    index: int
    status: JobStatus
    output: Any = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED_ITEM


# An item that is one of these failed: its slot in its map's output is ERROR_SLOT with its
# error (under ``continue``).
FAILED_ITEM = (JobStatus.DEAD_LETTER, JobStatus.DISCARDED)
ERROR_SLOT = '{"error": ""}'


# The longest tracestate stored (the executions' and deliveries' columns); W3C lets a
# propagator drop list members from the end to fit a limit, which tracing.current_context does.
TRACESTATE_CHARS = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceContext:
    """The W3C trace context an execution's tries join: the ``traceparent`` (and
    ``tracestate``) of where it was triggered, stored with the execution (see
    :mod:`conveyor.tracing`)."""

    traceparent: str
    tracestate: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExecutionRecord:
    id: uuid.UUID
    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    status: ExecutionStatus
    priority: Priority
    input: Any
    created_at: datetime
    # when it was to start: a schedule's slot, or a trigger's run_at (it waits until then)
    scheduled_for: datetime | None = None
    trace: TraceContext | None = None  # None: its tries' trace is made from its id
    limits: Limits | None = None  # its trigger's, overriding the definition's
    # how many times an operator re-ran it from a node: its nodes' jobs may be held
    # (JobStatus.HELD), and a node may have an input a rerun gave it
    reruns: int = 0
    parent: ParentLink | None = None  # the workflow node that started it (None: not a child)
    depth: int = 0  # how many parents it has: 0 for an execution no node started


@dataclass(frozen=True, kw_only=True, slots=True)
class ParentLink:
    """The node job that started a child execution and waits for it: the parent execution,
    the node, its job and the try of that job that started the child. A child is one per
    (job, try): a duplicate start finds the key taken, and only that try's wait is settled
    by the child's finish."""

    execution_id: uuid.UUID
    node_id: str
    job_id: uuid.UUID
    try_number: int


@dataclass(frozen=True, kw_only=True)
class ExecutionOutcome:
    """How an execution ended (or where it stands), as a parent's node reads its child:
    its status, output and error, when it was made, and its first dead letter (the job and
    its node; None: none)."""

    status: ExecutionStatus
    output: Any
    error: str | None
    created_at: datetime
    dead_letter: tuple[uuid.UUID, str] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Limits a trigger gives its execution, overriding its definition's for every node:
    ``max_attempts`` of each node job, ``timeout`` seconds of each try (None: the
    definition's)."""

    max_attempts: int | None = None
    timeout: float | None = None

    @classmethod
    def of(cls, max_attempts: int | None, timeout: float | None) -> Limits | None:
        """The limits, or None when neither is given."""
        if max_attempts is None and timeout is None:
            return None
        return cls(max_attempts=max_attempts, timeout=timeout)


@dataclass(frozen=True, kw_only=True)
class WorkflowRecord:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    version: int
    digest: str
    definition: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class NodeHints:
    """What a node job's message carries besides its id, so that taking the job's permits
    needs no database read (its tenant, its workflow version, its priority and when it was
    queued) and its claim reads its needs' outputs too (its node). Hints only: the job in
    the database decides; a message without them is admitted and claimed as before."""

    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    priority: Priority
    enqueued_at: datetime
    node_id: str | None = None  # the claim then reads the outputs of its needs at once
    workflow: str | None = None  # its name, for operators: a message handed back shows it


@dataclass(frozen=True, kw_only=True)
class Dispatch:
    """A message to publish once the transaction that created its job has committed."""

    job_id: uuid.UUID
    kind: JobKind
    queue: str
    priority: Priority
    label: str = ""  # ids for operators (Flower shows them in the task's arguments)
    hints: NodeHints | None = None  # a node job's, for its admission
    # What Flower shows as the task's name (``workflow/node``, or the workflow for a start
    # job) and in its arguments; empty when the publisher cannot tell (a delivery).
    workflow: str = ""
    node: str = ""


@dataclass(frozen=True, kw_only=True)
class AfterCommit:
    """What a transition leaves its caller to do once its unit of work has committed: publish
    ``dispatches``, and have the limiter forget ``forget``, the node jobs it cancelled before
    they ran (their places in the limiter's lines, and a grant one may hold, go to the next
    jobs at once, not at the limiter's sweep)."""

    dispatches: list[Dispatch] = field(default_factory=list)
    forget: list[uuid.UUID] = field(default_factory=list)

    def __add__(self, other: AfterCommit) -> AfterCommit:
        return AfterCommit(
            dispatches=self.dispatches + other.dispatches, forget=self.forget + other.forget
        )


class Created(Enum):
    """What inserting an execution came to."""

    CREATED = "created"
    KEY_TAKEN = "key taken"  # its idempotency or deduplication key: nothing inserted
    STALE = "stale"  # its workflow version is not the latest any more: nothing inserted


@dataclass(frozen=True, kw_only=True)
class FollowUp:
    """The run a finished execution leaves (dedupe policy follow_up): its tenant's and
    workflow's names, its deduplication key, the latest input a trigger gave, and the
    finished one's priority and trigger source, which it keeps."""

    tenant: str
    workflow: str
    dedupe_key: str
    input: Any
    priority: Priority
    source: TriggerSource
    left_at: datetime | None = None  # when the latest input was left (None: not recorded)

    @staticmethod
    def stored(input: Any, now: datetime) -> dict[str, Any]:
        """The value of an execution's ``follow_up`` column: the latest input, and when it
        was left (ISO 8601 in UTC, a JSON column holding no datetime)."""
        return {"input": input, "left_at": now.astimezone(UTC).isoformat()}

    @staticmethod
    def left_at_of(stored: dict[str, Any]) -> datetime | None:
        """When a stored follow-up was left (None: left by a version that did not say)."""
        left = stored.get("left_at")
        return datetime.fromisoformat(left) if isinstance(left, str) else None


@dataclass(frozen=True, kw_only=True)
class Finish:
    """How an execution completes should a settle prove its last: decided before the settle
    (from outputs in hand), so the settle and the completion are one statement."""

    output: Any
    now: datetime


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A job as the limiter sees it before the job is claimed."""

    job_id: uuid.UUID
    status: JobStatus
    kind: JobKind
    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    priority: Priority
    enqueued_at: datetime
    tenant_concurrency: int | None
    node_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    workflow_name: str
    origin: ScheduleOrigin
    cron: str
    timezone: str
    input: dict[str, Any]
    priority: Priority | None
    misfire: MisfirePolicy
    catch_up: int
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None
    run_count: int


@dataclass(frozen=True, kw_only=True)
class Fire:
    """One run a schedule starts: the execution and its start job, for one slot."""

    schedule: ScheduleRecord
    workflow_id: uuid.UUID
    slot: datetime
    priority: Priority
    trace: TraceContext | None = None  # its trigger span's, stored with the execution


@dataclass(frozen=True, kw_only=True)
class Advance:
    """A checked schedule's new state: its next slot, and the runs it started just now."""

    schedule_id: uuid.UUID
    next_run_at: datetime
    started: int


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeRow:
    """A node's state in one execution, as the engine reads it (``output`` is None when the
    read left outputs out)."""

    node_id: str
    status: NodeStatus
    branch: str | None = None
    output: Any = None
    error: str | None = None
    items_total: int | None = None  # a map node's items, once it made them (None: not a map)


@dataclass(frozen=True, kw_only=True)
class TenantRef:
    """Who an API call acts for."""

    id: uuid.UUID
    name: str
    key: str | None = None  # the name of the API key the call came with
    operator: bool = False  # the key is an operator's: its dashboard session sees every tenant


@dataclass(frozen=True, kw_only=True)
class EndpointRecord:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    scheme: SignatureScheme
    secret: str
    rejected: int
    # Its deliveries wake waits (see conveyor.engine.waits.wake_by_delivery); None: they don't.
    wakes_event: str | None = None
    wakes_key: str | None = None

    def __repr__(self) -> str:  # the secret never reaches a log through a repr
        return f"EndpointRecord(id={self.id}, name={self.name!r}, scheme={self.scheme.value})"


@dataclass(frozen=True, kw_only=True)
class DeliveryReceipt:
    """What the sender of a delivery is told: its id here, how far it went, and the executions
    it started. A sender retries on anything but a 2xx, so a repeat (a delivery id the
    endpoint received before) is told of the first one's outcome, and starts nothing."""

    id: uuid.UUID
    status: DeliveryStatus
    executions: tuple[uuid.UUID, ...] | None  # None: handled before they were recorded
    repeated: bool  # the endpoint had received this delivery id before


@dataclass(frozen=True, kw_only=True)
class DeliveryRecord:
    id: uuid.UUID
    endpoint_id: uuid.UUID
    endpoint_name: str
    tenant_id: uuid.UUID
    tenant_name: str
    delivery_id: str
    event: str | None
    payload: Any
    status: DeliveryStatus
    trace: TraceContext | None = None  # where it was received: its executions' tries join it
    # Its endpoint's templates of the event and key it wakes waits under (None: it wakes none).
    wakes_event: str | None = None
    wakes_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class EventRecord:
    """An application event kept for the waits that begin after it (``events``): its
    tenant, name and correlation key, what it carries, until ``expires_at``."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    key: str
    payload: Any
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, kw_only=True)
class WaitRecord:
    """A wait node's try waiting for its event (``waits``): the job and try, what it waits
    for (tenant, event name, key), since when events count (its execution's start) and until
    when it waits (None: no timeout)."""

    job_id: uuid.UUID
    try_number: int
    tenant_id: uuid.UUID
    execution_id: uuid.UUID
    node_id: str
    event: str
    key: str
    since: datetime
    timeout_at: datetime | None
    created_at: datetime
