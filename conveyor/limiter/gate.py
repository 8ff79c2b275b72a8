"""Admission of node jobs under the concurrency limits.

A node job's permits are taken before it is claimed and given back after its outcome is
committed. A job without permits is parked (``queued -> parked``) and its message acked: it
holds no worker slot and nothing polls for it. Whoever releases permits, or the sweep, wakes
the next parked jobs and publishes them; a woken job finds its permits granted on arrival.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import TYPE_CHECKING

from conveyor.engine import limits, runner
from conveyor.engine.limits import Permit, PermitRequest, Wake
from conveyor.engine.ports import Limiter
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import Admission, Dispatch
from conveyor.engine.states import JobKind, JobStatus, Priority
from conveyor.limiter.heartbeat import LeaseKeeper
from conveyor.store import Database

if TYPE_CHECKING:
    from conveyor.store.sql import SqlStore

log = logging.getLogger("conveyor.limits")

Publish = Callable[[Sequence[Dispatch]], None]


def woken_dispatches(woken: Sequence[Wake]) -> list[Dispatch]:
    # A woken job already waited its turn in the limiter's lines and holds its permits while
    # its message travels: it goes to the front of the broker queue, not behind new arrivals.
    return [
        Dispatch(job_id=w.job_id, kind=JobKind.NODE, queue=NODE_QUEUE, priority=Priority.HIGH)
        for w in woken
    ]


class Gate:
    def __init__(
        self,
        db: Database,
        limiter: Limiter,
        *,
        defaults: limits.Limits,
        lease: float,
        publish: Publish,
    ) -> None:
        self.db = db
        self.limiter = limiter
        self.defaults = defaults
        self.keeper = LeaseKeeper(limiter, lease)
        self.publish = publish
        self._cursor: uuid.UUID | None = None

    def admit(self, job_id: uuid.UUID) -> Permit | None:
        """Permits for the job, or None: it was parked, or it is not runnable any more."""
        found = self.db.autocommit(lambda s: self._request(s, job_id))
        if found is None:
            self._wake(self.limiter.forget([job_id]))  # it may hold a grant: pass it on
            return None
        admission, request = found
        acquired = self.limiter.acquire(request)
        self._wake(acquired.woken)
        if acquired.permit is None:
            if admission.status is JobStatus.QUEUED:
                self.db.run(lambda s: s.park_job(job_id))
            log.info("job %s parked: waiting for a permit under %s", job_id, acquired.blocked_by)
            return None
        self.keeper.hold(acquired.permit)
        return acquired.permit

    def release(self, permit: Permit) -> None:
        self.keeper.drop(permit)
        self._wake(self.limiter.release(permit))

    def forget(self, job_ids: Sequence[uuid.UUID]) -> None:
        self._wake(self.limiter.forget(job_ids))

    def sweep(self, age_after: float, batch: int = 500) -> int:
        """The safety net, run periodically: lapsed leases and grants come back, low jobs age,
        and parked jobs the limiter lost (Redis flushed, a wake never published) are
        re-published. Returns how many jobs it published."""
        report = self.limiter.sweep(age_after)
        lost = self._lost_parked(batch)
        self._wake(report.woken)
        self.publish(
            [Dispatch(job_id=j, kind=JobKind.NODE, queue=NODE_QUEUE, priority=p) for j, p in lost]
        )
        if report.lapsed_grants or lost:  # repairs: counted, as the recovery sweep's are
            self.db.run(lambda s: _count(s, report.lapsed_grants, len(lost)))
        if report.aged or report.lapsed_grants or lost:
            log.info(
                "limits sweep: %d aged, %d lapsed grants, %d woken, %d lost parked re-published",
                report.aged,
                report.lapsed_grants,
                len(report.woken),
                len(lost),
            )
        return len(report.woken) + len(lost)

    def _lost_parked(self, batch: int) -> list[tuple[uuid.UUID, Priority]]:
        parked = self.db.run(lambda s: s.parked_jobs(self._cursor, batch))
        self._cursor = parked[-1][0] if len(parked) == batch else None
        if not parked:
            return []
        known = self.limiter.known([job_id for job_id, _ in parked])
        return [(job_id, p) for job_id, p in parked if not known[job_id]]

    def _request(
        self, store: SqlStore, job_id: uuid.UUID
    ) -> tuple[Admission, PermitRequest] | None:
        admission = store.admission(job_id)
        if admission is None or admission.kind is not JobKind.NODE:
            log.error("dropping a message for job %s: no such node job", job_id)
            return None
        if admission.status not in (JobStatus.QUEUED, JobStatus.PARKED):
            log.info("job %s is %s; message dropped", job_id, admission.status.value)
            return None
        workflow, _ = runner.load_workflow(store, admission.workflow_id)
        request = PermitRequest(
            job_id=job_id,
            tenant_id=admission.tenant_id,
            workflow_name=workflow.name,
            priority=admission.priority,
            limits=limits.resolve(
                self.defaults,
                tenant_override=admission.tenant_concurrency,
                workflow_override=workflow.concurrency,
            ),
            enqueued_at_ms=int(admission.enqueued_at.astimezone(UTC).timestamp() * 1000),
        )
        return admission, request

    def _wake(self, woken: Sequence[Wake]) -> None:
        if woken:
            self.publish(woken_dispatches(woken))


def _count(store: SqlStore, lapsed_grants: int, lost_parked: int) -> None:
    store.count_recovered("lapsed_grants", lapsed_grants)
    store.count_recovered("lost_parked", lost_parked)
