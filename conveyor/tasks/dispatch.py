"""The dispatcher port over Celery: publishes job ids after the database commit.

A node job's message carries hints (tenant, workflow version, priority, when it was queued,
node) as the keyword argument ``hints``: its admission then reads nothing, and its claim
reads its needs' outputs at once. The job id alone is enough: a message without hints (an
older version's) is admitted and claimed from the database.

Node jobs published together are packed into messages of up to ``conveyor_batch_most`` jobs
(``CONVEYOR_BATCH_MOST``; see :mod:`conveyor.engine.packing`): ``conveyor.node.run_many``
with the job ids and their hints as two lists."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from amqp.exceptions import MessageNacked, RecoverableConnectionError
from celery import Celery
from kombu.exceptions import OperationalError
from kombu.pools import producers

from conveyor.engine.packing import pack
from conveyor.engine.records import Dispatch, NodeHints
from conveyor.engine.states import JobKind, Priority
from conveyor.exceptions import PublishRefused

RUN_MANY = "conveyor.node.run_many"
TASK_FOR_KIND = {
    JobKind.EXECUTION: "conveyor.execution.start",
    JobKind.NODE: "conveyor.node.run",
    JobKind.WEBHOOK: "conveyor.webhook.deliver",
}

# kombu's Redis transport serves lower numbers first; AMQP serves higher numbers first.
_REDIS_PRIORITY = {Priority.HIGH: 0, Priority.NORMAL: 3, Priority.LOW: 6}
_AMQP_PRIORITY = {Priority.HIGH: 9, Priority.NORMAL: 5, Priority.LOW: 1}


# On RabbitMQ every publish waits for the broker's confirm (tasks/app.py) at most this long.
CONFIRM_TIMEOUT = 5.0
# A nack, no confirm in time, or either after kombu's retries (which wrap them)
_REFUSED = (MessageNacked, socket.timeout, OperationalError)


def _connection_lost(exc: BaseException) -> bool:
    """The publish failed on a connection the broker had closed (a restart, an operator's
    close, a failover): the pool hands out connections it does not know are dead."""
    cause = exc.__cause__ or exc
    return isinstance(cause, ConnectionError | RecoverableConnectionError)


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self.app = app
        amqp = str(app.conf.broker_url or "").startswith(("amqp", "pyamqp"))
        self._priority = _AMQP_PRIORITY if amqp else _REDIS_PRIORITY
        # With confirms, kombu's retries would send a nacked or unconfirmed message again (it
        # counts both as recoverable): up to four copies, and four timeouts' wait for the
        # caller. One try; what the broker did not take stays queued for the sweep.
        self._confirm: dict[str, Any] = (
            {"confirm_timeout": CONFIRM_TIMEOUT, "retry": False} if amqp else {}
        )
        # Confirms on this dispatcher's own connections only (a pool of its own, made after a
        # fork as kombu's pools are): Celery's other publishes on the app's connections (task
        # events for Flower, beat's checks) do not wait a round trip each in a worker's loop.
        self._confirmed = (
            app.connection_for_write(transport_options={"confirm_publish": True}) if amqp else None
        )
        self.batch_most = int(app.conf.get("conveyor_batch_most") or 1)

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        """One message per job, or per pack of node jobs when ``batch`` (see the module).
        :class:`PublishRefused` when RabbitMQ did not confirm one (the messages before it
        were taken)."""
        messages = pack(dispatches, self.batch_most if batch else 1)
        sent, reconnected = 0, False
        while sent < len(messages):
            with self._producer() as producer:
                try:
                    for message in messages[sent:]:
                        self._send(message, producer)
                        sent += 1
                except _REFUSED as exc:
                    if not self._confirm:
                        raise
                    if _connection_lost(exc) and not reconnected:
                        # Once, on a new connection: the pool's was dead. (Had the broker
                        # taken the message before the connection broke, it has it twice: a
                        # duplicate is harmless, the claim runs a job once.)
                        producer.connection.collect()
                        reconnected = True
                        continue
                    jobs = ", ".join(str(d.job_id) for d in messages[sent])
                    why = exc.__cause__ or exc
                    raise PublishRefused(
                        f"RabbitMQ did not take the message of job(s) {jobs} ({why!r}): they "
                        "stay queued, the recovery sweep publishes them again; check the "
                        "queue's limits and the broker's alarms"
                    ) from exc

    def _producer(self) -> Any:
        """A producer of the app's pool, or on RabbitMQ of the confirmed connections' pool."""
        if self._confirmed is None:
            return self.app.producer_or_acquire()
        return producers[self._confirmed].acquire(block=True)

    def _send(self, message: list[Dispatch], producer: Any) -> None:
        if len(message) == 1:
            self._send_one(message[0], producer)
        else:
            self._send_many(message, producer)

    def _send_one(self, d: Dispatch, producer: Any) -> None:
        kwargs = {"hints": encode_hints(d.hints)} if d.hints else None
        self.app.send_task(
            TASK_FOR_KIND[d.kind],
            args=[str(d.job_id)],
            kwargs=kwargs,
            queue=d.queue,
            priority=self._priority[d.priority],
            producer=producer,
            shadow=shown_name(d),
            argsrepr=shown_args(d),
            kwargsrepr=_repr(kwargs),
            **self._confirm,
        )

    def _send_many(self, message: list[Dispatch], producer: Any) -> None:
        first = message[0]
        names = [shown_name(d) or f"job={d.job_id}" for d in message]
        self.app.send_task(
            RUN_MANY,
            args=[[str(d.job_id) for d in message]],
            kwargs={"hints": [encode_hints(d.hints) if d.hints else None for d in message]},
            queue=first.queue,
            priority=self._priority[first.priority],
            producer=producer,
            shadow=f"{names[0]} and {len(message) - 1} more",
            argsrepr=shown_many_args(message),
            kwargsrepr=f"hints of {len(message)} jobs",
            **self._confirm,
        )


def shown_name(d: Dispatch) -> str | None:
    """The name Flower shows for a job's message (Celery's ``shadow``): ``workflow/node``
    for a node, ``workflow (plan)`` for a start job; None, the entry point's own name, when
    the publisher does not know the workflow (a webhook delivery)."""
    if not d.workflow:
        return None
    if d.kind is JobKind.EXECUTION:
        return f"{d.workflow} (plan)"
    return f"{d.workflow}/{d.node}" if d.node else d.workflow


def shown_args(d: Dispatch) -> str:
    """What Flower shows as a job's arguments: its ids and names (see docs/operations.md)."""
    workflow = f"workflow={d.workflow}" if d.workflow else ""
    node = f"node={d.node}" if d.node else ""
    return " ".join(part for part in (f"job={d.job_id}", d.label, workflow, node) if part)


