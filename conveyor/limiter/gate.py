"""Admission of node jobs under the concurrency limits.

A node job's permits are taken before it is claimed and given back after its outcome is
committed. A job without permits is parked (``queued -> parked``) and its message acked: it
holds no worker slot and nothing polls for it. Whoever releases permits, or the sweep, wakes
the next parked jobs and publishes them; a woken job finds its permits granted on arrival.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from conveyor import logs
from conveyor.engine import limits
from conveyor.engine.definitions import Workflow
from conveyor.engine.limits import Permit, PermitRequest, Wake
from conveyor.engine.ports import Limiter
from conveyor.engine.queues import NODE_QUEUE, may_hold
from conveyor.engine.records import Admission, Dispatch, NodeHints
from conveyor.engine.states import RUNNABLE_JOB, JobKind, JobStatus, Priority
from conveyor.engine.workflows import cached_workflow, load_workflow
from conveyor.limiter.heartbeat import LeaseKeeper
from conveyor.store import Database

if TYPE_CHECKING:
    from conveyor.store.sql_store import SqlStore

log = logging.getLogger("conveyor.limits")

Publish = Callable[[Sequence[Dispatch]], None]
# At most how many jobs each queue's waiting messages name; None when the broker cannot tell.
BrokerHolds = Callable[[], Mapping[str, int] | None]


Names = Mapping[uuid.UUID, tuple[str, str | None]]


def woken_dispatches(woken: Sequence[Wake], names: Names | None = None) -> list[Dispatch]:
    """The messages of woken jobs, named as the limiter kept them (``names`` for those it
    kept none of). A woken job already waited its turn in the limiter's lines and holds its
    permits while its message travels: it goes to the front of the broker queue, not behind
    new arrivals."""
    known = {w.job_id: (w.workflow, w.node) for w in woken if w.node}
    return [_parked_dispatch(w.job_id, Priority.HIGH, {**(names or {}), **known}) for w in woken]


def _parked_dispatch(job_id: uuid.UUID, priority: Priority, names: Names) -> Dispatch:
    """A parked job's message, named for its workflow and node when they were read."""
    workflow, node = names.get(job_id, ("", None))
    return Dispatch(
        job_id=job_id, kind=JobKind.NODE, queue=NODE_QUEUE, priority=priority,
        workflow=workflow, node=node or "",
    )  # fmt: skip


# How long a process trusts the tenant limit it read (``conveyor tenants`` changes it).
TENANT_LIMIT_TTL = 5.0


class TenantLimits:
    """Each tenant's own concurrency limit as last read, for ``TENANT_LIMIT_TTL`` seconds."""

    def __init__(self, ttl: float = TENANT_LIMIT_TTL) -> None:
        self.ttl = ttl
        self._read: dict[uuid.UUID, tuple[int | None, float]] = {}

    def get(self, tenant_id: uuid.UUID) -> tuple[int | None] | None:
        """(the limit,) while fresh; None when unknown or stale."""
        found = self._read.get(tenant_id)
        if found is None or time.monotonic() - found[1] > self.ttl:
            return None
        return (found[0],)

    def put(self, tenant_id: uuid.UUID, limit: int | None) -> None:
        if len(self._read) > 10_000:
            self._read.clear()
        self._read[tenant_id] = (limit, time.monotonic())


