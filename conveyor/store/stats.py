"""The SQL behind metrics and `conveyor stats`: counts and latency histograms, read at scrape
time from the source of truth, so every worker process and the API agree (part of
:class:`SqlStore`). Read them in one :meth:`Database.snapshot`: the tries the retention sweep
deletes move from ``job_attempts`` to ``pruned_tallies`` in one commit, and statements of a
plain transaction each see their own moment."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Select,
    bindparam,
    func,
    null,
    select,
    update,
)
from sqlalchemy.orm import Session

from conveyor.engine.states import AttemptStatus
from conveyor.models import (
    AlertState,
    Execution,
    Job,
    JobAttempt,
    PrunedTally,
    Schedule,
    WorkflowVersion,
)
from conveyor.store.session import upsert

# The bounds (seconds) of the histograms of how long tries waited and ran: the metrics'
# buckets, and those the retention sweep adds up the tries it deletes at.
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
MEASURED = ("waited", "duration")  # the columns of job_attempts with a histogram
# Each histogram's labels: how long tries waited by queue (the backlog decides it), how long
# they ran by queue and workflow. Bounded by the definitions, never by traffic.
LABELS = {"waited": ("queue",), "duration": ("queue", "workflow")}
Tallies = Mapping[str, tuple[int, float]]  # pruned_tallies: what -> (count, total)
Labelled = dict[tuple[str, ...], tuple[list[int], float, int]]


def tally_name(column: str, bound: float | None = None, labels: Sequence[str] = ()) -> str:
    """The ``pruned_tallies`` row of a histogram: its count and sum, or a bucket's count, for
    one value of each of its labels (``duration<=0.5|workflow-node|orders``). Queue and
    workflow names never hold a ``|``. Rows written before the labels (schema 0013) have
    none: they count under empty labels."""
    name = column if bound is None else f"{column}<={bound!r}"
    return "|".join((name, *labels))


def tally_of(session: Session, execution_ids: Sequence[uuid.UUID]) -> dict[str, tuple[int, float]]:
    """The finished tries of these executions, added up as ``pruned_tallies`` rows: read
    before the executions are deleted, and added by :func:`add_to_tallies` after. A try still
    ``running`` in a finished execution (cancelled) will never finish: it is not counted.

    The ids are sent as literals, so that PostgreSQL plans the statement for them each time:
    a prepared statement (psycopg prepares one at its fifth run) got a generic plan that read
    every try and compared each with every id, 2.4 s a batch with 200,000 executions."""
    doomed: BindParameter[list[uuid.UUID]] = bindparam(
        "doomed", list(execution_ids), expanding=True, literal_execute=True
    )
    tallying = _tallying(Job.execution_id.in_(doomed))
    rows = session.execute(tallying.join_from(JobAttempt, Job, Job.id == JobAttempt.job_id)).all()
    return _tallies([row for row in rows if row[0] is not AttemptStatus.RUNNING], session)


def _tallying(*where: ColumnElement[bool], labelled: bool = True) -> Select[Any]:
    """The tries (those ``where`` says) added up by status, queue and workflow version in one
    scan of ``job_attempts`` alone (the claim copies the job's queue and workflow into the
    try's row: grouping by them costs no join; by status alone if not ``labelled``): their
    number, and for each measured column the count and sum of its values and a count per
    bound. (A CASE giving each value its bucket, grouped by, was tried: it sorts the rows by
    bucket, and read 1,000,000 tries of spread values in 0.95 s, where counts per bound take
    0.74 to 0.82.)"""
    columns: list[ColumnElement[Any]] = []
    for name in MEASURED:
        value: ColumnElement[float] = getattr(JobAttempt, name)
        columns += [func.count(value), func.coalesce(func.sum(value), 0.0)]
        columns += [func.count().filter(value <= bound) for bound in BOUNDS]
    if not labelled:
        unlabelled = (JobAttempt.status, null(), null())
        return select(*unlabelled, func.count(), *columns).where(*where).group_by(JobAttempt.status)
    by = (JobAttempt.status, JobAttempt.queue, JobAttempt.workflow_id)
    return select(*by, func.count(), *columns).where(*where).group_by(*by)


def _tallies(rows: Sequence[Sequence[Any]], session: Session) -> dict[str, tuple[int, float]]:
    """:func:`_tallying`'s rows as ``pruned_tallies`` rows: each workflow version by its
    workflow's name, read from ``workflows`` (the versions the rows name, a few)."""
    found = {row[2] for row in rows if row[2] is not None}
    names: dict[uuid.UUID, str] = {}
    if found:
        versions = select(WorkflowVersion.id, WorkflowVersion.name)
        named = session.execute(versions.where(WorkflowVersion.id.in_(found)))
        names = {version: name for version, name in named}

    def figures() -> Iterator[tuple[str, int, float]]:
        width = 2 + len(BOUNDS)  # a measured column's figures: count, sum, a count per bound
        for status, queue, version, tries, *row in rows:
            yield f"attempts:{status.value}", tries, 0.0
            workflow = names.get(version, "") if version is not None else ""
            values = {"queue": queue or "", "workflow": workflow}
            for i, name in enumerate(MEASURED):
                labels = [values[label] for label in LABELS[name]]
                count, total, *buckets = row[i * width : (i + 1) * width]
                yield tally_name(name, None, labels), count, total
                for bound, n in zip(BOUNDS, buckets, strict=True):
                    yield tally_name(name, bound, labels), n, 0.0

    return _added(figures())


def merged(*tallies: Tallies) -> dict[str, tuple[int, float]]:
    """Tallies added together: those of the tries in the tables and the pruned ones."""
    return _added((w, c, t) for each in tallies for w, (c, t) in each.items())


def _added(figures: Iterable[tuple[str, int, float]]) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for what, count, total in figures:
        before = out.get(what, (0, 0.0))
        out[what] = (before[0] + count, before[1] + total)
    return out


def counts_of(tallies: Tallies) -> dict[str, int]:
    """Tries by outcome."""
    return {
        what.removeprefix("attempts:"): count
        for what, (count, _) in tallies.items()
        if what.startswith("attempts:")
    }


def histograms_of(tallies: Tallies, column: str) -> Labelled:
    """For each value of ``column``'s labels (:data:`LABELS`), the cumulative count of its
    values at or under each of ``BOUNDS``, their sum and their count: the shape of a
    Prometheus histogram. (Tallied at these bounds: a change to ``BOUNDS`` needs a migration
    of the pruned tallies.)"""
    arity = len(LABELS[column])
    found: Labelled = {}
    for what, (count, total) in tallies.items():
        name, *labels = what.split("|")
        measured, _, bound = name.partition("<=")
        if measured != column or (bound and float(bound) not in BOUNDS):
            continue
        key = tuple([*labels, *[""] * arity][:arity])  # a row from before the labels: ""
        buckets, before_total, before_count = found.get(key) or ([0] * len(BOUNDS), 0.0, 0)
        if bound:
            buckets[BOUNDS.index(float(bound))] += count
            found[key] = (buckets, before_total, before_count)
        else:
            found[key] = (buckets, before_total + total, before_count + count)
    return found


def add_to_tallies(session: Session, adds: Mapping[str, tuple[int, float]]) -> None:
    """Add to the ``pruned_tallies`` rows: the last write of the retention sweep's
    transaction, so that two sweeps wait on each other's rows only for a commit, not for a
    delete. Every sweep writes the rows in one order: they never deadlock."""
    if not adds:
        return
    statement = upsert(session, PrunedTally).values(
        [{"what": w, "count": c, "total": t} for w, (c, t) in sorted(adds.items())]
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["what"],
            set_={
                "count": PrunedTally.count + statement.excluded.count,
                "total": PrunedTally.total + statement.excluded.total,
            },
        )
    )


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

    def attempt_tallies(self, *, labelled: bool = True) -> dict[str, tuple[int, float]]:
        """Every try in ``job_attempts``, added up as the pruned ones are (one scan): with
        :meth:`pruned_tallies`, the tries ever made (:func:`merged`). Not ``labelled``, the
        histograms' rows have empty labels, and the scan needs no join (the alerts and
        ``conveyor stats`` read only the histograms summed over their labels)."""
        return _tallies(self.session.execute(_tallying(labelled=labelled)).all(), self.session)

    def pruned_tallies(self) -> dict[str, tuple[int, float]]:
        """What the retention sweep deleted, added up (see :class:`PrunedTally`)."""
        return {t.what: (t.count, t.total) for t in self.session.scalars(select(PrunedTally))}

    def claim_alert_turn(
        self, now: datetime, interval: float
    ) -> tuple[dict[str, Any] | None, list[str]] | None:
        """This process's turn to evaluate the alerts, if the last evaluation (by anyone) is at
        least ``interval`` seconds old: the counters and firing rules it left."""
        self.session.execute(
            upsert(self.session, AlertState)
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
