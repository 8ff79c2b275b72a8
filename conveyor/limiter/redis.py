"""The limiter port over Redis: one Lua script, every operation a single atomic call.

Redis runs the script with its own clock, so leases mean the same to every worker. The keys
live under one prefix in one Redis database (a Redis Cluster is not supported: the script
derives its key names). Redis errors become :class:`LimitError`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

import redis

from conveyor.engine.limits import (
    CLASS_PRIORITY,
    PRIORITY_CLASS,
    Acquired,
    KeyUsage,
    Permit,
    PermitRequest,
    SweepReport,
    Wake,
)
from conveyor.exceptions import LimitError

_SCRIPT = files("conveyor.limiter").joinpath("limiter.lua").read_text()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wakes(flat: Sequence[Any]) -> list[Wake]:
    return [
        Wake(job_id=uuid.UUID(_text(flat[i])), priority=CLASS_PRIORITY[int(_text(flat[i + 1]))])
        for i in range(0, len(flat), 2)
    ]


class RedisLimiter:
    def __init__(
        self, client: redis.Redis, *, lease: float = 30.0, prefix: str = "conveyor:limits"
    ) -> None:
        self.client = client
        self.lease_ms = max(1, int(lease * 1000))
        self.prefix = prefix
        self._script = client.register_script(_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, lease: float = 30.0) -> RedisLimiter:
        return cls(redis.Redis.from_url(url, health_check_interval=30), lease=lease)

    def acquire(self, request: PermitRequest) -> Acquired:
        return _acquired(request, self._call("acquire", *_acquire_args(request)))

    def begin_acquire(self, request: PermitRequest) -> PendingAcquire:
        """Send a try-only acquire (refused: the job is not parked) on a connection of its
        own and return at once; :meth:`PendingAcquire.result` reads the answer."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_command(  # type: ignore[no-untyped-call]
                "EVALSHA", self._script.sha, 0, "acquire", self.prefix, self.lease_ms,
                *_acquire_args(request), _TRY_ONLY,
            )  # fmt: skip
        except redis.RedisError as exc:  # send_command disconnected it
            pool.release(connection)
            raise _limit_error("acquire", exc) from exc
        return PendingAcquire(self, request, connection)

    def _try_acquire(self, request: PermitRequest) -> Any:
        return self._call("acquire", *_acquire_args(request), _TRY_ONLY)

    def _call(self, op: str, *args: str | int) -> Any:
        try:
            return self._script(args=[op, self.prefix, self.lease_ms, *args])
        except redis.RedisError as exc:
            raise _limit_error(op, exc) from exc

    def release(self, permit: Permit) -> list[Wake]:
        return _wakes(self._call("release", permit.token, permit.tenant_key, permit.workflow_key))

    def renew(self, permits: Sequence[Permit]) -> list[str]:
        if not permits:
            return []
        args = [a for p in permits for a in (p.token, p.tenant_key, p.workflow_key)]
        return [_text(t) for t in self._call("renew", *args)]

    def sweep(self, age_after: float) -> SweepReport:
        aged, lapsed, woken = self._call("sweep", int(age_after * 1000))
        return SweepReport(aged=int(aged), lapsed_grants=int(lapsed), woken=_wakes(woken))

    def forget(self, job_ids: Sequence[uuid.UUID]) -> list[Wake]:
        if not job_ids:
            return []
        return _wakes(self._call("forget", *(str(j) for j in job_ids)))

    def known(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        if not job_ids:
            return {}
        states = self._call("status", *(str(j) for j in job_ids))
        return {j: _text(s) for j, s in zip(job_ids, states, strict=True)}

    def snapshot(self) -> list[KeyUsage]:
        flat = self._call("snapshot")
        usages = [
            KeyUsage(
                key=_text(flat[i]),
                in_use=int(flat[i + 1]),
                limit=int(flat[i + 2]),
                waiting=int(flat[i + 3]),
            )
            for i in range(0, len(flat), 4)
        ]
        order = {"global": 0, "tenant": 1, "workflow": 2}
        return sorted(usages, key=lambda u: (order.get(u.kind, 3), u.key))


class PendingAcquire:
    """A try-only acquire sent and not answered yet: its caller claims the job meanwhile (two
    round trips at once, to Redis and to PostgreSQL). Read it exactly once."""

    def __init__(
        self, limiter: RedisLimiter, request: PermitRequest, connection: redis.Connection
    ) -> None:
        self._limiter = limiter
        self._request = request
        self._connection: redis.Connection | None = connection

    def result(self) -> Acquired:
        connection, self._connection = self._connection, None
        if connection is None:
            raise RuntimeError("a pending acquire is read once")
        pool = self._limiter.client.connection_pool
        try:
            reply = connection.read_response()
        except redis.exceptions.NoScriptError:  # Redis restarted or flushed its scripts
            pool.release(connection)
            return _acquired(self._request, self._limiter._try_acquire(self._request))
        except redis.RedisError as exc:  # read_response disconnected it: no reply left behind
            pool.release(connection)
            raise _limit_error("acquire", exc) from exc
        pool.release(connection)
        return _acquired(self._request, reply)


_TRY_ONLY = 1  # limiter.lua's acquire, ARGV[12]: refused, the job is not parked


def _acquire_args(request: PermitRequest) -> list[str | int]:
    limits = request.limits
    return [
        str(request.job_id), request.tenant_key, request.workflow_key,
        PRIORITY_CLASS[request.priority], limits.global_, limits.tenant, limits.workflow,
        request.enqueued_at_ms,
    ]  # fmt: skip


def _acquired(request: PermitRequest, reply: Any) -> Acquired:
    status, detail, woken = reply
    if _text(status) != "granted":
        return Acquired(permit=None, blocked_by=_text(detail), woken=_wakes(woken))
    permit = Permit(
        token=_text(detail), tenant_key=request.tenant_key, workflow_key=request.workflow_key
    )
    return Acquired(permit=permit, woken=_wakes(woken))


def _limit_error(op: str, exc: BaseException) -> LimitError:
    return LimitError(
        f"the concurrency limiter could not {op} ({exc}); check that Redis at "
        f"CONVEYOR_REDIS_URL is reachable"
    )