class Gate:
    def __init__(
        self,
        db: Database,
        limiter: Limiter,
        *,
        defaults: limits.Limits,
        lease: float,
        publish: Publish,
        resend_after: float = 60.0,
        broker_holds: BrokerHolds = lambda: None,
    ) -> None:
        self.db = db
        self.limiter = limiter
        self.defaults = defaults
        self.keeper = LeaseKeeper(limiter, lease)
        self.publish = publish
        self.resend_after = resend_after
        self.broker_holds = broker_holds
        self._cursor: uuid.UUID | None = None
        self._tenant_limits = TenantLimits()

    def admit(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> Permit | None:
        """Permits for the job, or None: it was parked, or it is not runnable any more.

        With the message's hints the permits are asked for without reading the job: a job
        that is not runnable any more (a stale or duplicate message) then takes permits its
        claim gives back at once. The job is read only when the permits are refused."""
        admission: Admission | None = None
        if hints is not None:
            request = self._hinted(job_id, hints)
        else:
            found = self.db.autocommit(lambda s: self._request(s, job_id))
            if found is None:
                self._wake(self.limiter.forget([job_id]))  # it may hold a grant: pass it on
                return None
            admission, request = found
        acquired = self.limiter.acquire(request)
        self._wake(acquired.woken)
        if acquired.permit is None:
            if admission is None:  # hinted: what is the job now?
                admission = self.db.autocommit(lambda s: _runnable(s, job_id))
                if admission is None:
                    self._wake(self.limiter.forget([job_id]))  # not waiting for anything
                    return None
            if admission.status is JobStatus.QUEUED:
                self.db.run(lambda s: s.park_job(job_id))
            log.info("job %s parked: waiting for a permit under %s", job_id, acquired.blocked_by)
            return None
        self.keeper.hold(acquired.permit)
        return acquired.permit

    def try_admit(self, job_id: uuid.UUID, hints: NodeHints) -> Permit | None:
        """Permits for a job this worker would claim without a message (a continuation),
        or None: it keeps no place in the limiter's lines and is not parked (its message is
        published instead, and admitted as any other's)."""
        acquired = self.limiter.acquire(self._hinted(job_id, hints))
        self._wake(acquired.woken)
        if acquired.permit is None:
            self._wake(self.limiter.forget([job_id]))
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
        re-published, each once every ``resend_after`` seconds by whichever process claims
        it first (see :meth:`SqlStore.claim_resend`), and only while the node queue could not
        hold their messages (``broker_holds``). Returns how many jobs it published."""
        report = self.limiter.sweep(age_after)
        lost = self._lost_parked(batch)
        self._wake(report.woken)
        names = self._names([j for j, _ in lost])
        self.publish([_parked_dispatch(j, p, names) for j, p in lost])
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
        """Parked jobs the limiter does not know, that this process claimed to re-send.

        Every process sweeps, and after Redis came back empty every parked job is unknown
        until its re-sent message arrives, which may wait long behind others or for the
        workers to reconnect: unclaimed, each process re-sent each of them at each sweep (and
        swept again at once, having found work), a storm that buried the re-sent messages
        under their own duplicates."""
        parked = self.db.run(lambda s: s.parked_jobs(self._cursor, batch))
        self._cursor = parked[-1][0] if len(parked) == batch else None
        if not parked:
            return []
        known = self.limiter.known([job_id for job_id, _ in parked])
        unknown = [job_id for job_id, _ in parked if not known[job_id]]
        if not unknown or may_hold(self.broker_holds(), NODE_QUEUE, len(unknown)):
            return []
        now = datetime.now(UTC)
        since = now - timedelta(seconds=self.resend_after)
        claimed = self.db.run(lambda s: s.claim_resend(unknown, JobStatus.PARKED, now, since))
        return [(job_id, p) for job_id, p in parked if job_id in claimed]

    def _request(
        self, store: SqlStore, job_id: uuid.UUID
    ) -> tuple[Admission, PermitRequest] | None:
        admission = _runnable(store, job_id)
        if admission is None:
            return None
        self._tenant_limits.put(admission.tenant_id, admission.tenant_concurrency)
        workflow, _ = load_workflow(store, admission.workflow_id)
        request = self._permit_request(
            job_id,
            NodeHints(
                tenant_id=admission.tenant_id,
                workflow_id=admission.workflow_id,
                priority=admission.priority,
                enqueued_at=admission.enqueued_at,
                node_id=admission.node_id,
            ),
            workflow,
            admission.tenant_concurrency,
        )
        return admission, request

    def _hinted(self, job_id: uuid.UUID, hints: NodeHints) -> PermitRequest:
        """The request from a message's hints: the workflow from the process's cache of
        definitions, the tenant's own limit from a cache of a few seconds."""
        cached = cached_workflow(hints.workflow_id)
        workflow = cached[0] if cached is not None else None
        found = self._tenant_limits.get(hints.tenant_id)
        if workflow is None or found is None:

            def read(store: SqlStore) -> tuple[Workflow, int | None]:
                return (
                    load_workflow(store, hints.workflow_id)[0],
                    store.tenant_concurrency(hints.tenant_id),
                )

            workflow, tenant_limit = self.db.autocommit(read)
            self._tenant_limits.put(hints.tenant_id, tenant_limit)
        else:
            tenant_limit = found[0]
        return self._permit_request(job_id, hints, workflow, tenant_limit)

    def _permit_request(
        self, job_id: uuid.UUID, hints: NodeHints, workflow: Workflow, tenant_limit: int | None
    ) -> PermitRequest:
        return PermitRequest(
            job_id=job_id,
            tenant_id=hints.tenant_id,
            workflow_name=workflow.name,
            priority=hints.priority,
            limits=limits.resolve(
                self.defaults, tenant_override=tenant_limit, workflow_override=workflow.concurrency
            ),
            enqueued_at_ms=int(hints.enqueued_at.astimezone(UTC).timestamp() * 1000),
            node_id=hints.node_id or "",
        )

    def _wake(self, woken: Sequence[Wake]) -> None:
        """Publish woken jobs, named as the limiter kept them since they were parked: no read
        (this runs after nearly every node's outcome while a limit is saturated). Only a job
        parked by an older version, which kept no names, has them read."""
        if woken:
            unnamed = [w.job_id for w in woken if not w.node]
            self.publish(woken_dispatches(woken, self._names(unnamed)))

    def _names(self, job_ids: list[uuid.UUID]) -> Names:
        """The workflow and node of parked jobs, for their messages' names in Flower (one
        read). A job woken holds its permits while its message travels: should the read
        fail, the message goes without the names rather than not at all."""
        if not job_ids:
            return {}
        try:
            return self.db.autocommit(lambda s: s.job_names(job_ids))
        except SQLAlchemyError as exc:
            log.warning("publishing %d woken job(s) without their names: %s", len(job_ids), exc)
            return {}


def _runnable(store: SqlStore, job_id: uuid.UUID) -> Admission | None:
    """The job as the limiter sees it, or None (logged) when its message is to be dropped:
    no such node job, or one not waiting to run any more."""
    admission = store.admission(job_id)
    if admission is None or admission.kind is not JobKind.NODE:
        log.error("dropping a message for job %s: no such node job", job_id)
        return None
    if admission.status not in RUNNABLE_JOB:
        logs.message_dropped(job_id, f"job {admission.status.value}")
        return None
    return admission


def _count(store: SqlStore, lapsed_grants: int, lost_parked: int) -> None:
    store.count_recovered("lapsed_grants", lapsed_grants)
    store.count_recovered("lost_parked", lost_parked)
