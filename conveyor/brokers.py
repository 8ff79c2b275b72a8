"""What each broker holds: the adapters of :class:`conveyor.engine.ports.BrokerQueues`, read by
the metrics (``conveyor_queue_depth``, ``conveyor stats``, the queue-depth alert) and by the
recovery sweep, which re-publishes only the jobs a queue cannot hold
(:func:`conveyor.engine.queues.may_hold`).

- Redis (kombu's transport): one list per priority step; ``LLEN`` of each.
- RabbitMQ (AMQP): one queue per name holding every priority (declared with
  ``x-max-priority``, see tasks/app.py); a passive ``queue_declare`` answers its ready
  messages. A queue that is missing (deleted by hand, a broker that lost its non-durable
  state) holds 0; given the queues' declarations (``repair``), it is declared again, so
  that what the sweep re-publishes has a queue to land in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.engine.ports import BrokerQueues
from conveyor.engine.queues import ALL_QUEUES
from conveyor.engine.states import Priority

REDIS_SCHEMES = ("redis://", "rediss://")
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")

# kombu's Redis transport keeps one list per priority step: the queue's name for step 0, and
# name + ":" + step for the others. Conveyor publishes on these steps (tasks/dispatch.py).
REDIS_STEPS = {Priority.HIGH: 0, Priority.NORMAL: 3, Priority.LOW: 6}
# An AMQP queue holds every priority; its one count is shown under this label.
ALL_PRIORITIES = "all"
# A broker that does not answer within this many seconds is taken as unable to tell.
CONNECT_TIMEOUT = 5.0


class RedisQueues:
    """The Redis broker's lists (see the module)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def depth(self) -> dict[tuple[str, str], int]:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=CONNECT_TIMEOUT)
        try:
            with client.pipeline(transaction=False) as pipe:
                keys = [(q, p) for q in ALL_QUEUES for p in Priority]
                for q, p in keys:
                    step = REDIS_STEPS[p]
                    pipe.llen(q if step == 0 else f"{q}:{step}")
                counts = pipe.execute()
            return {(q, p.value): int(n) for (q, p), n in zip(keys, counts, strict=True)}
        finally:
            client.close()


class AmqpQueues:
    """A RabbitMQ broker's queues (see the module). ``repair``: the kombu queues to declare
    again when they are missing (the Celery app's, ``app.amqp.queues``); none, it only reads."""

    def __init__(self, url: str, repair: Sequence[Any] = ()) -> None:
        self.url = url
        self.repair = {q.name: q for q in repair}

    def depth(self) -> dict[tuple[str, str], int]:
        from kombu import Connection

        counts: dict[tuple[str, str], int] = {}
        with Connection(self.url, connect_timeout=CONNECT_TIMEOUT) as connection:
            connection.ensure_connection(max_retries=1)
            for name in ALL_QUEUES:
                counts[(name, ALL_PRIORITIES)] = self._ready(connection, name)
        return counts

    def _ready(self, connection: Any, name: str) -> int:
        """The queue's ready messages; 0 when it is missing (declared again if in ``repair``)."""
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue=name, passive=True).message_count)
        except connection.channel_errors:  # NOT_FOUND, which closes the channel
            if name in self.repair:
                self.repair[name].bind(connection.default_channel).declare()
            return 0
        finally:
            if channel.is_open:
                channel.close()


def queues_of(broker_url: str, repair: Sequence[Any] = ()) -> BrokerQueues | None:
    """The adapter for the broker at ``broker_url``; None for a broker none can read (the
    in-process memory broker: see :func:`conveyor.embedded.memory_holds`)."""
    if broker_url.startswith(REDIS_SCHEMES):
        return RedisQueues(broker_url)
    if broker_url.startswith(AMQP_SCHEMES):
        return AmqpQueues(broker_url, repair)
    return None


def is_amqp(broker_url: str) -> bool:
    return broker_url.startswith(AMQP_SCHEMES)
