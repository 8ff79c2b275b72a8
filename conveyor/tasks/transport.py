"""The Redis transport, guarded: a message on a queue that is not even a kombu envelope
(garbage pushed by hand, a client of another protocol) is logged and dropped, where kombu's
own transport lets the decode error stop the worker for good."""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis
from kombu.transport.virtual import Empty

log = logging.getLogger("conveyor.broker")
_MALFORMED = (ValueError, TypeError, KeyError, UnicodeDecodeError)


class GuardedChannel(redis.Channel):
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
