"""Trigger and plan (conveyor.engine.triggering): a small execution planned by its trigger, a
large one by its start job; keys that make a trigger answer with an earlier execution."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from conveyor.engine import cancellation, triggering
from conveyor.engine.queues import EXECUTION_QUEUE
from conveyor.engine.records import Dispatch
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
)
from conveyor.exceptions import IdempotencyConflict, WorkflowNotFound
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"))
# One node more than a trigger plans itself: 100 roots, and a sink after the first
LARGE = (*(node(f"r{i}") for i in range(triggering.INLINE_PLAN_NODES)), node("sink", "r0"))


def start(bench: Bench, job_id: uuid.UUID) -> list[Dispatch]:
    return bench.units.run(
        lambda s: triggering.start_execution(s, job_id, bench.clock(), "planner")
    ).dispatches


def test_a_small_workflow_is_planned_by_its_trigger_with_its_roots_queued(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)

    made = bench.trigger("chain", {"x": 1})

    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.remaining_nodes, execution.input) == (
        ExecutionStatus.RUNNING, 2, {"x": 1},
    )  # fmt: skip
    assert bench.statuses(made.execution_id) == {"a": "queued", "b": "pending"}
    (job,) = bench.probe.jobs(made.execution_id)
    assert (job.node_id, job.status, job.priority) == ("a", JobStatus.QUEUED, Priority.HIGH)
    (dispatch,) = made.dispatches
    assert (dispatch.job_id, dispatch.kind, dispatch.priority) == (
        job.id, JobKind.NODE, Priority.HIGH,
    )  # fmt: skip
    assert dispatch.hints is not None and dispatch.hints.node_id == "a"
    assert not made.replayed


def test_a_large_workflow_gets_a_start_job_whose_worker_plans_it(bench: Bench) -> None:
    bench.apply("large", *LARGE)

    made = bench.trigger("large")

    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.PENDING
    assert bench.probe.nodes(made.execution_id) == {}
    (start_job,) = bench.probe.jobs(made.execution_id)
    assert (start_job.kind, start_job.queue, start_job.status) == (
        JobKind.EXECUTION, EXECUTION_QUEUE, JobStatus.QUEUED,
    )  # fmt: skip
    assert [(d.job_id, d.kind) for d in made.dispatches] == [(start_job.id, JobKind.EXECUTION)]

    # When an execution worker takes the start job
    dispatches = start(bench, start_job.id)

    # Then every root is queued with a job, and the sink waits
    assert len(dispatches) == triggering.INLINE_PLAN_NODES
    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.remaining_nodes) == (ExecutionStatus.RUNNING, 101)
    nodes = bench.probe.nodes(made.execution_id)
    assert {n.status for i, n in nodes.items() if i != "sink"} == {NodeStatus.QUEUED}
    assert (nodes["sink"].status, nodes["sink"].waiting_on) == (NodeStatus.PENDING, 1)
    assert bench.job(made.execution_id, None).status is JobStatus.COMPLETED
    (attempt,) = bench.probe.attempts(start_job.id)
    assert (attempt.status, attempt.worker) == (AttemptStatus.SUCCEEDED, "planner")


def test_a_start_job_delivered_twice_plans_once(bench: Bench) -> None:
    bench.apply("large", *LARGE)
    made = bench.trigger("large")
    start(bench, made.dispatches[0].job_id)
    counts = bench.probe.counts()

    assert start(bench, made.dispatches[0].job_id) == []
    assert bench.probe.counts() == counts


def test_the_start_job_of_an_execution_that_finished_first_is_cancelled(bench: Bench) -> None:
    bench.apply("large", *LARGE)
    made = bench.trigger("large")
    bench.units.run(lambda s: s.finish_execution(
        made.execution_id, ExecutionStatus.FAILED, bench.clock(), error="stopped"))  # fmt: skip

    assert start(bench, made.dispatches[0].job_id) == []

    assert bench.probe.nodes(made.execution_id) == {}
    job = bench.job(made.execution_id, None)
    assert job.status is JobStatus.CANCELLED
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.FAILED, "execution is failed")


def test_a_cancelled_large_execution_cancels_its_start_job_before_it_runs(bench: Bench) -> None:
    bench.apply("large", *LARGE)
    made = bench.trigger("large")

    assert bench.units.run(
        lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock())
    ).forget == []  # fmt: skip

    assert bench.job(made.execution_id, None).status is JobStatus.CANCELLED
    assert start(bench, made.dispatches[0].job_id) == []


def test_an_idempotency_key_used_again_replays_the_execution_it_made(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)
    first = bench.trigger("chain", idempotency_key="order-7")
    counts = bench.probe.counts()

    again = bench.trigger("chain", idempotency_key="order-7")

    assert (again.execution_id, again.replayed, again.dispatches) == (first.execution_id, True, [])
    assert bench.probe.counts() == counts


def test_an_idempotency_key_used_for_another_workflow_is_a_conflict(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)
    bench.apply("other", node("x"))
    first = bench.trigger("chain", idempotency_key="order-7")

    with pytest.raises(IdempotencyConflict) as raised:
        bench.trigger("other", idempotency_key="order-7")

    assert str(raised.value) == (
        f"key 'order-7' already started workflow 'chain' (execution {first.execution_id}); "
        f"use another key for 'other'"
    )


def test_a_dedupe_key_answers_with_the_active_execution_until_it_finishes(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)
    first = bench.trigger("chain", dedupe_key="nightly")

    assert bench.trigger("chain", dedupe_key="nightly").execution_id == first.execution_id
    bench.units.run(lambda s: cancellation.cancel_execution(s, first.execution_id, bench.clock()))
    later = bench.trigger("chain", dedupe_key="nightly")

    assert later.execution_id != first.execution_id and not later.replayed
    assert bench.probe.execution(later.execution_id).status is ExecutionStatus.RUNNING


def test_a_version_applied_after_this_process_saw_one_is_the_one_triggered(
    bench: Bench,
) -> None:
    # Given a trigger that made the engine remember version 1 as the latest
    first = bench.trigger(bench.apply("chain", *CHAIN).name)
    # When version 2 is applied (as another process would) and the workflow triggered
    second = bench.apply("chain", *CHAIN, node("c", "b"))
    made = bench.trigger("chain")

    # Then the insert of version 1's plan was refused as stale, and version 2 planned
    assert bench.probe.execution(first.execution_id).workflow_id != second.id
    assert bench.probe.execution(made.execution_id).workflow_id == second.id
    assert set(bench.probe.nodes(made.execution_id)) == {"a", "b", "c"}


def test_a_trigger_of_a_workflow_never_applied_is_refused_and_stores_nothing(
    bench: Bench,
) -> None:
    bench.apply("chain", *CHAIN)
    counts = bench.probe.counts()

    with pytest.raises(WorkflowNotFound):
        bench.trigger("nothing")

    assert bench.probe.counts() == counts


def test_a_delay_root_is_held_until_its_time_and_not_published(bench: Bench) -> None:
    bench.apply("later", node("wait", type="delay", config={"seconds": 30}), node("go", "wait"))

    made = bench.trigger("later")

    assert made.dispatches == []
    job = bench.job(made.execution_id, "wait")
    assert (job.status, job.next_run_at) == (
        JobStatus.SCHEDULED, bench.clock() + timedelta(seconds=30),
    )  # fmt: skip
