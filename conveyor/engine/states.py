"""Status and priority values, each with the meaning it has in the tables."""

from __future__ import annotations

from enum import StrEnum


class ExecutionStatus(StrEnum):
    PENDING = "pending"  # created with its start job; nodes not planned yet
    RUNNING = "running"  # planned; at least one node is not settled
    COMPLETED = "completed"  # every node settled and none failed the execution
    FAILED = "failed"  # a node exhausted its tries (or planning failed)
    CANCELLED = "cancelled"  # an operator or application cancelled it

    @property
    def finished(self) -> bool:
        return self in FINISHED_EXECUTION


FINISHED_EXECUTION = frozenset(
    {ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)


class JobStatus(StrEnum):
    QUEUED = "queued"  # committed and published (or about to be); a worker may claim it
    PARKED = "parked"  # waits without a message for a concurrency permit; a release wakes it
    PROCESSING = "processing"  # claimed by a worker, a try is running
    # its try started a child execution (a workflow node) and waits, holding no worker slot
    # and no permit, for the child to finish: the child's finish records the try's outcome
    WAITING_CHILD = "waiting_child"
    # its try waits for an application event (a wait node), holding no worker slot and no
    # permit: the event's arrival, or the wait's timeout, records the try's outcome
    WAITING_EVENT = "waiting_event"
    RETRY_WAIT = "retry_wait"  # a try failed or snoozed; waits in the database until next_run_at
    SCHEDULED = "scheduled"  # waits in the database until next_run_at (delay nodes)
    COMPLETED = "completed"  # the work is done and its result recorded
    DEAD_LETTER = "dead_letter"  # tries exhausted or not retryable; an operator may requeue
    DISCARDED = "discarded"  # an operator discarded the dead letter; kept for audit
    CANCELLED = "cancelled"  # its execution was cancelled before the job ran
    # A job that waits in the database for another transition to release it, with no message
    # meanwhile: a map's item beyond its window (released as an item before it settles), or
    # the node a rerun reset (its next tries, numbered on after the earlier ones, released
    # once its needs settle).
    HELD = "held"


WAITING_JOB = frozenset({JobStatus.RETRY_WAIT, JobStatus.SCHEDULED})
# An execution that has not finished: its nodes may still run, be claimed or settle.
ACTIVE_EXECUTION = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
# The tenant of a single-tenant install, made on first use (any other is created by name).
DEFAULT_TENANT = "default"
# A job a message may start: queued, or parked by the limiter until a permit frees.
RUNNABLE_JOB = (JobStatus.QUEUED, JobStatus.PARKED)
# Jobs an execution's stop cancels: those not started, and those waiting for a child (whose
# children the stop cancels too); a job processing is told to stop instead.
STOPPABLE_JOB = (*RUNNABLE_JOB, *WAITING_JOB, JobStatus.WAITING_CHILD, JobStatus.WAITING_EVENT)
# Jobs whose claimed try waits, without a worker, for another transaction to settle it: a
# stop ends their tries cancelled with them.
PAUSED_JOB = (JobStatus.WAITING_CHILD, JobStatus.WAITING_EVENT)


class NodeStatus(StrEnum):
    PENDING = "pending"  # waits for its needs to settle
    QUEUED = "queued"  # its job exists and waits for a worker (or for its time)
    RUNNING = "running"  # a worker is running it
    WAITING = "waiting"  # a workflow node waits for its child, a wait node for its event
    COMPLETED = "completed"  # ran and stored its output
    FAILED = "failed"  # exhausted its tries
    SKIPPED = "skipped"  # on a branch a condition did not take, or all its needs skipped
    CANCELLED = "cancelled"  # its execution was cancelled before it settled

    @property
    def settled(self) -> bool:
        return self in SETTLED_NODE


# Nodes an execution's stop cancels: not started, or waiting for a child the stop cancels.
STOPPABLE_NODE = (NodeStatus.PENDING, NodeStatus.QUEUED, NodeStatus.WAITING)


SETTLED_NODE = frozenset(
    {
        NodeStatus.COMPLETED,
        NodeStatus.FAILED,
        NodeStatus.SKIPPED,
        NodeStatus.CANCELLED,
    }
)


class AttemptStatus(StrEnum):
    RUNNING = "running"  # the try has started and not reported
    SUCCEEDED = "succeeded"  # the try returned a result
    FAILED = "failed"  # the try raised, timed out or was abandoned
    SNOOZED = "snoozed"  # the node asked to run again later (Snooze): no attempt spent
    # the node cancelled its execution (CancelExecution), or its execution stopped while the
    # try waited for its child
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # the node ended itself skipped (Skip)


class Priority(StrEnum):
    HIGH = "high"  # user-triggered work and webhook responses
    NORMAL = "normal"  # scheduled runs and standard automation
    LOW = "low"  # background and clean-up work


PRIORITY_ORDER = (Priority.HIGH, Priority.NORMAL, Priority.LOW)


def priorities_above(priority: Priority) -> tuple[Priority, ...]:
    """The priorities that go before ``priority`` (none before high)."""
    return PRIORITY_ORDER[: PRIORITY_ORDER.index(priority)]


class TriggerSource(StrEnum):
    """What started an execution; each source has a default priority (see ``priority``)."""

    API = "api"  # an application or user called trigger (REST or Python)
    CLI = "cli"  # an operator ran `conveyor run`
    WEBHOOK = "webhook"  # a received webhook delivery
    SCHEDULE = "schedule"  # a cron schedule fired
    EVENT = "event"  # an application event matched a subscription (standard automation)
    BACKGROUND = "background"  # background and clean-up work an application enqueues
    WORKFLOW = "workflow"  # a workflow node of a parent execution started it (a child)

    @property
    def priority(self) -> Priority:
        return _SOURCE_PRIORITY[self]


_SOURCE_PRIORITY = {
    TriggerSource.API: Priority.HIGH,
    TriggerSource.CLI: Priority.HIGH,
    TriggerSource.WEBHOOK: Priority.HIGH,
    TriggerSource.SCHEDULE: Priority.NORMAL,
    TriggerSource.EVENT: Priority.NORMAL,
    TriggerSource.BACKGROUND: Priority.LOW,
    TriggerSource.WORKFLOW: Priority.NORMAL,  # (a child takes its parent's priority)
}


class JobKind(StrEnum):
    EXECUTION = "execution"  # plans an execution's DAG (queue workflow-execution)
    NODE = "node"  # runs one node (queue workflow-node)
    WEBHOOK = "webhook"  # turns a delivery into executions (workflow-webhook; a delivery row)


class ScheduleOrigin(StrEnum):
    DEFINITION = (
        "definition"  # declared in a workflow definition; applying it updates or removes it
    )
    MANUAL = "manual"  # added by `conveyor schedules add` or the API; applies leave it alone


class DeliveryStatus(StrEnum):
    RECEIVED = "received"  # verified and stored; its message is on workflow-webhook
    PROCESSED = "processed"  # the webhook worker started the executions it matched
    UNMATCHED = "unmatched"  # no workflow subscribes to it; nothing started


class SubscriptionKind(StrEnum):
    EVENT = "event"  # an application event type (POST /v1/events) starts the workflow
    WEBHOOK = "webhook"  # a delivery to a webhook endpoint starts the workflow


class SignatureScheme(StrEnum):
    STANDARD = "standard"  # Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature
    GITHUB = "github"  # GitHub: X-Hub-Signature-256, X-GitHub-Delivery, X-GitHub-Event
