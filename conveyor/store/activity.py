"""Reads for the operators' overview (part of :class:`~conveyor.store.sql_store.SqlStore`):
the tries that ended in each step of the last hour, the executions' trigger-to-start
latencies, and the alerts firing. Across every tenant: only an operator's session shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from conveyor.engine.states import AttemptStatus, JobKind
from conveyor.models import AlertState, Execution, Job, JobAttempt

LATENCY_ROWS = 10_000  # the most recent executions a latency figure reads


@dataclass(frozen=True, kw_only=True)
class Step:
    """The tries that ended in one step of time: ``[start, start + step)``."""

    start: datetime
    succeeded: int
    failed: int


class ActivityQueries:
    session: Session

    def attempt_steps(self, since: datetime, step: timedelta, steps: int) -> list[Step]:
        """Tries that ended (succeeded or failed) in each of ``steps`` steps from ``since``:
        one scan of the tries, counted per step by the database."""
        starts = [since + step * i for i in range(steps)]
        ended = JobAttempt.finished_at
        counts = []
        for begin in starts:
            inside = and_(ended >= begin, ended < begin + step)
            for status in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED):
                hit = and_(inside, JobAttempt.status == status)
                counts.append(func.coalesce(func.sum(case((hit, 1), else_=0)), 0))
        row = self.session.execute(
            select(*counts).where(ended >= since, ended < since + step * steps)
        ).one()
        return [
            Step(start=begin, succeeded=int(row[2 * i]), failed=int(row[2 * i + 1]))
            for i, begin in enumerate(starts)
        ]

    def start_latencies(self, since: datetime) -> list[float]:
        """Seconds from each execution's trigger (created after ``since``) to the start of
        its first node's first try, for those started (the newest LATENCY_ROWS)."""
        first = (
            select(Execution.created_at, func.min(JobAttempt.started_at).label("started"))
            .join(Job, Job.execution_id == Execution.id)
            .join(JobAttempt, JobAttempt.job_id == Job.id)
            .where(Execution.created_at >= since, Job.kind == JobKind.NODE)
            .group_by(Execution.id, Execution.created_at)
            .order_by(Execution.created_at.desc())
            .limit(LATENCY_ROWS)
        )
        rows = self.session.execute(first).all()
        return [max(0.0, (r.started - r.created_at).total_seconds()) for r in rows]

    def alerts_firing(self) -> list[str]:
        """The alert rules firing at their last evaluation (by any process)."""
        firing = self.session.scalar(select(AlertState.firing).where(AlertState.id == 1))
        return list(firing or [])
