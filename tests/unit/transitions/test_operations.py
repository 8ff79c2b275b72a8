"""What operators and the maintenance loop do to executions (conveyor.engine.cancellation, .due,
.dead_letters): cancel one, publish the jobs whose time came, repair dead letters."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import timedelta
from typing import Any

import pytest

from conveyor.engine import cancellation, dead_letters, due, workflows
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, Priority
from conveyor.exceptions import ExecutionNotFound, InvalidTransition, NonRetryableError, NotFound
from conveyor.ids import new_id
from tests.support.bench import Bench, node


def cancel(bench: Bench, execution_id: uuid.UUID) -> list[uuid.UUID]:
    return bench.units.run(
        lambda s: cancellation.cancel_execution(s, execution_id, bench.clock())
    ).forget


def test_a_cancel_stops_what_has_not_started_and_leaves_running_nodes_to_notice(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply(
        "three", node("a"), node("b"), node("c", "a"),
    ).name)  # fmt: skip
    bench.claim_node(made.execution_id, "a")

    cancelled = cancel(bench, made.execution_id)

    assert cancelled == [bench.job(made.execution_id, "b").id]
    assert bench.statuses(made.execution_id) == {"a": "running", "b": "cancelled", "c": "cancelled"}
    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.error, execution.finished_at) == (
        ExecutionStatus.CANCELLED, "cancelled by request", bench.clock(),
    )  # fmt: skip


def test_a_finished_execution_cannot_be_cancelled_and_is_left_as_it_was(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    before = bench.rows(made.execution_id)

    with pytest.raises(InvalidTransition) as raised:
        cancel(bench, made.execution_id)

    assert str(raised.value) == (
        f"execution {made.execution_id} is already completed; only pending or running "
        f"executions can be cancelled"
    )
    assert bench.rows(made.execution_id) == before


def test_an_unknown_execution_cannot_be_cancelled(bench: Bench) -> None:
    with pytest.raises(ExecutionNotFound):
        cancel(bench, new_id())


def test_promote_due_publishes_a_delay_once_its_time_comes(bench: Bench) -> None:
    made = bench.trigger(bench.apply(
        "later", node("wait", type="delay", config={"seconds": 30}), node("go", "wait"),
    ).name)  # fmt: skip

    assert bench.units.run(lambda s: due.promote_due(s, bench.clock())) == []
    bench.clock.advance(30)
    (published,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))

    job = bench.job(made.execution_id, "wait")
    assert (published.job_id, job.status, job.enqueued_at) == (
        job.id, JobStatus.QUEUED, bench.clock(),
    )  # fmt: skip
    assert published.hints is not None
    assert (published.hints.node_id, published.hints.enqueued_at) == ("wait", bench.clock())
    assert bench.units.run(lambda s: due.promote_due(s, bench.clock())) == []
    assert bench.claimed(published.job_id).node.id == "wait"


def test_a_low_job_queued_too_long_is_published_again_as_normal(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chore", node("a")).name, priority=Priority.LOW)

    assert bench.units.run(lambda s: due.age_queued(s, bench.clock(), 60)) == []
    bench.clock.advance(61)
    (published,) = bench.units.run(lambda s: due.age_queued(s, bench.clock(), 60))

    assert (published.job_id, published.priority) == (
        bench.job(made.execution_id, "a").id, Priority.NORMAL,
    )  # fmt: skip
    assert bench.job(made.execution_id, "a").priority is Priority.NORMAL


def test_promoted_and_aged_jobs_are_named_without_loading_their_workflows_definition(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a delay due and a low job queued too long, and a process whose cache of workflow
    # definitions is empty (a version pushed out of it by others)
    bench.apply("later", node("wait", type="delay", config={"seconds": 30}))
    bench.apply("chore", node("a"))
    bench.trigger("later")
    bench.trigger("chore", priority=Priority.LOW)
    bench.clock.advance(61)
    monkeypatch.setattr(workflows, "_cache", OrderedDict())

    # When their messages are made
    made = bench.units.run(
        lambda s: due.promote_due(s, bench.clock()) + due.age_queued(s, bench.clock(), 60)
    )

    # Then each is named for its workflow and node, the name returned with the job: no
    # definition was read, validated and planned (in the transaction holding their rows)
    assert [(d.workflow, d.node) for d in made] == [("later", "wait"), ("chore", "a")]
    assert [d.hints.workflow for d in made if d.hints] == ["later", "chore"]
    assert len(workflows._cache) == 0


# -- dead letters ------------------------------------------------------------------------------


def dead_letter(bench: Bench, *nodes: dict[str, Any]) -> tuple[uuid.UUID, uuid.UUID]:
    """An execution failed by its first node's dead letter: (execution id, dead job id)."""
    made = bench.trigger(bench.apply("dies", *nodes).name)
    bench.fail(bench.claim_node(made.execution_id, "a"), NonRetryableError("bad"))
    return made.execution_id, bench.job(made.execution_id, "a").id


