"""What an operator watches: one snapshot, read from PostgreSQL, the broker and the limiter at
the moment it is asked for, shown as Prometheus metrics (``GET /metrics`` on the API) and by
``conveyor stats``. Being read from the source of truth, every process shows the same numbers,
and they survive restarts.

Metrics (all prefixed ``conveyor_``):

- ``queue_depth{queue,priority}``: messages waiting in the broker (not reserved ones): on
  Redis per priority (``high``, ``normal``, ``low``), on RabbitMQ one count per queue
  (``priority="all"``: one queue holds every priority);
- ``build_info{version,python}``: 1, the version of Conveyor and Python serving the metrics;
- ``jobs{kind,status}``, ``executions{status}`` (every status, 0 when none), ``dead_letters``
  and ``discarded``;
- ``attempts_total{status}``: tries ever, by outcome (those the retention sweep deleted
  included: ``pruned_tallies``): ``rate()`` of it is throughput, the ``failed`` share the
  error rate;
- ``job_wait_seconds{queue}`` and ``job_run_seconds{queue,workflow}``: histograms of how
  long tries waited in the queue (queued to started) and ran (started to finished); the
  workflow label (names tenants choose) is left out with CONVEYOR_METRICS_WORKFLOW_LABEL=false;
- ``permits_in_use``, ``permits_limit``, ``permits_waiting`` ``{scope,name}`` (with limits),
  named as ``conveyor limits`` names them: a tenant by its name, a workflow ``tenant/workflow``;
- ``schedules_late`` and ``schedule_lag_seconds``: due schedules not yet fired, and the
  oldest one's delay;
- ``waits{age_le}``: wait nodes waiting for their event, waiting for at most ``age_le``
  seconds (cumulative: 60, 3600, 86400, +Inf), and ``oldest_wait_seconds``;
- ``recovered_total{what}``: jobs of dead workers reclaimed, lost messages re-published, and
  the limiter's repairs (lapsed grants taken back, parked jobs it lost re-published).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from conveyor import brokers
from conveyor.engine.limits import KeyUsage
from conveyor.engine.ports import Limiter
from conveyor.engine.queues import QUEUE_FOR_KIND, jobs_held
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobKind, JobStatus
from conveyor.store import Database, stats
from conveyor.store.stats import BOUNDS as BOUNDS  # the histograms' buckets, re-exported

# The ages (seconds) the waits are counted under: a minute, an hour, a day.
WAIT_AGES = (60.0, 3600.0, 86400.0)


@dataclass(frozen=True, kw_only=True)
class Histogram:
    buckets: list[int]  # cumulative counts at or under each of BOUNDS
    total: float
    count: int

    def quantile(self, q: float) -> float | None:
        """The bound under which a share ``q`` of the values lie (None: no values, or past
        the last bound)."""
        if not self.count:
            return None
        wanted = q * self.count
        return next((b for b, n in zip(BOUNDS, self.buckets, strict=True) if n >= wanted), None)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    taken_at: datetime
    queue_depth: dict[tuple[str, str], int] | None  # None: neither Redis nor RabbitMQ
    jobs: dict[tuple[str, str], int]
    executions: dict[str, int]
    attempts: dict[str, int]
    wait: Histogram  # every try's
    run: Histogram
    # by label values: wait by (queue,), run by (queue, workflow); see stats.LABELS
    wait_by: dict[tuple[str, ...], Histogram] = field(default_factory=dict)
    run_by: dict[tuple[str, ...], Histogram] = field(default_factory=dict)
    permits: list[KeyUsage] = field(default_factory=list)
    schedules_late: int = 0
    schedule_lag: float = 0.0
    recovered: dict[str, int] = field(default_factory=dict)  # by the recovery sweep, ever
    tenant_names: dict[str, str] = field(default_factory=dict)  # id -> name, for the permits
    # waits (wait nodes waiting for their event) by age: at most each of WAIT_AGES, then all
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_AGES) + 1))
    oldest_wait: float = 0.0  # seconds the oldest wait has waited (0: none waits)

    @property
    def dead_letters(self) -> int:
        return self.jobs.get(("node", "dead_letter"), 0)

    @property
    def discarded(self) -> int:
        return self.jobs.get(("node", "discarded"), 0)

    def depth(self, queue: str | None = None) -> int:
        return sum(n for (q, _), n in (self.queue_depth or {}).items() if queue in (None, q))


def take(
    database: Database, broker_url: str, limiter: Limiter | None, *, labelled: bool = True
) -> Snapshot:
    """The snapshot now. Not ``labelled`` (the alerts, ``conveyor stats``), the histograms are
    only summed: ``wait_by`` and ``run_by`` stay empty, and the tries are grouped by status
    alone (fewer groups, no workflow names to read)."""
    now = datetime.now(UTC)
    with database.snapshot() as store:
        jobs, executions = store.job_counts(), store.execution_counts()
        tries = stats.merged(store.attempt_tallies(labelled=labelled), store.pruned_tallies())
        late, lag = store.schedule_lag(now)
        recovered = store.recovery_counts()
        waits, oldest_wait = store.wait_ages(now, WAIT_AGES)
        permits = limiter.snapshot() if limiter is not None else []
        names = {str(t.id): t.name for t in store.tenants()} if permits else {}
    return Snapshot(
        taken_at=now,
        queue_depth=queue_depth(broker_url),
        jobs=jobs,
        executions=executions,
        attempts=stats.counts_of(tries),
        wait=_summed((wait_by := _histograms(tries, "waited")).values()),
        run=_summed((run_by := _histograms(tries, "duration")).values()),
        wait_by=wait_by if labelled else {},
        run_by=run_by if labelled else {},
        permits=permits,
        schedules_late=late,
        schedule_lag=lag,
        recovered=recovered,
        tenant_names=names,
        waits=waits,
        oldest_wait=oldest_wait,
    )


def _histograms(tallies: stats.Tallies, column: str) -> dict[tuple[str, ...], Histogram]:
    return {
        labels: Histogram(buckets=buckets, total=total, count=count)
        for labels, (buckets, total, count) in stats.histograms_of(tallies, column).items()
    }


def _summed(histograms: Iterable[Histogram]) -> Histogram:
    """One histogram of every label's values (what `conveyor stats` and the alerts read)."""
    every = list(histograms)
    return Histogram(
        buckets=[sum(h.buckets[i] for h in every) for i in range(len(BOUNDS))],
        total=sum(h.total for h in every),
        count=sum(h.count for h in every),
    )


