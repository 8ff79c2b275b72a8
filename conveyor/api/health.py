"""``/health`` and ``/ready``, as Kubernetes probes them.

``/health`` is liveness: the process answers, and nothing else is looked at, so that a
database outage never gets every API process restarted. ``/ready`` is readiness: the database
answers, the broker accepts a connection, and Redis answers when one is configured (the
limiter's); otherwise 503 naming each that failed (in the API's one error shape), so that
traffic goes elsewhere until it is back. A check's error is logged in full and answered by
its type only: the probe needs no key, and an error's text may name hosts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
from kombu import Connection
from pydantic import BaseModel

from conveyor.config import Settings
from conveyor.store import Database

log = logging.getLogger("conveyor.api")

TIMEOUT = 2  # seconds a check may take; a probe's own timeout is usually 1 to 5


class Live(BaseModel):
    status: str  # "ok"


class Readiness(BaseModel):
    """Each check's outcome: "ok", or "failed: <error type>"."""

    status: str  # "ready", or "not ready"
    checks: dict[str, str]


def readiness(settings: Settings, database: Database) -> Readiness:
    """Run every check (none stops the others); the outcome of each."""
    checks: dict[str, Callable[[], None]] = {
        "database": database.ping,
        "broker": lambda: _broker(settings.resolved_broker_url),
    }
    if (url := settings.resolved_redis_url) is not None:
        checks["redis"] = lambda: _redis(url)
    running = {name: _Check(name, check) for name, check in checks.items()}
    deadline = time.monotonic() + TIMEOUT + 0.5
    outcomes = {name: check.outcome(deadline) for name, check in running.items()}
    ready = all(o == "ok" for o in outcomes.values())
    return Readiness(status="ready" if ready else "not ready", checks=outcomes)


class _Check:
    """A check run on a daemon thread of its own, so that one that hangs (a database behind a
    firewall that drops packets) is answered as failed at the deadline instead of holding the
    probe, and never holds up the process's exit."""

    def __init__(self, name: str, check: Callable[[], None]) -> None:
        self.name = name
        self.error: Exception | None = None
        self._thread = threading.Thread(
            target=self._run, args=(check,), name=f"conveyor-ready-{name}", daemon=True
        )
        self._thread.start()

    def _run(self, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:
            self.error = exc

    def outcome(self, deadline: float) -> str:
        """ "ok", or "failed: <error type>" (its error logged in full)."""
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("readiness: the %s check did not answer within %s s", self.name, TIMEOUT)
            return "failed: TimeoutError"
        if self.error is not None:
            log.warning("readiness: the %s check failed: %s", self.name, self.error)
            return f"failed: {type(self.error).__name__}"
        return "ok"


def _broker(url: str) -> None:
    with Connection(url, connect_timeout=TIMEOUT) as connection:
        connection.ensure_connection(max_retries=0, timeout=TIMEOUT)


def _redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)
    try:
        client.ping()
    finally:
        client.close()
