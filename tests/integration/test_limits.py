"""Limits end to end with the in-process worker: parked jobs hold no slot, run one at a time
under a limit of one, and everything completes; cancelled parked jobs leave the lines."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.engine import claiming, triggering
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus, JobStatus, Priority
from conveyor.engine.validation import parse_workflow
from conveyor.limiter.gate import Gate
from conveyor.service import Conveyor
from tests.conftest import TEST_DB_URL
from tests.support.services import max_overlap, spans, statements, wait_for


def fan_out(name: str, width: int, seconds: float, **extra: object) -> dict:
    nodes = [
        {
            "id": f"n{i}",
            "type": "python",
            "config": {"function": "test.span"},
            "inputs": {"tenant": "default", "workflow": name, "seconds": seconds},
        }
        for i in range(width)
    ]
    return {"name": name, "nodes": nodes, **extra}


def job_statuses(service: Conveyor, execution_id: uuid.UUID) -> list[JobStatus]:
    with service.db.transaction() as store:
        return [job.status for job, _ in store.execution_jobs(execution_id) if job.node_id]


def test_a_workflow_limited_to_one_runs_its_parallel_nodes_one_at_a_time(
    conveyor_service: Conveyor,
) -> None:
    # Given a fan-out of four nodes and six worker threads, but a workflow limit of one
    conveyor_service.apply(parse_workflow(fan_out("one-at-a-time", 4, 0.2, concurrency=1)))

    # When it runs
    execution_id = conveyor_service.trigger("one-at-a-time")
    deadline = time.monotonic() + 5
    seen_parked = False
    while time.monotonic() < deadline and not seen_parked:
        seen_parked = JobStatus.PARKED in job_statuses(conveyor_service, execution_id)
        time.sleep(0.02)
    row = wait_for(conveyor_service, execution_id)

    # Then the waiting nodes were parked, never two ran at once, and all completed
    assert seen_parked
    assert row.status is ExecutionStatus.COMPLETED, row.error
    runs = [(s.started, s.ended) for s in spans(TEST_DB_URL)]
    assert len(runs) == 4
    assert max_overlap(runs) == 1
    usage = {u.key: u for u in conveyor_service.gate.limiter.snapshot()}  # type: ignore[union-attr]
    assert usage["global"].in_use == 0 and usage["global"].waiting == 0


def test_the_workflow_default_limit_applies_when_the_definition_sets_none(
    conveyor_service: Conveyor,
) -> None:
    # The integration settings keep the default workflow limit of 5; six threads could run 8
    conveyor_service.apply(parse_workflow(fan_out("defaults", 8, 0.3)))

    row = wait_for(conveyor_service, conveyor_service.trigger("defaults"))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert max_overlap([(s.started, s.ended) for s in spans(TEST_DB_URL)]) == 5


def test_cancelling_an_execution_takes_its_parked_jobs_out_of_the_limiters_lines(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(fan_out("cancel-parked", 3, 2.0, concurrency=1)))
    execution_id = conveyor_service.trigger("cancel-parked")
    deadline = time.monotonic() + 5
    while job_statuses(conveyor_service, execution_id).count(JobStatus.PARKED) < 2:
        assert time.monotonic() < deadline, job_statuses(conveyor_service, execution_id)
        time.sleep(0.02)

    conveyor_service.cancel(execution_id)

    waiting = {u.key: u.waiting for u in conveyor_service.gate.limiter.snapshot()}  # type: ignore[union-attr]
    assert waiting["global"] == 0
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.CANCELLED


def test_a_low_job_queued_past_the_ageing_limit_is_republished_as_normal(
    conveyor_service: Conveyor,
) -> None:
    # Given a low-priority execution whose start job has waited ten minutes in the queue
    # (stored but never published, so only the ageing duty can get it going)
    conveyor_service.apply(parse_workflow(fan_out("old-low", 1, 0.0)))
    ten_minutes_ago = datetime.now(UTC) - timedelta(minutes=10)
    triggered = conveyor_service.db.run(
        lambda s: triggering.trigger(
            s,
            workflow_name="old-low",
            tenant="default",
            input=None,
            now=ten_minutes_ago,
            priority=Priority.LOW,
        )
    )
    (start,) = triggered.dispatches

    # When the ageing duty runs
    aged = conveyor_service.age_queued()

    # Then it was re-published at normal priority, and so the execution ran
    assert aged == 1
    assert conveyor_service.age_queued() == 0
    row = wait_for(conveyor_service, triggered.execution_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    with conveyor_service.db.transaction() as store:
        job = store.job(start.job_id)
    assert job is not None and job.priority is Priority.NORMAL


# -- admission from the message's hints ---------------------------------------------------------


def planned(service: Conveyor, name: str, width: int) -> triggering.Triggered:
    """An execution of ``width`` root nodes under a workflow limit of one, stored and planned
    but not published: the test hands its messages to the gate itself."""
    service.apply(parse_workflow(fan_out(name, width, 0.0, concurrency=1)))
    return service.db.run(
        lambda s: triggering.trigger(s, workflow_name=name, tenant="default", input=None,
                                 now=datetime.now(UTC))
    )  # fmt: skip


def limiter_usage(service: Conveyor) -> dict[str, tuple[int, int]]:
    return {u.key: (u.in_use, u.waiting) for u in service.gate.limiter.snapshot()}  # type: ignore[union-attr]


def gate_of(service: Conveyor) -> Gate:
    assert service.gate is not None
    return service.gate


def job_status(service: Conveyor, job_id: uuid.UUID) -> JobStatus:
    with service.db.transaction() as store:
        job = store.job(job_id)
    assert job is not None
    return job.status


def test_a_hinted_message_takes_its_permits_without_a_read_and_a_refused_one_parks(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gate_of(conveyor_service)
    first, second = planned(conveyor_service, "hinted", 2).dispatches
    assert first.hints is not None and second.hints is not None
    gate.release(gate.admit(first.job_id, first.hints))  # type: ignore[arg-type]

    # When the first job's message is admitted again (its tenant's limit read a moment ago)
    with statements(conveyor_service) as sent:
        permit = gate.admit(first.job_id, first.hints)

    # Then it has its permits, and nothing was read
    assert permit is not None
    assert sent == []
    # And the second, refused under the workflow's limit of one, is read and parked
    assert gate.admit(second.job_id, second.hints) is None
    assert job_status(conveyor_service, second.job_id) is JobStatus.PARKED
    assert limiter_usage(conveyor_service)["global"] == (1, 1)

    # And the release wakes the second, published under its workflow's and node's names,
    # which the limiter kept since it was parked: the wake reads nothing
    woken: list[Dispatch] = []
    publish = gate.publish
    monkeypatch.setattr(gate, "publish", lambda sent: (woken.extend(sent), publish(sent)))
    with statements(conveyor_service) as sent:
        gate.release(permit)  # (the worker runs it)
    assert [(d.job_id, d.workflow, d.node) for d in woken] == [
        (second.job_id, "hinted", second.node)
    ]
    assert sent == []


def test_a_job_parked_from_a_message_without_hints_is_named_when_woken_without_a_read(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gate_of(conveyor_service)
    first, second = planned(conveyor_service, "unhinted", 2).dispatches
    permit = gate.admit(first.job_id)
    assert permit is not None
    assert gate.admit(second.job_id) is None  # read from the database, and parked

    woken: list[Dispatch] = []
    publish = gate.publish
    monkeypatch.setattr(gate, "publish", lambda sent: (woken.extend(sent), publish(sent)))
    with statements(conveyor_service) as sent:
        gate.release(permit)  # (the worker runs it)

    assert [(d.job_id, d.workflow, d.node) for d in woken] == [
        (second.job_id, "unhinted", second.node)
    ]
    assert sent == []


def test_a_duplicate_hinted_message_gives_back_the_permits_it_took(
    conveyor_service: Conveyor,
) -> None:
    (dispatch,) = planned(conveyor_service, "duplicate", 1).dispatches
    conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, dispatch.job_id, datetime.now(UTC), "elsewhere")
    )

    conveyor_service.run_node(dispatch.job_id, dispatch.hints)

    assert job_status(conveyor_service, dispatch.job_id) is JobStatus.PROCESSING  # untouched
    assert limiter_usage(conveyor_service)["global"] == (0, 0)


def test_a_refused_hinted_message_of_a_job_not_runnable_leaves_no_trace_in_the_lines(
    conveyor_service: Conveyor,
) -> None:
    gate = gate_of(conveyor_service)
    first, second = planned(conveyor_service, "stale-refused", 2).dispatches
    permit = gate.admit(first.job_id, first.hints)
    assert permit is not None
    conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, second.job_id, datetime.now(UTC), "elsewhere")
    )

    assert gate.admit(second.job_id, second.hints) is None

    assert job_status(conveyor_service, second.job_id) is JobStatus.PROCESSING  # not parked
    assert limiter_usage(conveyor_service)["global"] == (1, 0)
    gate.release(permit)
