"""The dispatcher port over Celery: publishes job ids after the database commit."""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority

TASK_FOR_KIND = {
    JobKind.EXECUTION: "conveyor.execution.start",
    JobKind.NODE: "conveyor.node.run",
    JobKind.WEBHOOK: "conveyor.webhook.deliver",
}

# kombu's Redis transport serves lower numbers first; AMQP serves higher numbers first.
_REDIS_PRIORITY = {Priority.HIGH: 0, Priority.NORMAL: 3, Priority.LOW: 6}
_AMQP_PRIORITY = {Priority.HIGH: 9, Priority.NORMAL: 5, Priority.LOW: 1}


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self.app = app
        amqp = str(app.conf.broker_url or "").startswith(("amqp", "pyamqp"))
        self._priority = _AMQP_PRIORITY if amqp else _REDIS_PRIORITY

    def publish(self, dispatches: Sequence[Dispatch]) -> None:
        with self.app.producer_or_acquire() as producer:
            for d in dispatches:
                self.app.send_task(
                    TASK_FOR_KIND[d.kind],
                    args=[str(d.job_id)],
                    queue=d.queue,
                    priority=self._priority[d.priority],
                    producer=producer,
                    argsrepr=f"job={d.job_id} {d.label}".rstrip(),
                )
