"""The narrow ports the engine talks through. Real adapters: :mod:`conveyor.store.sql`
(the store), :mod:`conveyor.tasks.dispatch` (the dispatcher) and :mod:`conveyor.limiter` (the
limiter)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from conveyor.engine.limits import Acquired, KeyUsage, Permit, PermitRequest, SweepReport, Wake
from conveyor.engine.records import Dispatch


class Dispatcher(Protocol):
    """Publishes job ids to the broker. Called only after the transaction has committed.
    ``batch``: node jobs may share a message (see :mod:`conveyor.engine.batching`); False
    sends each in a message of its own (a batch's hand-back)."""

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None: ...


class Limiter(Protocol):
    """Concurrency permits for node jobs (see :mod:`conveyor.engine.limits`).

    Every call is atomic. A call that frees or finds room wakes parked jobs and returns them;
    the caller publishes them. Adapter: :class:`conveyor.limiter.RedisLimiter`.
    """

    def acquire(self, request: PermitRequest) -> Acquired:
        """All three permits, or none and the job parked (a parked job asking again, as a
        duplicate message would, stays parked once)."""
        ...

    def release(self, permit: Permit) -> list[Wake]:
        """Give the permits back and wake whoever can run now."""
        ...

    def renew(self, permits: Sequence[Permit]) -> list[str]:
        """Extend the leases (the heartbeat); returns the tokens whose lease had lapsed."""
        ...

    def sweep(self, age_after: float) -> SweepReport:
        """The safety net: take back lapsed leases and grants, age low jobs, wake who fits."""
        ...

    def forget(self, job_ids: Sequence[uuid.UUID]) -> list[Wake]:
        """Jobs that will never run (cancelled) leave the lines and give back any grant."""
        ...

    def known(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        """For each job: 'parked', 'granted' or '' when the limiter does not know it."""
        ...

    def snapshot(self) -> list[KeyUsage]:
        """Every key with its permits in use, its limit and the jobs waiting under it."""
        ...
