"""One rooted exception tree. Each class's docstring is its default message."""

from __future__ import annotations


class ConveyorError(Exception):
    """Conveyor failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or " ".join((self.__doc__ or "").split()))


class ConfigurationError(ConveyorError):
    """Conveyor is misconfigured; check the CONVEYOR_* environment variables."""


class DefinitionError(ConveyorError):
    """The workflow definition is invalid."""

    def __init__(self, errors: list[str], source: str | None = None) -> None:
        self.errors = list(errors)
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{len(self.errors)} error(s){where}:\n{lines}")


class DefinitionFileError(ConveyorError):
    """The definition file cannot be read; fix the line it names."""


class NotFound(ConveyorError):
    """The requested object does not exist."""


class WorkflowNotFound(NotFound):
    """No workflow has that name; apply its definition first (conveyor workflow apply FILE)."""


class ExecutionNotFound(NotFound):
    """No execution has that id; list them with `conveyor executions list`."""


class TenantNotFound(NotFound):
    """No tenant has that name."""


class ScheduleNotFound(NotFound):
    """No schedule has that name; list them with `conveyor schedules list`."""


class ScheduleError(ConveyorError):
    """The schedule is invalid; check its cron expression, timezone and workflow."""


class StoreError(ConveyorError):
    """The database refused the operation."""


class DuplicateExecution(StoreError):
    """An execution with this idempotency key exists already."""


class IdempotencyConflict(ConveyorError):
    """The Idempotency-Key was used before for another workflow; send a new key."""


class AuthError(ConveyorError):
    """The API key is missing, unknown or revoked; send `Authorization: Bearer <key>` with a
    key from `conveyor keys create`."""


class MetricsAuthError(AuthError):
    """Scraping /metrics needs `Authorization: Bearer <token>` with the token set in
    CONVEYOR_METRICS_TOKEN."""


class MetricsNotServed(ConveyorError):
    """/metrics is not served on the API's port without a token: set CONVEYOR_METRICS_TOKEN
    and scrape with `Authorization: Bearer <token>`, or set CONVEYOR_METRICS_PORT to serve the
    metrics on a listener of their own."""


class DuplicateDelivery(ConveyorError):
    """The endpoint received this delivery already; it is not started again. (A delivery id
    received before is answered as a repeat, not raised: only a :class:`ReplayedDelivery`
    is.)"""


class ReplayedDelivery(DuplicateDelivery):
    """The endpoint received this very body, signed alike, within the replay window
    (CONVEYOR_WEBHOOK_REPLAY_WINDOW_DAYS); a new delivery id does not make it a new delivery."""


class SignatureError(ConveyorError):
    """The webhook's signature is missing, malformed, expired or does not match."""


class EventMismatch(SignatureError):
    """The X-GitHub-Event header names an event the signed body is not a payload of; GitHub's
    signature does not cover the header, so the pair is refused."""


class LimitError(ConveyorError):
    """The concurrency limiter (Redis) could not answer; the job is left for a retry."""


class TooManyStreams(ConveyorError):
    """Too many live status streams are open; close one, or wait for one to end, and retry
    (the limits are CONVEYOR_STREAMS_PER_TENANT and CONVEYOR_STREAMS_PER_PROCESS)."""


class StreamsUnavailable(ConveyorError):
    """Live status streams cannot be served now (the API is shutting down, or cannot reach
    the database); open the stream again in a few seconds."""


class InvalidTransition(ConveyorError):
    """The object is not in a state that allows this operation."""


class TemplateError(ConveyorError):
    """A node input template could not be rendered."""


class TemplateBudgetExceeded(TemplateError):
    """A template did more work, took longer or made a bigger value than its budget allows
    (CONVEYOR_TEMPLATE_MAX_OPERATIONS, CONVEYOR_TEMPLATE_TIMEOUT, CONVEYOR_TEMPLATE_MAX_SIZE);
    make it do less, or raise the budget."""