def _folded(
    histograms: Mapping[tuple[str, ...], Histogram], kept: list[int]
) -> dict[tuple[str, ...], Histogram]:
    """The histograms summed over every label but those at the ``kept`` positions."""
    groups: dict[tuple[str, ...], list[Histogram]] = {}
    for labels, hist in histograms.items():
        groups.setdefault(tuple(labels[i] for i in kept), []).append(hist)
    return {labels: _summed(every) for labels, every in groups.items()}


def queue_depth(broker_url: str) -> dict[tuple[str, str], int] | None:
    """Messages waiting per (queue, priority label) in a Redis or RabbitMQ broker (see
    :class:`conveyor.engine.ports.BrokerQueues`); None for other brokers."""
    queues = brokers.queues_of(broker_url)
    return None if queues is None else queues.depth()


def broker_holds(
    broker_url: str,
    jobs_per_message: Mapping[str, int] | None = None,
    repair: Sequence[Any] = (),
) -> dict[str, int] | None:
    """Jobs a Redis or RabbitMQ broker may hold waiting, per queue
    (:func:`conveyor.engine.queues.jobs_held`); None for other brokers. ``repair``: the
    Celery app's queues, declared again on RabbitMQ when missing (see :mod:`conveyor.brokers`).

    Reserved messages (kombu's ``unacked`` hash on Redis, a consumer's unacknowledged ones on
    RabbitMQ) are left out on purpose: those of a live worker are claimed within moments, so
    a job queued for long whose message is only reserved was reserved by a worker that died,
    and its message comes back only after the visibility timeout (Redis) or once the broker
    sees the connection gone (RabbitMQ): re-publishing it now is the repair (the duplicate is
    harmless)."""
    queues = brokers.queues_of(broker_url, repair)
    return None if queues is None else jobs_held(queues.depth(), jobs_per_message)


class SnapshotCollector(Collector):
    """Prometheus collector: one fresh snapshot per scrape (``workflow_label``: see
    :func:`metric_families`)."""

    def __init__(self, source: Callable[[], Snapshot], *, workflow_label: bool = True) -> None:
        self.source = source
        self.workflow_label = workflow_label

    def collect(self) -> Iterator[Metric]:
        yield from metric_families(self.source(), workflow_label=self.workflow_label)


# The kinds of job the jobs table holds (a webhook delivery has a table of its own), and the
# queues of their tries: no job of workflow-scheduled or workflow-webhook ever makes one.
_JOB_KINDS = (JobKind.EXECUTION, JobKind.NODE)
_TRIED_QUEUES = tuple(QUEUE_FOR_KIND[kind] for kind in _JOB_KINDS)


@cache
def build_info() -> dict[str, str]:
    """The version of Conveyor installed, and of the Python running it."""
    try:
        version = metadata.version("conveyor")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "unknown"
    return {"version": version, "python": platform.python_version()}