# Celery cuts the argsrepr it makes itself at 1,024 characters (AMQP.argsrepr_maxsize); the
# text given it is sent as is, in the message's headers and in its task-sent event.
ARGS_CHARS = 1024


def shown_many_args(message: Sequence[Dispatch], most: int = ARGS_CHARS) -> str:
    """A packed message's arguments as Flower shows them: each job's :func:`shown_args`, as
    many as fit in ``most`` characters, then how many more the message holds."""
    reserve = len(f"; … and {len(message)} more")
    shown: list[str] = []
    length = 0
    for i, d in enumerate(message):
        part = shown_args(d)
        length += len(part) + (2 if shown else 0)
        last = i == len(message) - 1
        if length + (0 if last else reserve) > most:
            break
        shown.append(part)
    if len(shown) == len(message):
        return "; ".join(shown)
    tail = f"… and {len(message) - len(shown)} more"
    return f"{'; '.join(shown)}; {tail}" if shown else tail


def _repr(kwargs: dict[str, Any] | None) -> str:
    """What Flower shows of a message's keyword arguments: ids and names only, so plain
    ``repr`` (Celery's default, ``saferepr``, cost ~25 us a message for the same text)."""
    return repr(kwargs or {})


def encode_hints(hints: NodeHints) -> dict[str, Any]:
    return {
        "tenant_id": str(hints.tenant_id),
        "workflow_id": str(hints.workflow_id),
        "priority": hints.priority.value,
        "enqueued_at_ms": int(hints.enqueued_at.timestamp() * 1000),
        "node_id": hints.node_id,
        "workflow": hints.workflow,
    }


def decode_hints(raw: Any) -> NodeHints | None:
    """The hints of a message; None (admit from the database) if absent or malformed."""
    if not isinstance(raw, dict):
        return None
    try:
        return NodeHints(
            tenant_id=uuid.UUID(raw["tenant_id"]),
            workflow_id=uuid.UUID(raw["workflow_id"]),
            priority=Priority(raw["priority"]),
            enqueued_at=datetime.fromtimestamp(int(raw["enqueued_at_ms"]) / 1000, UTC),
            node_id=_optional_str(raw.get("node_id")),
            workflow=_optional_str(raw.get("workflow")),
        )
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return None


def _optional_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"not a string: {value!r}")
