"""Executions end to end: real PostgreSQL, Redis broker and an in-process Celery worker."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import before_task_publish
from sqlalchemy import select

from conveyor import wiring
from conveyor.engine import triggering
from conveyor.engine.records import Dispatch
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobStatus,
    NodeStatus,
)
from conveyor.engine.validation import parse_workflow
from conveyor.models import Job, JobAttempt
from conveyor.service import Conveyor
from tests.support import nodes as test_nodes
from tests.support.services import effects, wait_for


def py(node_id: str, function: str, needs: list[str] | None = None, **inputs: Any) -> dict:
    return {
        "id": node_id,
        "type": "python",
        "config": {"function": f"test.{function}"},
        "needs": needs or [],
        "inputs": inputs,
    }


def apply(service: Conveyor, name: str, nodes: list[dict], **extra: Any) -> None:
    service.apply(parse_workflow({"name": name, "nodes": nodes, **extra}))


def jobs_and_attempts(service: Conveyor, execution_id: uuid.UUID) -> dict[str, Any]:
    with service.db.transaction() as store:
        pairs = store.execution_jobs(execution_id)
        return {(job.node_id or "<execution>"): (job, attempts) for job, attempts in pairs}


DIAMOND = [
    py("start", "add", a="{{ input.x }}", b=1),
    py("left", "sleep_add", ["start"], a="{{ nodes.start.sum }}", b=10, seconds=0.3),
    py("middle", "sleep_add", ["start"], a="{{ nodes.start.sum }}", b=20, seconds=0.3),
    py("right", "sleep_add", ["start"], a="{{ nodes.start.sum }}", b=30, seconds=0.3),
    py(
        "join",
        "add",
        ["left", "middle", "right"],
        a="{{ nodes.left.sum + nodes.middle.sum }}",
        b="{{ nodes.right.sum }}",
    ),
]


def test_diamond_completes_with_right_outputs_and_job_rows(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "diamond", DIAMOND)

    execution_id = conveyor_service.trigger("diamond", {"x": 4})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED, row.error
    # start = 5; left 15, middle 25, right 35; join = 15 + 25 + 35
    assert row.output == {"join": {"sum": 75}}
    jobs = jobs_and_attempts(conveyor_service, execution_id)
    assert set(jobs) == {"start", "left", "middle", "right", "join"}  # planned by the trigger
    for job, attempts in jobs.values():
        assert job.status is JobStatus.COMPLETED
        assert job.completed_at is not None and job.processed_at is not None
        assert [(a.attempt_number, a.status) for a in attempts] == [(1, AttemptStatus.SUCCEEDED)]
        assert attempts[0].duration is not None and attempts[0].duration >= 0
    with conveyor_service.db.transaction() as store:
        states = {n.node_id: n for n in store.execution_nodes(execution_id)}
    assert all(s.status is NodeStatus.COMPLETED for s in states.values())
    assert states["left"].output == {"sum": 15}


def test_a_workflow_too_large_to_plan_at_trigger_is_planned_by_an_execution_worker(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a limit under the diamond's five nodes
    monkeypatch.setattr(triggering, "INLINE_PLAN_NODES", 4)
    apply(conveyor_service, "diamond", DIAMOND)

    execution_id = conveyor_service.trigger("diamond", {"x": 4})
    row = wait_for(conveyor_service, execution_id)

    # Then a start job planned it, and it ran as a small one does
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"join": {"sum": 75}}
    jobs = jobs_and_attempts(conveyor_service, execution_id)
    assert set(jobs) == {"<execution>", "start", "left", "middle", "right", "join"}
    assert all(job.status is JobStatus.COMPLETED for job, _ in jobs.values())


def test_diamond_branches_run_in_parallel(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "diamond", DIAMOND)

    execution_id = conveyor_service.trigger("diamond", {"x": 1})
    wait_for(conveyor_service, execution_id)

    with conveyor_service.db.transaction() as store:
        states = {n.node_id: n for n in store.execution_nodes(execution_id)}
    branches = [states[n] for n in ("left", "middle", "right")]
    # Each branch sleeps 0.3 s; they overlap when the latest start precedes the earliest end.
    latest_start = max(s.started_at for s in branches if s.started_at)
    earliest_end = min(s.finished_at for s in branches if s.finished_at)
    assert latest_start < earliest_end


def test_flaky_node_retries_with_growing_delays_then_succeeds(
    conveyor_service: Conveyor,
) -> None:
    retry = {"max_attempts": 4, "backoff": 0.3, "factor": 2, "jitter": 0}
    apply(conveyor_service, "flaky", [py("shaky", "flaky", failures=2) | {"retry": retry}])

    execution_id = conveyor_service.trigger("flaky", {})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"shaky": {"succeeded_on": 3}}
    job, attempts = jobs_and_attempts(conveyor_service, execution_id)["shaky"]
    assert job.status is JobStatus.COMPLETED and job.retry_count == 2
    assert [a.status for a in attempts] == [
        AttemptStatus.FAILED,
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]
    assert "flaky failure on attempt 1" in (attempts[0].error or "")
    waits = [
        (attempts[i + 1].started_at - attempts[i].finished_at).total_seconds()
        for i in range(2)
        if attempts[i].finished_at
    ]
    assert waits[0] >= 0.3 and waits[1] >= 0.6


def test_exhausted_retries_dead_letter_the_job_and_fail_the_execution(
    conveyor_service: Conveyor,
) -> None:
    retry = {"max_attempts": 3, "backoff": 0.05, "jitter": 0}
    apply(
        conveyor_service,
        "doomed",
        [
            py("broken", "fail", message="disk on fire") | {"retry": retry},
            py("after", "add", ["broken"], a=1, b=2),
        ],
    )

    execution_id = conveyor_service.trigger("doomed", {})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.FAILED
    assert "broken" in (row.error or "") and "disk on fire" in (row.error or "")
    jobs = jobs_and_attempts(conveyor_service, execution_id)
    job, attempts = jobs["broken"]
    assert job.status is JobStatus.DEAD_LETTER and "disk on fire" in (job.last_error or "")
    assert len(attempts) == 3 and all(a.status is AttemptStatus.FAILED for a in attempts)
    assert "after" not in jobs  # never enqueued
    with conveyor_service.db.transaction() as store:
        states = {n.node_id: n.status for n in store.execution_nodes(execution_id)}
    assert states == {"broken": NodeStatus.FAILED, "after": NodeStatus.CANCELLED}


def test_non_retryable_error_dead_letters_after_one_attempt(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "permanent", [py("once", "fail_permanently")])

    row = wait_for(conveyor_service, conveyor_service.trigger("permanent", {}))

    assert row.status is ExecutionStatus.FAILED
    tries = [e for e in effects(conveyor_service.db.url) if e["node_id"] == "once"]
    assert len(tries) == 1


def test_continue_on_failure_lets_successors_run(conveyor_service: Conveyor) -> None:
    retry = {"max_attempts": 1}
    apply(
        conveyor_service,
        "tolerant",
        [
            py("optional", "fail", message="meh") | {"retry": retry, "continue_on_failure": True},
            py("after", "add", ["optional"], a=1, b=2),
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("tolerant", {}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"after": {"sum": 3}}


def test_duplicated_message_does_not_run_a_node_twice(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "single", [py("only", "sleep_add", a=1, b=1, seconds=0.3)])
    execution_id = conveyor_service.trigger("single", {})
    # Find the node job as soon as it exists, then publish its message again (twice).
    found: list[Job] = []
    for _ in range(200):
        with conveyor_service.db.transaction() as store:
            query = select(Job).where(Job.execution_id == execution_id, Job.node_id == "only")
            found = list(store.session.scalars(query))
        if found:
            break
        threading.Event().wait(0.02)
    (job,) = found
    duplicate = Dispatch(job_id=job.id, kind=job.kind, queue=job.queue, priority=job.priority)
    conveyor_service.dispatcher.publish([duplicate, duplicate])

    row = wait_for(conveyor_service, execution_id)
    threading.Event().wait(0.5)  # let the duplicates be consumed and dropped

    assert row.status is ExecutionStatus.COMPLETED
    runs = [e for e in effects(conveyor_service.db.url) if e["node_id"] == "only"]
    assert len(runs) == 1
    with conveyor_service.db.transaction() as store:
        attempts = list(
            store.session.scalars(select(JobAttempt).where(JobAttempt.job_id == job.id))
        )
    assert len(attempts) == 1


@pytest.fixture(params=[8, 1], ids=["batched", "alone"])
def batch_most(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The service's dispatcher packs sibling jobs into messages of up to this many (8, the
    default: the three parents travel in one message, and the worker that takes it hands two
    back when the first blocks; 1: each alone); every packed message's job count is recorded
    in ``packed_messages``."""
    import conveyor.tasks
    from conveyor.tasks.dispatch import RUN_MANY, CeleryDispatcher

    made = CeleryDispatcher(conveyor.tasks.app)
    made.batch_most = request.param
    monkeypatch.setattr(wiring.dispatcher(), "_made", made)
    packed_messages.clear()

    def count(sender: str | None = None, body: Any = None, **_: Any) -> None:
        if sender == RUN_MANY:
            packed_messages.append(len(body[0][0]))

    before_task_publish.connect(count, weak=False)
    yield request.param
    before_task_publish.disconnect(count)


