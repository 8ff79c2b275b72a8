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
    workflow_of,
)
from conveyor.exceptions import LimitError

_SCRIPT = files("conveyor.limiter").joinpath("limiter.lua").read_text()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wakes(flat: Sequence[Any]) -> list[Wake]:
    """The script's grants: job id, class, workflow key and node, for each job woken."""
    return [
        Wake(
            job_id=uuid.UUID(_text(flat[i])),
            priority=CLASS_PRIORITY[int(_text(flat[i + 1]))],
            workflow=workflow_of(_text(flat[i + 2])),
            node=_text(flat[i + 3]),
        )
        for i in range(0, len(flat), 4)
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

    def _call(self, op: str, *args: str | int) -> Any:
        try:
            return self._script(args=[op, self.prefix, self.lease_ms, *args])
        except redis.RedisError as exc:
            raise LimitError(
                f"the concurrency limiter could not {op} ({exc}); check that Redis at "
                f"CONVEYOR_REDIS_URL is reachable"
            ) from exc

    def acquire(self, request: PermitRequest) -> Acquired:
        limits = request.limits
        status, detail, woken = self._call(
            "acquire",
            str(request.job_id),
            request.tenant_key,
            request.workflow_key,
            PRIORITY_CLASS[request.priority],
            limits.global_,
            limits.tenant,
            limits.workflow,
            request.enqueued_at_ms,
            request.node_id,
        )
        if _text(status) != "granted":
            return Acquired(permit=None, blocked_by=_text(detail), woken=_wakes(woken))
        permit = Permit(
            token=_text(detail), tenant_key=request.tenant_key, workflow_key=request.workflow_key
        )
        return Acquired(permit=permit, woken=_wakes(woken))

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
