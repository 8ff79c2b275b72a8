"""The store assembled: every query module over one session. What both databases run alike
lives in the query modules; the few transitions each runs its own way (an execution's
creation, a node's claim and success, a batch of node jobs) are abstract here and written
once per database by its adapter: :class:`~conveyor.store.postgres.PostgresStore`,
:class:`~conveyor.store.sqlite.SqliteStore`. No caller asks which database it has."""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select

from conveyor.engine import step_parts
from conveyor.engine.records import (
    Created,
    ExecutionRecord,
    Finish,
    JobRecord,
    NewJob,
    Stepped,
    Succeeded,
)
from conveyor.engine.states import JobKind, JobStatus, Priority, priorities_above
from conveyor.store.access import AccessQueries
from conveyor.store.activity import ActivityQueries
from conveyor.store.catalog import CatalogQueries
from conveyor.store.dead_letters import DeadLetterQueries
from conveyor.store.executions import ExecutionQueries
from conveyor.store.listing import ListingQueries
from conveyor.store.map_items import MapItemQueries
from conveyor.store.recovery import RecoveryQueries
from conveyor.store.reruns import RerunQueries
from conveyor.store.schedules import ScheduleQueries
from conveyor.store.session import JOBS
from conveyor.store.stats import StatsQueries
from conveyor.store.waits import WaitQueries


class SqlStore(
    ActivityQueries,
    CatalogQueries,
    ExecutionQueries,
    MapItemQueries,
    ScheduleQueries,
    AccessQueries,
    DeadLetterQueries,
    RerunQueries,
    StatsQueries,
    RecoveryQueries,
    ListingQueries,
    WaitQueries,
):
    """The :class:`~conveyor.engine.ports.Store` port over one SQLAlchemy session; the
    transitions' contracts are the port's docstrings."""

    @abstractmethod
    def lock_applies(self, tenant_id: uuid.UUID) -> None: ...

    @abstractmethod
    def lock_correlation(self, tenant_id: uuid.UUID, event: str, key: str) -> None: ...

    @abstractmethod
    def create_execution(
        self,
        execution: ExecutionRecord,
        *,
        names: tuple[str, str] | None,
        trigger: str,
        now: datetime,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        waiting_on: Mapping[str, int] | None = None,
        queued: Collection[str] = (),
        jobs: Sequence[NewJob] = (),
        start_job: uuid.UUID | None = None,
    ) -> Created: ...

    @abstractmethod
    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None: ...

    @abstractmethod
    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None: ...

    def claim_continuation(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        *,
        queue: str,
        priority: Priority,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """See :class:`~conveyor.engine.ports.Jobs`: a look for a queued job of a higher
        priority (ix_jobs_queued_priority: by priority, not through a backlog of queued jobs),
        then the node's own claim."""
        above = priorities_above(priority)
        if above and self._core(select(exists().where(
            JOBS.c.status == JobStatus.QUEUED, JOBS.c.priority.in_(above),
            JOBS.c.queue == queue, JOBS.c.kind == JobKind.NODE,
        ))).scalar_one():  # fmt: skip
            return None
        return self.claim_node_job(job_id, now, worker, needs=needs, input=input)

    def complete_step(
        self,
        succeeded: Succeeded,
        successor: NewJob,
        *,
        worker: str | None,
        claim: bool,
    ) -> Stepped | None:
        """See :class:`~conveyor.engine.ports.Jobs`: its parts in turn
        (:mod:`conveyor.engine.step_parts`); PostgreSQL's in one statement."""
        return step_parts.complete_step(self, succeeded, successor, worker=worker, claim=claim)

    @abstractmethod
    def complete_running(
        self,
        job: JobRecord,
        node_id: str,
        *,
        output: Any,
        branch: str | None,
        now: datetime,
        duration: float,
        successors: Sequence[str] | None = None,
        finish: Finish | None = None,
    ) -> bool: ...