packed_messages: list[int] = []


def test_two_predecessors_completing_together_start_their_join_once(
    conveyor_service: Conveyor, batch_most: int
) -> None:
    # Given three parallel parents that leave a barrier together, so their completion
    # transactions race for the join (with batching on, made ready together by the root they
    # travel in one message: the worker that takes it runs the first and hands the other two
    # back, for other workers, when it blocks at the barrier)
    parents = [
        py(f"p{i}", "barrier", ["root"], name="{{ input.barrier }}", value=i) for i in (1, 2, 3)
    ]
    join = py(
        "join",
        "add",
        ["p1", "p2", "p3"],
        a="{{ nodes.p1.value + nodes.p2.value }}",
        b="{{ nodes.p3.value }}",
    )
    apply(conveyor_service, "race", [py("root", "add", a=0, b=0), *parents, join])

    # When several executions run, one after the other (run together, their parents could
    # fill every worker thread with barriers that never fill: a deadlock of the test's own)
    started = []
    for _ in range(8):
        name = uuid.uuid4().hex
        test_nodes.barriers[name] = threading.Barrier(3)
        started.append(conveyor_service.trigger("race", {"barrier": name}))
        row = wait_for(conveyor_service, started[-1])
        assert row.status is ExecutionStatus.COMPLETED, row.error

    # Then each join ran exactly once, with every parent's output
    for execution_id in started:
        row = wait_for(conveyor_service, execution_id)
        assert row.output == {"join": {"sum": 6}}
        assert len(jobs_and_attempts(conveyor_service, execution_id)["join"][1]) == 1
    joins = [e for e in effects(conveyor_service.db.url) if e["node_id"] == "join"]
    assert len(joins) == len(started)
    # And the race ran the way batching sends siblings: the three parents of each execution
    # in one message (nothing else is ever made ready together here), or each alone; the
    # barrier proves, either way, that the three finished together
    assert packed_messages == ([3] * len(started) if batch_most > 1 else [])