def metric_families(snap: Snapshot, *, workflow_label: bool = True) -> Iterator[Metric]:
    """The snapshot as Prometheus metrics; without ``workflow_label``
    (CONVEYOR_METRICS_WORKFLOW_LABEL=false), the run histogram by queue alone."""
    info = build_info()
    build = GaugeMetricFamily(
        "conveyor_build_info", "Always 1: the versions serving these metrics.", labels=list(info)
    )
    build.add_metric(list(info.values()), 1)
    yield build
    if snap.queue_depth is not None:
        depth = GaugeMetricFamily(
            "conveyor_queue_depth", "Messages waiting in the broker.", labels=["queue", "priority"]
        )
        for (queue, priority), n in sorted(snap.queue_depth.items()):
            depth.add_metric([queue, priority], n)
        yield depth
    # Every status is shown, 0 when no row has it, so that a series never vanishes (an alert
    # on a rate or an absence would misread the gap).
    jobs = GaugeMetricFamily("conveyor_jobs", "Jobs by kind and status.", labels=["kind", "status"])
    every = {(kind.value, status.value) for kind in _JOB_KINDS for status in JobStatus}
    for kind, status in sorted(every | snap.jobs.keys()):
        jobs.add_metric([kind, status], snap.jobs.get((kind, status), 0))
    yield jobs
    executions = GaugeMetricFamily(
        "conveyor_executions", "Executions by status.", labels=["status"]
    )
    for status in sorted({s.value for s in ExecutionStatus} | snap.executions.keys()):
        executions.add_metric([status], snap.executions.get(status, 0))
    yield executions
    yield GaugeMetricFamily("conveyor_dead_letters", "Dead-lettered node jobs.", snap.dead_letters)
    yield GaugeMetricFamily(
        "conveyor_discarded", "Discarded dead letters (archive).", snap.discarded
    )
    tries = CounterMetricFamily("conveyor_attempts", "Tries ever, by outcome.", labels=["status"])
    for status in sorted({s.value for s in AttemptStatus} | snap.attempts.keys()):
        tries.add_metric([status], snap.attempts.get(status, 0))
    yield tries
    # the wait of every queue whose jobs make tries is shown, empty when none is left or counted
    empty = Histogram(buckets=[0] * len(BOUNDS), total=0.0, count=0)
    waits: dict[tuple[str, ...], Histogram] = {(queue,): empty for queue in _TRIED_QUEUES}
    waits.update(snap.wait_by)
    run_labels = stats.LABELS["duration"]
    runs: Mapping[tuple[str, ...], Histogram] = snap.run_by
    if not workflow_label:
        run_labels = tuple(label for label in run_labels if label != "workflow")
        runs = _folded(snap.run_by, [i for i, n in enumerate(stats.LABELS["duration"])
                                     if n in run_labels])  # fmt: skip
    for name, doc, label_names, histograms in (
        ("conveyor_job_wait_seconds", "Queued to started, per try.", stats.LABELS["waited"], waits),
        ("conveyor_job_run_seconds", "Started to finished, per try.", run_labels, runs),
    ):
        family = HistogramMetricFamily(name, doc, labels=list(label_names))
        for labels, hist in sorted(histograms.items()):
            buckets = [(str(b), n) for b, n in zip(BOUNDS, hist.buckets, strict=True)]
            family.add_metric(list(labels), [*buckets, ("+Inf", hist.count)], hist.total)
        yield family
    if snap.permits:
        yield from _permit_families(snap.permits, snap.tenant_names)
    recovered = CounterMetricFamily(
        "conveyor_recovered", "Repairs by the recovery sweep, ever.", labels=["what"]
    )
    for what in sorted({"reclaimed", "republished", "lapsed_grants", "lost_parked",
                        "waits_settled", "children_stopped", *snap.recovered}):  # fmt: skip
        recovered.add_metric([what], snap.recovered.get(what, 0))
    yield recovered
    by_age = GaugeMetricFamily(
        "conveyor_waits", "Wait nodes waiting for their event, by age (at most).",
        labels=["age_le"],
    )  # fmt: skip
    for bound, n in zip([*(f"{b:g}" for b in WAIT_AGES), "+Inf"], snap.waits, strict=True):
        by_age.add_metric([bound], n)
    yield by_age
    yield GaugeMetricFamily(
        "conveyor_oldest_wait_seconds", "How long the oldest wait node has waited.",
        snap.oldest_wait,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "conveyor_schedules_late", "Due schedules not yet fired.", snap.schedules_late
    )
    yield GaugeMetricFamily(
        "conveyor_schedule_lag_seconds", "How late the oldest due schedule is.", snap.schedule_lag
    )


def _permit_families(permits: list[KeyUsage], tenant_names: Mapping[str, str]) -> Iterator[Metric]:
    labels = ["scope", "name"]
    in_use = GaugeMetricFamily("conveyor_permits_in_use", "Permits held.", labels=labels)
    limit = GaugeMetricFamily("conveyor_permits_limit", "The limit of the key.", labels=labels)
    waiting = GaugeMetricFamily("conveyor_permits_waiting", "Jobs parked.", labels=labels)
    for usage in permits:
        key = [usage.kind, usage.name(tenant_names)]
        in_use.add_metric(key, usage.in_use)
        limit.add_metric(key, usage.limit)
        waiting.add_metric(key, usage.waiting)
    yield from (in_use, limit, waiting)
