"""The tables. PostgreSQL is the source of truth; the broker only carries job ids."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Enum,
    FetchedValue,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from conveyor.engine.cron import MisfirePolicy
from conveyor.engine.records import TRACESTATE_CHARS
from conveyor.engine.states import (
    AttemptStatus,
    DeliveryStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    ScheduleOrigin,
    SignatureScheme,
    SubscriptionKind,
)
from conveyor.ids import new_id
from conveyor.models.base import Base, JsonType, UTCDateTime, utcnow


def _enum(cls: type[Any], name: str) -> Enum:
    # Stored as short strings (no native PG enum) so adding a member needs no type migration.
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=False,
        length=16,
        values_callable=lambda e: [m.value for m in e],
    )


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Node jobs of this tenant that may run at once; None means the configured default.
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKey(Base):
    """A tenant's API key. Only its public prefix and the SHA-256 of the whole key are
    stored: the key is random (256 bits), so a fast hash is enough and a leaked table
    holds nothing usable."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # An operator's key (made only by `conveyor keys create --operator`): its dashboard
    # session sees every tenant. On /v1 it acts for its own tenant, as any key does.
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What the key's dashboard sessions are signed with (conveyor.ui.sessions): made at its
    # first sign-in, cleared at a sign-out, which so ends every session of the key.
    session_secret: Mapped[str | None] = mapped_column(String(64), nullable=True)


