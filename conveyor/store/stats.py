"""The SQL behind metrics and `conveyor stats`: counts and latency histograms, read at scrape
time from the source of truth, so every worker process and the API agree (part of
:class:`SqlStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from conveyor.models import Execution, Job, JobAttempt, Schedule


class StatsQueries:
    session: Session

    def job_counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> jobs."""
        rows = self.session.execute(
            select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)
        ).all()
        return {(kind.value, status.value): n for kind, status, n in rows}

    def execution_counts(self) -> dict[str, int]:
        rows = self.session.execute(
            select(Execution.status, func.count()).group_by(Execution.status)
        ).all()
        return {status.value: n for status, n in rows}

    def attempt_counts(self) -> dict[str, int]:
        """Tries by outcome, ever: their rate is throughput, the failed share the error rate."""
        rows = self.session.execute(
            select(JobAttempt.status, func.count()).group_by(JobAttempt.status)
        ).all()
        return {status.value: n for status, n in rows}

    def histogram(self, column: str, bounds: Sequence[float]) -> tuple[list[int], float, int]:
        """Cumulative counts of ``job_attempts.<column>`` at or under each bound, their sum and
        their count (the shape of a Prometheus histogram)."""
        value: ColumnElement[float] = getattr(JobAttempt, column)
        row = self.session.execute(
            select(
                *[func.count().filter(value <= bound) for bound in bounds],
                func.coalesce(func.sum(value), 0.0),
                func.count(value),
            )
        ).one()
        return [int(n) for n in row[: len(bounds)]], float(row[-2]), int(row[-1])

    def schedule_lag(self, now: datetime) -> tuple[int, float]:
        """Enabled schedules whose slot has passed unfired, and the oldest one's delay."""
        count, oldest = self.session.execute(
            select(func.count(), func.min(Schedule.next_run_at)).where(
                Schedule.enabled.is_(True), Schedule.next_run_at <= now
            )
        ).one()
        if not count or oldest is None:
            return 0, 0.0
        if oldest.tzinfo is None:  # SQLite hands back naive UTC through an aggregate
            from datetime import UTC

            oldest = oldest.replace(tzinfo=UTC)
        return int(count), (now - oldest).total_seconds()