class NodeError(ConveyorError):
    """A node failed.

    Raise it (or a subclass) from a node function to control retries: ``retryable=False``
    dead-letters the job at once instead of trying again.
    """

    def __init__(self, message: str | None = None, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class NonRetryableError(NodeError):
    """The node failed in a way that trying again cannot fix."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, retryable=False)


class OutboundRefused(NonRetryableError):
    """The http node may not call this URL: only http(s) URLs of globally reachable addresses
    are called, unless an operator allows others with CONVEYOR_HTTP_ALLOW."""


class ResponseTooLarge(NonRetryableError):
    """The http node's response is larger than CONVEYOR_HTTP_MAX_RESPONSE_BYTES; ask for less
    or raise the setting."""


class TooManyRedirects(NonRetryableError):
    """The http node was redirected more times than CONVEYOR_HTTP_MAX_REDIRECTS allows."""


class NodeTimeout(NodeError):
    """The node ran past its timeout."""


class WorkerLost(NodeError):
    """The worker running the node stopped sending heartbeats (killed, or its host failed)."""


class ChildFailed(NodeError):
    """A workflow node's child execution failed; the node's retry policy decides what comes
    next (a retry starts a new child)."""


class ChildDepthExceeded(NonRetryableError):
    """A workflow node would start a child deeper than CONVEYOR_MAX_CHILD_DEPTH allows: a
    workflow that starts itself through its children, or children nested too deep."""


class TooManyChildren(NonRetryableError):
    """A workflow node would start more children of one execution than CONVEYOR_MAX_CHILDREN
    allows: a workflow that starts children in a loop, or a fan-out of children too wide."""


class WaitTimedOut(NonRetryableError):
    """A wait node's event did not come before its timeout, and the node names no
    ``on_timeout`` branch to take instead."""


class ApprovalRejected(NonRetryableError):
    """An approval node was rejected, and it names no ``on_reject`` branch to take instead."""


class ApprovalNotFound(NotFound):
    """No approval of that id waits for a decision in this tenant; list them with
    `conveyor approvals list`."""


class AlreadyDecided(ConveyorError):
    """The approval was decided already; a decision is final."""


class NodeCancelled(NodeError):
    """The execution was cancelled while the node was running."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, retryable=False)


class Snooze(ConveyorError):
    """The node's input is not ready yet: run it again later."""

    def __init__(self, seconds: float, reason: str | None = None) -> None:
        """Raise it from a node to run the node again in ``seconds`` (from 0.001 to a day)
        without spending an attempt; ``reason`` is recorded with the snoozed try. A node
        snoozes at most ``max_snoozes`` times in a row (its definition's; 100 by default)."""
        seconds = float(seconds)
        if not 0.001 <= seconds <= 86_400:
            raise ValueError(f"a snooze lasts from 0.001 s to a day (86400 s), not {seconds} s")
        self.seconds = seconds
        self.reason = reason or ""
        super().__init__(f"snoozed for {seconds:g}s" + (f": {reason}" if reason else ""))


class CancelExecution(ConveyorError):
    """The node cancelled its execution."""

    def __init__(self, reason: str | None = None) -> None:
        """Raise it from a node to end the node cancelled, and its execution with it: its
        successors are cancelled, nothing is dead-lettered, ``reason`` is recorded as the
        node's and the execution's error."""
        self.reason = reason or ""
        super().__init__(reason or None)


class Skip(ConveyorError):
    """The node had nothing to do."""

    def __init__(self, reason: str | None = None) -> None:
        """Raise it from a node to end the node ``skipped``, as a branch not taken is: its
        successors run unless all their needs were skipped; ``reason`` is recorded with the
        try."""
        self.reason = reason or ""
        super().__init__(reason or None)


class UnknownFunction(NodeError):
    """The python node names a function that is not registered in this worker."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"function {name!r} is not registered in this worker; decorate it with "
            f"@conveyor.node({name!r}) in a module listed in CONVEYOR_IMPORTS",
            retryable=False,
        )


class TryFailed(ConveyorError):
    """A node's try failed and will be retried; its job waits in the database for its time.

    Raised by the node task after the outcome is committed, inside Celery's ``Retry``, so
    that Flower shows the message as RETRY with the node's error; the message is acked and
    nothing is published again (the retry is the job's, not the message's)."""


class Snoozed(ConveyorError):
    """A node's try snoozed: its job waits in the database for its time, no attempt spent.

    Raised by the node task inside Celery's ``Retry``, as :class:`TryFailed` is, so that
    Flower shows the message as RETRY (the node runs again later) with the snooze's reason."""


class TryReclaimed(ConveyorError):
    """A node's try failed after the recovery sweep had reclaimed its job (its worker was
    taken for lost): the try's failure was not recorded, the job is recovery's to run again.

    Raised by the node task, as :class:`DeadLettered` is, so that Flower shows the message
    as FAILURE with the node's error; logged without a traceback, the message acked."""


class DeadLettered(ConveyorError):
    """A node's last try failed: its job is a dead letter (``conveyor dlq show``).

    Raised by the node task after the outcome is committed, so that Flower shows the message
    as FAILURE with the node's error (its str); the worker logs it as an expected failure,
    without a traceback, and acks the message."""


class StartTimeError(ConveyorError):
    """The start time is invalid: give ``run_at`` as an aware date and time (with its UTC
    offset) within the bound, or ``delay`` as seconds, not both."""


class TriggerLimitError(ConveyorError):
    """A trigger's limits are out of bounds: max_attempts 1 to 100, timeout over 0 and at
    most 86400 seconds (the bounds a definition's retry policy and timeout have)."""


class InvalidQuery(ConveyorError, ValueError):
    """A read's arguments are invalid (a status, a page's size or id, an event id); the
    message names which, and what to give."""


class RerunError(ConveyorError):
    """The rerun cannot be made as asked: name a node of the execution's workflow, and give
    an input only as a JSON object, to a node that reads inputs."""


class WaitTimeout(ConveyorError):
    """The execution did not finish within the wait's timeout; it goes on running: wait
    again, read its status, or cancel it."""


class ExecutionFailed(ConveyorError):
    """The execution failed or was cancelled, so it has no result; its error says why
    (``conveyor executions show ID`` shows each node's)."""

    def __init__(self, message: str | None = None, *, status: str = "failed") -> None:
        self.status = status
        super().__init__(message)


class PublishRefused(ConveyorError):
    """The broker did not take a message (RabbitMQ's publisher confirm was a nack, or none
    came in time): its jobs stay queued in the database and the recovery sweep publishes
    them again after CONVEYOR_LOST_AFTER. Check the queue's limits (a max-length policy
    with ``reject-publish``), the broker's alarms (disk, memory) and its log."""
