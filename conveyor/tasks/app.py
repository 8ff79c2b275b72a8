"""The Celery app: four queues, routing, and the settings that make delivery safe.

- ``task_acks_late`` + ``worker_prefetch_multiplier=1``: a message is acknowledged only after
  its job's outcome is committed, and a worker holds one message per process at a time.
- Delays (retries, delay nodes) are held in the database, never in broker ETAs.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.amqp import AMQP
from celery.schedules import crontab
from kombu import Queue

from conveyor.config import Settings
from conveyor.engine.queues import (
    ALL_QUEUES,
    EXECUTION_QUEUE,
    NODE_QUEUE,
    SCHEDULED_QUEUE,
    WEBHOOK_QUEUE,
)


class NamedAMQP(AMQP):
    """Celery's message building, but the task-sent event names a task by its ``shadow``
    (``workflow/node``, see tasks/dispatch.py), as the worker's task-received event does.
    Flower takes the name of the last of the two it receives: a sent event that arrives after
    the received one (the worker that published the message took it at once) would rename
    the task back to ``conveyor.node.run``."""

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        shadow = message.headers.get("shadow")
        if shadow and message.sent_event is not None:
            message.sent_event["name"] = shadow
        return message


def create_app(settings: Settings) -> Celery:
    app = Celery(
        "conveyor", broker=settings.resolved_broker_url, set_as_current=False, amqp=NamedAMQP
    )
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        # The node task raises DeadLettered (FAILURE), TryReclaimed (FAILURE) or Retry after
        # the job's outcome is committed, only so that Flower shows it: the message must be
        # acked even so. Celery's default, set here so that no configuration turns it off
        # (a failed task's message would be redelivered and its job's message dropped, or
        # worse, run again after its outcome was recorded).
        task_acks_on_failure_or_timeout=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        task_queues=[Queue(name, routing_key=name) for name in ALL_QUEUES],
        task_default_queue=NODE_QUEUE,
        task_routes={
            "conveyor.execution.*": {"queue": EXECUTION_QUEUE},
            "conveyor.node.*": {"queue": NODE_QUEUE},
            "conveyor.scheduled.*": {"queue": SCHEDULED_QUEUE},
            "conveyor.webhook.*": {"queue": WEBHOOK_QUEUE},
        },
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            "priority_steps": list(range(10)),
            "sep": ":",
            "queue_order_strategy": "priority",
        },
        task_queue_max_priority=10,
        # Flower (and `celery events`) see every task: sent, received, started, done.
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        task_default_priority=3,
        # how many node jobs one message may carry (conveyor.tasks.dispatch)
        conveyor_batch_most=settings.batch_most,
    )
    # (On RabbitMQ, the job messages go with publisher confirms: a publish returns once
    # RabbitMQ has taken the message, and raises when it refused it, the job staying queued
    # in the database for the recovery sweep. Only the dispatcher's own connections confirm:
    # see conveyor.tasks.dispatch.CeleryDispatcher.)
    if settings.resolved_broker_url.startswith(("redis://", "rediss://")):
        # kombu's Redis transport, but a malformed message is dropped instead of stopping
        # the worker (see transport.py)
        app.conf.broker_transport = "conveyor.tasks.transport:GuardedTransport"
    app.conf.beat_schedule = beat_schedule(settings)
    # Schedules live in the database; beat's own state is only when it last sent the check.
    app.conf.beat_scheduler = "conveyor.tasks.beat:HeartbeatScheduler"
    app.conf.conveyor_beat_heartbeat_file = settings.beat_heartbeat_file
    if settings.embedded:
        # The in-process broker polls its queues, once a second by default: every hop of a
        # workflow would wait for the next poll.
        app.conf.broker_transport_options["polling_interval"] = 0.02
    return app


# A recovery sweep or a due check waits in the queue at least this long before it is dropped
# as expired: with a short interval (the chaos tier's 1 s sweep, a check every second), a
# worker busier than one interval would otherwise drop every one, and nothing lost would be
# recovered, nor anything due fired, until it caught up. Both are safe to run late or twice.
RECOVER_EXPIRES_FLOOR = 10.0


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """``celery -A conveyor.tasks beat`` sends the due check: at second 0 of every minute by
    default, else every ``CONVEYOR_SCHEDULE_CHECK_INTERVAL`` seconds. A check that waited in
    the queue longer than one interval is dropped: the next one does its work. Any number of
    beats may run; their checks share the due schedules, never firing one slot twice. The
    check and the recovery sweep expire after their interval, but never sooner than
    :data:`RECOVER_EXPIRES_FLOOR`."""
    interval = settings.schedule_check_interval
    every: crontab | float = crontab() if interval == 60 else interval
    recover = settings.recover_interval
    return {
        "conveyor-schedule-check": {
            "task": "conveyor.scheduled.check",
            "schedule": every,
            "options": {"queue": SCHEDULED_QUEUE, "expires": max(interval, RECOVER_EXPIRES_FLOOR)},
        },
        "conveyor-recover": {
            "task": "conveyor.scheduled.recover",
            "schedule": recover,
            "options": {
                "queue": SCHEDULED_QUEUE,
                "expires": max(recover, RECOVER_EXPIRES_FLOOR),
            },
        },
        "conveyor-prune": {
            "task": "conveyor.scheduled.prune",
            "schedule": settings.retention_interval,
            "options": {"queue": SCHEDULED_QUEUE, "expires": settings.retention_interval},
        },
    }
