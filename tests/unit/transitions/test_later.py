"""Delays at the edges (conveyor.engine.later): a trigger that starts later waits, pending,
its start job held in the database until promoted; a dead letter requeued for later."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.engine import cancellation, dead_letters, due, later, subscriptions, triggering
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus, JobKind, JobStatus, NodeStatus
from conveyor.exceptions import NonRetryableError, StartTimeError
from tests.support.bench import Bench, node


def promote(bench: Bench) -> list[Dispatch]:
    return bench.units.run(lambda s: due.promote_due(s, bench.clock()))


def test_a_trigger_with_run_at_waits_pending_until_its_start_job_is_promoted(
    bench: Bench,
) -> None:
    bench.apply("chain", node("a"), node("b", "a"))
    run_at = bench.clock() + timedelta(seconds=30)

    made = bench.trigger("chain", {"x": 1}, run_at=run_at)

    # stored at once, pending, its start time shown; nothing published, nothing planned
    assert made.dispatches == []
    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.scheduled_for) == (ExecutionStatus.PENDING, run_at)
    assert bench.statuses(made.execution_id) == {}
    start = bench.job(made.execution_id, None)
    assert (start.kind, start.status, start.next_run_at) == (
        JobKind.EXECUTION, JobStatus.SCHEDULED, run_at,
    )  # fmt: skip
    bench.clock.advance(29)
    assert promote(bench) == []

    bench.clock.advance(1)
    (published,) = promote(bench)

    assert (published.job_id, published.kind, published.workflow) == (
        start.id, JobKind.EXECUTION, "chain",
    )  # fmt: skip
    planned = bench.units.run(
        lambda s: triggering.start_execution(s, start.id, bench.clock(), "planner")
    )
    assert [d.node for d in planned.dispatches] == ["a"]
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING
    assert bench.statuses(made.execution_id) == {"a": "queued", "b": "pending"}


def test_a_trigger_for_later_cancelled_before_its_time_never_starts(bench: Bench) -> None:
    bench.apply("chain", node("a"))
    made = bench.trigger("chain", run_at=bench.clock() + timedelta(seconds=30))

    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))
    bench.clock.advance(60)

    assert promote(bench) == []
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.CANCELLED
    assert bench.job(made.execution_id, None).status is JobStatus.CANCELLED


def test_a_trigger_without_run_at_is_planned_at_once(bench: Bench) -> None:
    bench.apply("chain", node("a"))

    made = bench.trigger("chain", run_at=None)

    assert [d.node for d in made.dispatches] == ["a"]
    assert bench.probe.execution(made.execution_id).scheduled_for is None


def test_an_event_for_later_starts_its_workflows_pending_until_then(bench: Bench) -> None:
    bench.apply("on_signup", node("welcome"), events=["user.signup"])
    run_at = bench.clock() + timedelta(seconds=10)

    (started,) = bench.units.run(lambda s: subscriptions.emit_event(
        s, "default", "user.signup", {"id": 7}, bench.clock(), run_at=run_at))  # fmt: skip

    assert started.dispatches == []
    execution = bench.probe.execution(started.execution_id)
    assert (execution.status, execution.scheduled_for) == (ExecutionStatus.PENDING, run_at)
    assert promote(bench) == []
    bench.clock.advance(10)
    assert [d.job_id for d in promote(bench)] == [bench.job(started.execution_id, None).id]


def test_a_dead_letter_requeued_for_later_waits_until_then(bench: Bench) -> None:
    made = bench.trigger(bench.apply("dies", node("a"), node("b", "a")).name)
    bench.fail(bench.claim_node(made.execution_id, "a"), NonRetryableError("bad"))
    job_id = bench.job(made.execution_id, "a").id
    run_at = bench.clock() + timedelta(seconds=30)

    published = bench.units.run(
        lambda s: dead_letters.requeue(s, job_id, None, bench.clock(), run_at)
    )

    assert published == []
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.next_run_at, job.tries_before) == (JobStatus.SCHEDULED, run_at, 1)
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING
    assert bench.probe.nodes(made.execution_id)["a"].status is NodeStatus.QUEUED
    assert promote(bench) == []
    bench.clock.advance(30)
    (due_now,) = promote(bench)
    assert due_now.job_id == job_id
    (b,) = bench.succeed(bench.claimed(job_id), {"n": 1})
    bench.succeed(bench.claimed(b.job_id), {"n": 2})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED


# -- the start time checked --------------------------------------------------------------------


def _now() -> datetime:
    return datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_a_start_time_is_run_at_or_now_plus_delay_and_none_for_now() -> None:
    now = _now()
    assert later.start_time(now) is None
    assert later.start_time(now, delay=0) is None
    assert later.start_time(now, delay=2.5) == now + timedelta(seconds=2.5)
    assert later.start_time(now, run_at=now + timedelta(hours=1)) == now + timedelta(hours=1)
    # a moment ago (clocks differ): now
    assert later.start_time(now, run_at=now - timedelta(seconds=5)) is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"run_at": datetime(2030, 1, 1, 13, 0)}, "has no UTC offset"),
        ({"run_at": _now() - timedelta(hours=1)}, "is in the past"),
        ({"run_at": _now() + timedelta(days=400)}, "beyond the bound"),
        ({"delay": -1.0}, "0 or more"),
        ({"delay": float("nan")}, "0 or more"),
        ({"delay": 400 * 86_400.0}, "beyond the bound"),
        ({"delay": 1.0, "run_at": _now()}, "not both"),
    ],
)
def test_a_bad_start_time_is_refused_naming_the_problem(
    fields: dict[str, object], says: str
) -> None:
    with pytest.raises(StartTimeError, match=says):
        later.start_time(_now(), **fields)  # type: ignore[arg-type]
