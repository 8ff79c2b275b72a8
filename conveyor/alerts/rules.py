"""The alert rules (:func:`evaluate`), pure: two snapshots in, the changes out.

Rates and recent latency are measured between the last evaluation and this one, not since the
beginning. Evaluation runs in every worker's duty thread, but one worker at a time wins each
interval (a guarded update of the single ``alert_state`` row), so a change is announced once
(:mod:`conveyor.alerts.duty`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.metrics import BOUNDS, Histogram, Snapshot


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    queue_depth: int = 1000  # messages waiting in the broker, all queues
    wait_p95: float = 60.0  # seconds tries waited in the queue (95th percentile, recent)
    error_rate: float = 0.25  # failed share of recent tries (with at least `min_tries`)
    min_tries: int = 20
    dead_letter_growth: int = 1  # new dead letters since the last evaluation
    schedule_lag: float = 300.0  # seconds the oldest due schedule is late
    wait_age: float = 86_400.0  # seconds the oldest wait node has waited for its event


@dataclass(frozen=True, kw_only=True)
class Counters:
    """What the next evaluation compares with: totals at this one."""

    tries: int
    failed: int
    dead_letters: int
    wait_buckets: list[int]
    wait_count: int

    @classmethod
    def of(cls, snap: Snapshot) -> Counters:
        return cls(
            tries=sum(snap.attempts.values()),
            failed=snap.attempts.get("failed", 0),
            dead_letters=snap.dead_letters,
            wait_buckets=list(snap.wait.buckets),
            wait_count=snap.wait.count,
        )

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Counters | None:
        try:
            return cls(**data) if data else None
        except TypeError:  # written by another version: start afresh
            return None


@dataclass(frozen=True, kw_only=True)
class Change:
    rule: str
    firing: bool  # True: it fired now; False: it resolved now
    value: float
    threshold: float
    message: str

    def as_json(self) -> dict[str, Any]:
        return {
            "alert": self.rule,
            "status": "firing" if self.firing else "resolved",
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
        }


Reading = tuple[float | None, float, str]  # value (None: not measurable yet), threshold, words
Measure = Callable[[Snapshot, Counters | None, Thresholds], Reading]


def _queue_depth(snap: Snapshot, _: Counters | None, t: Thresholds) -> Reading:
    depth = snap.depth() if snap.queue_depth is not None else None
    return depth, t.queue_depth, f"{depth} messages wait in the broker (threshold {t.queue_depth})"


def _wait_p95(snap: Snapshot, before: Counters | None, t: Thresholds) -> Reading:
    if before is None:
        return None, t.wait_p95, ""
    recent = Histogram(
        buckets=[n - m for n, m in zip(snap.wait.buckets, before.wait_buckets, strict=True)],
        total=0.0,
        count=snap.wait.count - before.wait_count,
    )
    if recent.count <= 0:
        return 0.0, t.wait_p95, "no try started"
    p95 = recent.quantile(0.95)
    value = p95 if p95 is not None else BOUNDS[-1] * 2  # beyond the last bound
    return value, t.wait_p95, f"95 % of {recent.count} recent tries waited up to {value:g} s"


def _error_rate(snap: Snapshot, before: Counters | None, t: Thresholds) -> Reading:
    if before is None:
        return None, t.error_rate, ""
    tries = sum(snap.attempts.values()) - before.tries
    failed = snap.attempts.get("failed", 0) - before.failed
    if tries < t.min_tries:
        return 0.0, t.error_rate, f"only {tries} recent tries"
    rate = failed / tries
    return rate, t.error_rate, f"{failed} of {tries} recent tries failed ({rate:.0%})"


def _dead_letter_growth(snap: Snapshot, before: Counters | None, t: Thresholds) -> Reading:
    if before is None:
        return None, t.dead_letter_growth, ""
    grown = snap.dead_letters - before.dead_letters
    return (
        grown,
        t.dead_letter_growth - 0.5,  # fires at `dead_letter_growth` new ones or more
        f"{grown} new dead letter(s), {snap.dead_letters} in all (`conveyor dlq list`)",
    )


def _schedule_lag(snap: Snapshot, _: Counters | None, t: Thresholds) -> Reading:
    return (
        snap.schedule_lag,
        t.schedule_lag,
        f"{snap.schedules_late} schedule(s) late, the oldest by {snap.schedule_lag:.0f} s "
        "(is `celery beat` running, and a worker on workflow-scheduled?)",
    )


def _wait_age(snap: Snapshot, _: Counters | None, t: Thresholds) -> Reading:
    return (
        snap.oldest_wait,
        t.wait_age,
        f"{snap.waits[-1]} wait node(s) wait for their event, the oldest for "
        f"{snap.oldest_wait:.0f} s (`conveyor executions list --status waiting`)",
    )


RULES: dict[str, Measure] = {
    "queue_depth": _queue_depth,
    "wait_p95": _wait_p95,
    "error_rate": _error_rate,
    "dead_letter_growth": _dead_letter_growth,
    "schedule_lag": _schedule_lag,
    "wait_age": _wait_age,
}


def evaluate(
    snap: Snapshot, before: Counters | None, firing: set[str], thresholds: Thresholds
) -> tuple[list[Change], set[str]]:
    """The rules that fired or resolved now, and the set firing after this evaluation. A rule
    that cannot be measured yet (no earlier evaluation, no Redis broker) keeps its state."""
    changes, now_firing = [], set(firing)
    for name, measure in RULES.items():
        value, threshold, message = measure(snap, before, thresholds)
        if value is None:
            continue
        over = value > threshold
        if over and name not in firing:
            now_firing.add(name)
            changes.append(Change(rule=name, firing=True, value=value, threshold=threshold,
                                  message=message))  # fmt: skip
        elif not over and name in firing:
            now_firing.discard(name)
            changes.append(Change(rule=name, firing=False, value=value, threshold=threshold,
                                  message=message))  # fmt: skip
    return changes, now_firing