class WebhookEndpoint(Base):
    """Where a third party posts webhooks: ``POST /webhooks/{id}``, signed with ``secret``."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100))
    scheme: Mapped[SignatureScheme] = mapped_column(_enum(SignatureScheme, "signature_scheme"))
    # The HMAC key itself: verifying a signature needs it, so it cannot be hashed.
    secret: Mapped[str] = mapped_column(String(200))
    rejected: Mapped[int] = mapped_column(Integer, default=0)  # deliveries refused (signature)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Its deliveries wake waits: sent as the event this names (a template; None: the
    # delivery's type) under the key this template renders over the delivery. None: they don't.
    wakes_event: Mapped[str | None] = mapped_column(String(200), nullable=True)
    wakes_key: Mapped[str | None] = mapped_column(String(500), nullable=True)


class WebhookDelivery(Base):
    """A verified delivery; its sender's id is unique per endpoint, so a replay is refused."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("endpoint_id", "delivery_id"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_endpoints.id"))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    delivery_id: Mapped[str] = mapped_column(String(200))
    event: Mapped[str | None] = mapped_column(String(200), nullable=True)
    payload: Mapped[Any] = mapped_column(JsonType)
    status: Mapped[DeliveryStatus] = mapped_column(_enum(DeliveryStatus, "delivery_status"))
    executions: Mapped[int] = mapped_column(Integer, default=0)
    # The executions it started, as a repeat is answered; NULL for a delivery handled before
    # revision 0014 recorded them.
    execution_ids: Mapped[list[str] | None] = mapped_column(JsonType, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Where it was received (the trace context), passed on to the executions it starts.
    traceparent: Mapped[str | None] = mapped_column(String(55), nullable=True)
    tracestate: Mapped[str | None] = mapped_column(String(TRACESTATE_CHARS), nullable=True)


class WebhookSignature(Base):
    """A GitHub body's signature an endpoint received, and when: GitHub signs the body only,
    so the same body under a new delivery id is a replay, refused while ``seen_at`` is within
    CONVEYOR_WEBHOOK_REPLAY_WINDOW_DAYS. The key decides it, so two concurrent replays cannot
    both pass."""

    __tablename__ = "webhook_signatures"
    __table_args__ = (Index("ix_webhook_signatures_seen_at", "seen_at"),)  # the sweep's

    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # the HMAC, in hex
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Subscription(Base):
    """A workflow's declared trigger: an event type, or a webhook endpoint (and an optional
    event filter). Rewritten from the definition on every apply."""

    __tablename__ = "subscriptions"
    __table_args__ = (Index("ix_subscriptions_source", "tenant_id", "kind", "source"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    workflow_name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[SubscriptionKind] = mapped_column(_enum(SubscriptionKind, "subscription_kind"))
    source: Mapped[str] = mapped_column(String(200))  # the event type, or the endpoint name
    events: Mapped[list[str]] = mapped_column(JsonType, default=list)  # webhook event filter


class WorkflowVersion(Base):
    """One stored version of a workflow definition; executions pin the version they start."""

    __tablename__ = "workflows"
    __table_args__ = (UniqueConstraint("tenant_id", "name", "version"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    definition: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Schedule(Base):
    """A cron schedule of a workflow. ``next_run_at`` is its earliest slot not yet fired; the
    check claims rows whose slot has come, starts their runs and advances it, in one
    transaction."""

    __tablename__ = "schedules"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        Index(
            "ix_schedules_due",
            "next_run_at",
            postgresql_where=text("enabled"),
            sqlite_where=text("enabled"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100))
    workflow_name: Mapped[str] = mapped_column(String(200))
    origin: Mapped[ScheduleOrigin] = mapped_column(_enum(ScheduleOrigin, "schedule_origin"))
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    input: Mapped[dict[str, Any]] = mapped_column(JsonType)
    priority: Mapped[Priority | None] = mapped_column(_enum(Priority, "priority"), nullable=True)
    misfire: Mapped[MisfirePolicy] = mapped_column(_enum(MisfirePolicy, "misfire_policy"))
    catch_up: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(Boolean)
    next_run_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # When the check last started a run of it, and how many runs it has started.
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    run_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# A child still pending or running, as ix_executions_active_children holds it.
ACTIVE_CHILD = "parent_execution_id IS NOT NULL AND status IN ('pending', 'running')"


class Execution(Base):
    __tablename__ = "executions"
    __table_args__ = (
        Index("ix_executions_tenant_created", "tenant_id", "created_at"),
        # The listing's filters (conveyor executions list, GET /v1/executions): newest first
        # within a tenant's status or workflow, and every execution of a deduplication key.
        Index("ix_executions_tenant_status_created", "tenant_id", "status", "created_at"),
        Index("ix_executions_tenant_workflow_created", "tenant_id", "workflow_id", "created_at"),
        Index(
            "ix_executions_tenant_dedupe",
            "tenant_id",
            "dedupe_key",
            postgresql_where=text("dedupe_key IS NOT NULL"),
            sqlite_where=text("dedupe_key IS NOT NULL"),
        ),
        # A retried trigger with the same Idempotency-Key finds the execution it made.
        Index(
            "uq_executions_idempotency",
            "tenant_id",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
            sqlite_where=text("idempotency_key IS NOT NULL"),
        ),
        # One active execution per deduplication key: a second trigger finds the first.
        Index(
            "uq_executions_active_dedupe",
            "tenant_id",
            "dedupe_key",
            unique=True,
            postgresql_where=text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
            sqlite_where=text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
        ),
        # A child is one per (parent job, try): a start delivered twice makes one.
        Index(
            "uq_executions_parent_try",
            "parent_job_id",
            "parent_try",
            unique=True,
            postgresql_where=text("parent_job_id IS NOT NULL"),
            sqlite_where=text("parent_job_id IS NOT NULL"),
        ),
        # A parent's children, newest first (the listing, and a stop cancelling them).
        Index(
            "ix_executions_parent_created",
            "parent_execution_id",
            "created_at",
            postgresql_where=text("parent_execution_id IS NOT NULL"),
            sqlite_where=text("parent_execution_id IS NOT NULL"),
        ),
        # Children still running, oldest first: those their parent no longer waits for are
        # stopped a transaction's share at a time (cancellation.stop_orphans).
        Index(
            "ix_executions_active_children",
            "created_at",
            postgresql_where=text(ACTIVE_CHILD),
            sqlite_where=text(ACTIVE_CHILD),
        ),
        # A fire is (schedule, slot): two checks, or two beats, cannot start it twice.
        Index(
            "uq_executions_schedule_fire",
            "schedule_id",
            "scheduled_for",
            unique=True,
            postgresql_where=text("schedule_id IS NOT NULL"),
            sqlite_where=text("schedule_id IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    workflow_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("workflows.id"))
    status: Mapped[ExecutionStatus] = mapped_column(_enum(ExecutionStatus, "execution_status"))
    priority: Mapped[Priority] = mapped_column(_enum(Priority, "priority"))
    trigger: Mapped[str] = mapped_column(String(32))
    input: Mapped[dict[str, Any]] = mapped_column(JsonType)
    output: Mapped[Any | None] = mapped_column(JsonType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    remaining_nodes: Mapped[int] = mapped_column(Integer, default=0)
    # The schedule and slot that started it (trigger 'schedule'); None otherwise.
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("schedules.id", ondelete="SET NULL"), nullable=True
    )
    scheduled_for: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Limits its trigger gave, overriding the definition's for every node (None: the
    # definition's): maximum attempts of each node job, and each try's timeout in seconds.
    max_attempts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timeout: Mapped[float | None] = mapped_column(Float, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    dedupe_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # The follow-up a newer trigger with its deduplication key left while it was active
    # (policy follow_up): {"input": the latest input}, started when it finishes. None: none.
    follow_up: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    # How many times an operator re-ran it from a node (execution_reruns holds who and when):
    # a node's claim reads the input a rerun gave it, and its ready nodes take their held
    # jobs, only when it is not 0, so that no other execution pays for either.
    reruns: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # A child's parent: the execution, the workflow node, its job and the try of that job
    # that started it and waits for it (None: no node started it). No foreign key: SQLite
    # adds one only by rebuilding the table, and a child may outlive its parent's retention.
    parent_execution_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    parent_node_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    parent_job_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    parent_try: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # How many parents it has (0: no node started it); CONVEYOR_MAX_CHILD_DEPTH bounds it.
    depth: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # The W3C trace context where it was triggered, which its tries' spans join
    # (conveyor.tracing); None: their trace is made from its id.
    traceparent: Mapped[str | None] = mapped_column(String(55), nullable=True)
    tracestate: Mapped[str | None] = mapped_column(String(TRACESTATE_CHARS), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The database's clock when it was inserted (PostgreSQL: statement_timestamp(), the
    # default of migration 0028; SQLite and the executions before 0028: NULL, created_at
    # counts): its waits take the events kept from then on, both stamps by one clock.
    events_since: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), nullable=True, server_default=FetchedValue()
    )
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


# The retention sweep deletes finished executions oldest first (conveyor.scheduler.retention).
Index(
    "ix_executions_finished",
    Execution.finished_at,
    postgresql_where=text("finished_at IS NOT NULL"),
    sqlite_where=text("finished_at IS NOT NULL"),
)


class NodeState(Base):
    """The state storage: one row per node of an execution, with its output once it ran."""

    __tablename__ = "node_states"
    __table_args__ = (
        UniqueConstraint("execution_id", "node_id"),
        # Executions having a node in a rare status (the listing's node_status filter): the
        # settled-well statuses, which most nodes end in, stay out of it.
        Index(
            "ix_node_states_unsettled",
            "status",
            "execution_id",
            postgresql_where=text("status NOT IN ('completed', 'skipped')"),
            sqlite_where=text("status NOT IN ('completed', 'skipped')"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    execution_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("executions.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(100))
    status: Mapped[NodeStatus] = mapped_column(_enum(NodeStatus, "node_status"))
    waiting_on: Mapped[int] = mapped_column(Integer)
    branch: Mapped[str | None] = mapped_column(String(16), nullable=True)
    output: Mapped[Any | None] = mapped_column(JsonType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # A map node's counter, once its job made the items (NULL for every other node): its
    # items, those not settled yet, and those failed. Each item's settle takes this row's
    # lock, so the one that settles the last finishes the node, once.
    items_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    items_left: Mapped[int | None] = mapped_column(Integer, nullable=True)
    items_failed: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ExecutionRerun(Base):
    """An operator's rerun of a finished execution from a node: who asked, when, and the
    input given to that node in place of its rendered inputs (None: its templates). The
    latest rerun's input is the one the node's tries read (conveyor.engine.reruns)."""

    __tablename__ = "execution_reruns"
    __table_args__ = (Index("ix_execution_reruns_execution", "execution_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    execution_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("executions.id", ondelete="CASCADE"))
    from_node: Mapped[str] = mapped_column(String(100))
    input: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    # The API key's name, or "cli:<os user>" for the command line.
    requested_by: Mapped[str] = mapped_column(String(200))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Job(Base):
    """One unit of queued work. queued -> processing -> completed, or -> retry_wait -> queued,
    or -> dead_letter; a node job may wait as parked (for a concurrency permit) before
    processing."""

    __tablename__ = "jobs"
    __table_args__ = (
        # One job a node of an execution, and one an item of a map node.
        Index(
            "uq_jobs_execution_node",
            "execution_id",
            "node_id",
            unique=True,
            postgresql_where=text("node_id IS NOT NULL AND item_index IS NULL"),
            sqlite_where=text("node_id IS NOT NULL AND item_index IS NULL"),
        ),
        Index(
            "uq_jobs_execution_node_item",
            "execution_id",
            "node_id",
            "item_index",
            unique=True,
            postgresql_where=text("item_index IS NOT NULL"),
            sqlite_where=text("item_index IS NOT NULL"),
        ),
        # A map's held items, by index: those a cancel or a failed map cancels (a settled
        # item releases the one its job names by the map's key, not through this index).
        Index(
            "ix_jobs_held",
            "execution_id",
            "node_id",
            "item_index",
            postgresql_where=text("status = 'held'"),
            sqlite_where=text("status = 'held'"),
        ),
        Index(
            "ix_jobs_waiting_due",
            "next_run_at",
            postgresql_where=text("status IN ('retry_wait', 'scheduled')"),
            sqlite_where=text("status IN ('retry_wait', 'scheduled')"),
        ),
        Index("ix_jobs_status", "status"),
        Index(
            "ix_jobs_parked",
            "id",
            postgresql_where=text("status = 'parked'"),
            sqlite_where=text("status = 'parked'"),
        ),
        Index(
            "ix_jobs_processing_heartbeat",
            "heartbeat_at",
            postgresql_where=text("status = 'processing'"),
            sqlite_where=text("status = 'processing'"),
        ),
        Index(
            "ix_jobs_queued_low",
            "enqueued_at",
            postgresql_where=text("status = 'queued' AND priority = 'low'"),
            sqlite_where=text("status = 'queued' AND priority = 'low'"),
        ),
        # a continuation's look for a queued job of a higher priority (Store.claim_continuation)
        Index(
            "ix_jobs_queued_priority",
            "priority",
            "queue",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    kind: Mapped[JobKind] = mapped_column(_enum(JobKind, "job_kind"))
    queue: Mapped[str] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"))
    priority: Mapped[Priority] = mapped_column(_enum(Priority, "priority"))
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    # Tries made before an operator last requeued the job from the dead letters.
    tries_before: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    workflow_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("workflows.id"))
    execution_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("executions.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # When the job last became queued (created, promoted, requeued): what ageing counts from.
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Renewed while a worker runs the job; a stale one means the worker died (recovery).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When a sweep last re-sent its message as lost: any process re-sends it at most once a
    # lapse (store.recovery.claim_resend), however many sweep.
    resent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # An item of a map node: its index in the list, its value and, once it succeeded, its
    # output (the node's output is the items' outputs in index order); NULL for other jobs.
    # Kept on the item's own row: no row ever holds every item's state.
    item_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    item: Mapped[Any | None] = mapped_column(JsonType, nullable=True)
    output: Mapped[Any | None] = mapped_column(JsonType, nullable=True)


class JobAttempt(Base):
    """One try of a job, with its outcome and duration."""

    __tablename__ = "job_attempts"
    __table_args__ = (UniqueConstraint("job_id", "attempt_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_number: Mapped[int] = mapped_column(Integer)
    status: Mapped[AttemptStatus] = mapped_column(_enum(AttemptStatus, "attempt_status"))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A failed try's traceback (frames and code lines, never local values), cut to
    # engine.failure.TRACEBACK_CHARS.
    traceback: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    duration: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Seconds from when the job was (last) queued to when this try started.
    waited: Mapped[float | None] = mapped_column(Float, nullable=True)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    # The job's queue and workflow version, copied by the claim that starts the try, so that
    # the metrics add tries up by them without joining each to its job (store.stats). No
    # foreign key: checking one would cost every claim a lookup. NULL: never, since 0015.
    queue: Mapped[str | None] = mapped_column(String(64), nullable=True)
    workflow_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)


class AlertState(Base):
    """The one row alert evaluation shares between workers: when it last ran, the counters
    it measured (rates are taken between two evaluations) and the rules firing."""

    __tablename__ = "alert_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    counters: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    firing: Mapped[list[str]] = mapped_column(JsonType, default=list)


class RecoveryCount(Base):
    """How many of each thing the recovery sweep has repaired, ever (a metric)."""

    __tablename__ = "recovery_counts"

    what: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class PrunedTally(Base):
    """What the retention sweep deleted, added up, so that the metrics of tries ever made
    (``attempts_total`` and the wait and run histograms) never go down when it runs: a
    Prometheus counter that decreases reads as a restart. ``what`` names a figure:
    ``attempts:<status>`` (a count), ``waited`` and ``duration`` (the count and sum of the
    values), ``waited<=<bound>`` and ``duration<=<bound>`` (a histogram's cumulative count),
    each of the last four followed by its labels' values (``|<queue>`` for ``waited``,
    ``|<queue>|<workflow>`` for ``duration``; none in rows from before schema 0013)."""

    __tablename__ = "pruned_tallies"

    what: Mapped[str] = mapped_column(String(300), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    total: Mapped[float] = mapped_column(Float, default=0.0)


class StreamListener(Base):
    """A live status stream open on an execution. The status NOTIFY triggers only announce
    the changes of executions someone listens to: a NOTIFY costs every commit a global lock."""

    __tablename__ = "stream_listeners"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    execution_id: Mapped[uuid.UUID] = mapped_column(index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class StreamEvent(Base):
    """A change of an execution's status, as the tenant streams tell it and replay it
    (``GET /v1/stream``). Written by a trigger on ``executions`` (migration 0017), in the
    transaction that made the change; deleted with its execution. ``txid`` is that
    transaction's id on PostgreSQL (None on SQLite, whose writers take turns): a stream reads
    in (txid, id) order and only below the oldest transaction still running, so an event
    committed late is not passed over (see :mod:`conveyor.api.tenant_stream`)."""

    __tablename__ = "stream_events"
    __table_args__ = (
        Index("ix_stream_events_order", "txid", "id"),
        Index("ix_stream_events_tenant_order", "tenant_id", "txid", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column()
    execution_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("executions.id", ondelete="CASCADE"), index=True
    )
    workflow_id: Mapped[uuid.UUID] = mapped_column()
    dedupe_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Event(Base):
    """An application event kept for the wait nodes that begin after it arrived, until
    ``expires_at`` (the retention sweep deletes it then). A wait that begins takes the
    earliest event of its (tenant, name, key) that arrived since its execution started."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_correlation", "tenant_id", "name", "key", "created_at"),
        Index("ix_events_expires_at", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(200))
    key: Mapped[str] = mapped_column(String(200))
    payload: Mapped[Any] = mapped_column(JsonType)
    # PostgreSQL: the database's clock (statement_timestamp()), as executions.events_since.
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Wait(Base):
    """A wait node's try waiting for its event: one a job (its current try's), deleted when
    the try wakes, times out or is stopped."""

    __tablename__ = "waits"
    __table_args__ = (
        Index("ix_waits_correlation", "tenant_id", "event", "key"),
        Index(
            "ix_waits_timeout_at",
            "timeout_at",
            postgresql_where=text("timeout_at IS NOT NULL"),
            sqlite_where=text("timeout_at IS NOT NULL"),
        ),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    try_number: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    execution_id: Mapped[uuid.UUID] = mapped_column()
    node_id: Mapped[str] = mapped_column(String(100))
    event: Mapped[str] = mapped_column(String(200))
    key: Mapped[str] = mapped_column(String(200))
    since: Mapped[datetime] = mapped_column(UTCDateTime())
    timeout_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