def requeue(bench: Bench, job_id: uuid.UUID, tenant_id: uuid.UUID | None = None) -> list[Dispatch]:
    return bench.units.run(lambda s: dead_letters.requeue(s, job_id, tenant_id, bench.clock()))


def test_a_requeued_dead_letter_resumes_its_execution_which_completes(bench: Bench) -> None:
    execution_id, job_id = dead_letter(bench, node("a"), node("b", "a"))
    assert bench.statuses(execution_id) == {"a": "failed", "b": "cancelled"}
    bench.clock.advance(5)

    (published,) = requeue(bench, job_id)

    execution = bench.probe.execution(execution_id)
    assert (execution.status, execution.error, execution.remaining_nodes) == (
        ExecutionStatus.RUNNING, None, 2,
    )  # fmt: skip
    assert bench.statuses(execution_id) == {"a": "queued", "b": "pending"}
    assert bench.probe.nodes(execution_id)["b"].waiting_on == 1
    job = bench.job(execution_id, "a")
    assert (published.job_id, job.status, job.tries_before, job.retry_count) == (
        job_id, JobStatus.QUEUED, 1, 0,
    )  # fmt: skip
    a = bench.claimed(job_id)
    assert (a.attempt, a.job.try_number) == (1, 2)  # a fresh set of tries, numbered on
    (b,) = bench.succeed(a, {"n": 1})
    bench.succeed(bench.claimed(b.job_id), {"n": 2})
    assert bench.probe.execution(execution_id).status is ExecutionStatus.COMPLETED
    assert [t.attempt_number for t in bench.probe.attempts(job_id)] == [1, 2]


def test_a_discarded_dead_letter_is_archived_and_cannot_be_requeued(bench: Bench) -> None:
    execution_id, job_id = dead_letter(bench, node("a"))

    bench.units.run(lambda s: dead_letters.discard(s, job_id, None, bench.clock()))

    assert bench.job(execution_id, "a").status is JobStatus.DISCARDED
    assert bench.probe.execution(execution_id).status is ExecutionStatus.FAILED
    with pytest.raises(InvalidTransition, match="was discarded"):
        requeue(bench, job_id)


def test_requeue_refuses_when_another_dead_letter_of_the_execution_was_discarded(
    bench: Bench,
) -> None:
    # Given two nodes dead-lettered, the first one's failure tolerated
    made = bench.trigger(bench.apply(
        "two", node("a"), node("z", continue_on_failure=True),
    ).name)  # fmt: skip
    bench.fail(bench.claim_node(made.execution_id, "z"), NonRetryableError("meh"))
    bench.fail(bench.claim_node(made.execution_id, "a"), NonRetryableError("bad"))
    a, z = bench.job(made.execution_id, "a").id, bench.job(made.execution_id, "z").id

    with pytest.raises(InvalidTransition, match="continue_on_failure"):
        requeue(bench, z)
    bench.units.run(lambda s: dead_letters.discard(s, z, None, bench.clock()))
    with pytest.raises(InvalidTransition, match="another dead letter of its execution"):
        requeue(bench, a)


def test_a_dead_letter_is_repaired_only_by_its_own_tenant(bench: Bench) -> None:
    execution_id, job_id = dead_letter(bench, node("a"))
    other = bench.units.run(lambda s: s.create_tenant("other"))
    before = bench.rows(execution_id)

    with pytest.raises(NotFound):
        requeue(bench, job_id, other)
    with pytest.raises(NotFound):
        bench.units.run(lambda s: dead_letters.discard(s, job_id, other, bench.clock()))

    assert bench.rows(execution_id) == before
    assert requeue(bench, job_id, bench.probe.execution(execution_id).tenant_id)


def test_a_delay_stopped_by_the_failure_waits_again_for_its_time_when_requeued(
    bench: Bench,
) -> None:
    # Given a failure that cancelled a delay still waiting for its time (an hour)
    execution_id, job_id = dead_letter(
        bench, node("a"), node("wait", type="delay", config={"seconds": 3600})
    )
    assert bench.job(execution_id, "wait").status is JobStatus.CANCELLED

    published = requeue(bench, job_id)

    assert [d.job_id for d in published] == [job_id]  # the delay is not published
    wait = bench.job(execution_id, "wait")
    assert (wait.status, wait.next_run_at) == (
        JobStatus.SCHEDULED, bench.clock() + timedelta(seconds=3600),
    )  # fmt: skip
    assert bench.probe.nodes(execution_id)["wait"].status is NodeStatus.QUEUED
