"""The Redis transport, guarded: a message on a queue that is not even a kombu envelope
(garbage pushed by hand, a client of another protocol) is logged and dropped, where kombu's
own transport lets the decode error stop the worker for good.

And safe to close after a lost broker: a channel left open when its connection was collected
(see :meth:`GuardedChannel._connparams`) raises a connection error, never an AttributeError
that stops the worker.

And cheaper: kombu makes a new redis-py client for every publish, task event and ack (over
the channel's shared connection pool), and redis-py builds some 170 response callbacks for
each; that was a third of a publish's CPU. A channel here keeps one client per pool: the
client holds no connection of its own and is safe to share between threads."""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis
from kombu.transport.virtual import Empty
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger("conveyor.broker")
_MALFORMED = (ValueError, TypeError, KeyError, UnicodeDecodeError)


class GuardedChannel(redis.Channel):
    _kept: tuple[Any, Any] | None = None  # (the pool, its client)

    def _connparams(self, asynchronous: bool = False) -> Any:
        """Celery's consumer, its broker lost, collects the connection, then closes it. A
        channel whose first close a read on the dead socket cut short is closed again on a
        transport already collected, and gives back its unacked messages through a new pool
        built from the transport's settings, gone by then: kombu's AttributeError there is no
        connection error, which that clean-up ignores, and it stopped the worker for good (the
        chaos outage test's planner, 220 executions never finished). A connection error is
        what it is: the messages stay in the unacked hash, restored after the visibility
        timeout, and the consumer reconnects."""
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError(
                "this broker channel's connection was closed; a new channel is needed"
            )
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # kombu keeps this one itself (Channel.client)
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool  # a new pool after a reconnect: a new client for it
        if self._kept is None or self._kept[0] is not pool:
            self._kept = (pool, super()._create_client())  # type: ignore[misc]
        return self._kept[1]

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]
        except _MALFORMED as exc:  # BRPOP already took it off the queue: it is dropped
            log.error("dropped a malformed message from the broker: %r", exc)
            raise Empty() from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        try:
            return super()._get(queue)
        except _MALFORMED as exc:
            log.error("dropped a malformed message from queue %s: %r", queue, exc)
            raise Empty() from exc


class GuardedTransport(redis.Transport):
    Channel = GuardedChannel
