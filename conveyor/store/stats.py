"""The SQL behind metrics and `conveyor stats`: counts and latency histograms, read at scrape
time from the source of truth, so every worker process and the API agree (part of
:class:`SqlStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from conveyor.models import AlertState, Execution, Job, JobAttempt, Schedule


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

    def claim_alert_turn(
        self, now: datetime, interval: float
    ) -> tuple[dict[str, Any] | None, list[str]] | None:
        """This process's turn to evaluate the alerts, if the last evaluation (by anyone) is at
        least ``interval`` seconds old: the counters and firing rules it left."""
        dialect = postgresql if self.session.get_bind().dialect.name == "postgresql" else sqlite
        self.session.execute(
            dialect.insert(AlertState)
            .values(id=1, evaluated_at=datetime(2000, 1, 1, tzinfo=UTC), counters=None, firing=[])
            .on_conflict_do_nothing()
        )
        row = self.session.execute(
            update(AlertState)
            .where(AlertState.id == 1, AlertState.evaluated_at <= now - timedelta(seconds=interval))
            .values(evaluated_at=now)
            .returning(AlertState.counters, AlertState.firing)
        ).one_or_none()
        return (row.counters, list(row.firing or [])) if row else None

    def save_alert_state(self, counters: dict[str, Any], firing: list[str]) -> None:
        self.session.execute(
            update(AlertState).where(AlertState.id == 1).values(counters=counters, firing=firing)
        )

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
            oldest = oldest.replace(tzinfo=UTC)
        return int(count), (now - oldest).total_seconds()
