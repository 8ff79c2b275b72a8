"""Alert rules: each fires when its measure crosses the threshold and resolves when it falls
back, measuring rates between two evaluations. Pure: snapshots in, changes out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from conveyor.alerts.rules import Counters, Thresholds, evaluate
from conveyor.metrics import BOUNDS, Histogram, Snapshot

LIMITS = Thresholds(queue_depth=10, wait_p95=1.0, error_rate=0.5, min_tries=4,
                    dead_letter_growth=2, schedule_lag=60)  # fmt: skip


def hist(values: list[float]) -> Histogram:
    return Histogram(
        buckets=[sum(1 for v in values if v <= b) for b in BOUNDS],
        total=sum(values),
        count=len(values),
    )


def snap(**fields: Any) -> Snapshot:
    base: dict[str, Any] = {
        "taken_at": datetime.now(UTC),
        "queue_depth": {("workflow-node", "normal"): 0},
        "jobs": {},
        "executions": {},
        "attempts": {},
        "wait": hist([]),
        "run": hist([]),
    }
    return Snapshot(**{**base, **fields})


def names(changes: list[Any]) -> list[tuple[str, bool]]:
    return [(c.rule, c.firing) for c in changes]


def test_queue_depth_fires_above_its_threshold_and_resolves_below() -> None:
    deep = snap(queue_depth={("workflow-node", "low"): 11})

    fired, firing = evaluate(deep, None, set(), LIMITS)
    again, still = evaluate(deep, None, firing, LIMITS)
    resolved, after = evaluate(snap(), None, still, LIMITS)

    assert names(fired) == [("queue_depth", True)] and "11 messages" in fired[0].message
    assert again == [] and still == {"queue_depth"}  # announced once, not at every evaluation
    assert names(resolved) == [("queue_depth", False)] and after == set()


def test_rates_are_measured_since_the_last_evaluation_not_since_the_beginning() -> None:
    # 100 old tries, 10 failed (10 %); then 6 new ones, 4 failed (67 %)
    before = Counters.of(snap(attempts={"succeeded": 90, "failed": 10}))
    now = snap(attempts={"succeeded": 92, "failed": 14})

    changes, _ = evaluate(now, before, set(), LIMITS)

    assert names(changes) == [("error_rate", True)]
    assert "4 of 6 recent tries failed" in changes[0].message


def test_too_few_recent_tries_never_fire_the_error_rate() -> None:
    before = Counters.of(snap(attempts={"failed": 0}))

    changes, _ = evaluate(snap(attempts={"failed": 3}), before, set(), LIMITS)

    assert changes == []


def test_recent_waits_fire_on_their_95th_percentile() -> None:
    before = Counters.of(snap(wait=hist([0.01] * 50)))
    slow = snap(wait=hist([0.01] * 50 + [5.0] * 10))

    changes, _ = evaluate(slow, before, set(), LIMITS)

    assert names(changes) == [("wait_p95", True)] and "up to 5 s" in changes[0].message


def test_dead_letters_fire_on_growth_and_resolve_when_it_stops() -> None:
    first = Counters.of(snap(jobs={("node", "dead_letter"): 3}))
    grown = snap(jobs={("node", "dead_letter"): 5})

    fired, firing = evaluate(grown, first, set(), LIMITS)
    calm, after = evaluate(grown, Counters.of(grown), firing, LIMITS)

    assert names(fired) == [("dead_letter_growth", True)]
    assert names(calm) == [("dead_letter_growth", False)] and after == set()


def test_a_late_schedule_fires_and_says_what_to_check() -> None:
    changes, _ = evaluate(snap(schedules_late=2, schedule_lag=120.0), None, set(), LIMITS)

    assert names(changes) == [("schedule_lag", True)]
    assert "celery beat" in changes[0].message


def test_a_wait_older_than_its_threshold_fires_and_resolves_once_woken() -> None:
    limits = Thresholds(wait_age=3600)
    old = snap(waits=[0, 1, 2, 3], oldest_wait=7200.0)

    fired, firing = evaluate(old, None, set(), limits)
    resolved, _ = evaluate(snap(waits=[0, 1, 2, 2], oldest_wait=1800.0), None, firing, limits)

    assert names(fired) == [("wait_age", True)]
    assert "3 wait node(s)" in fired[0].message and "--status waiting" in fired[0].message
    assert names(resolved) == [("wait_age", False)]


def test_without_a_redis_broker_queue_depth_keeps_its_state() -> None:
    changes, firing = evaluate(snap(queue_depth=None), None, {"queue_depth"}, LIMITS)

    assert changes == [] and firing == {"queue_depth"}


def test_counters_written_by_another_version_start_afresh() -> None:
    assert Counters.from_json({"unknown": 1}) is None
    assert Counters.from_json(None) is None
