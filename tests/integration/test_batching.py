"""Sibling batching end to end: real PostgreSQL, the Redis broker, the in-process worker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import before_task_publish

from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.integration.test_execution import py
from tests.support.services import effects, wait_for


def fan_out(name: str, members: list[dict]) -> dict:
    ids = [m["id"] for m in members]
    return {
        "name": name,
        "nodes": [py("root", "add", a=1, b=1), *members, py("join", "add", ids, a=0, b=0)],
    }


@pytest.fixture
def published() -> Iterator[Counter[str]]:
    """The tasks published while the test runs, by name."""
    counts: Counter[str] = Counter()

    def count(sender: str | None = None, **_: Any) -> None:
        counts[sender or ""] += 1

    before_task_publish.connect(count, weak=False)
    yield counts
    before_task_publish.disconnect(count)


def test_a_fan_out_travels_in_batches_and_every_member_runs_once(
    conveyor_service: Conveyor, published: Counter[str]
) -> None:
    # Given a root that makes 20 members ready at once (messages of up to 8: 7, 7 and 6)
    members = [py(f"m{i}", "add", ["root"], a=i, b=0) for i in range(20)]
    conveyor_service.apply(parse_workflow(fan_out("wide", members)))

    row = wait_for(conveyor_service, conveyor_service.trigger("wide", {}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert published["conveyor.node.run_many"] >= 3
    ran = Counter(e["node_id"] for e in effects(conveyor_service.db.url))
    assert ran == Counter({"root": 1, "join": 1, **{f"m{i}": 1 for i in range(20)}})
    with conveyor_service.db.transaction() as store:
        pairs = store.execution_jobs(row.id)
    assert len(pairs) == 22
    for job, attempts in pairs:
        assert job.status is JobStatus.COMPLETED
        assert [a.status for a in attempts] == [AttemptStatus.SUCCEEDED]


def test_slow_siblings_in_one_message_are_handed_back_and_run_side_by_side(
    conveyor_service: Conveyor, published: Counter[str]
) -> None:
    # Given three members of 0.6 s each, made ready together: one message carries them
    members = [py(f"s{i}", "sleep_add", ["root"], a=i, b=0, seconds=0.6) for i in range(3)]
    conveyor_service.apply(parse_workflow(fan_out("slow", members)))

    row = wait_for(conveyor_service, conveyor_service.trigger("slow", {}))

    # Then the worker ran the first and handed the other two back at the budget (0.05 s):
    # other workers ran them at once, not one after another (1.8 s)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert published["conveyor.node.run_many"] == 1
    assert published["conveyor.node.run"] >= 3  # root, join, and the two handed back
    with conveyor_service.db.transaction() as store:
        states = {n.node_id: n for n in store.execution_nodes(row.id)}
    starts = [states[f"s{i}"].started_at for i in range(3)]
    assert all(starts)
    spread = max(starts) - min(starts)  # type: ignore[type-var, operator]
    assert spread.total_seconds() < 0.4
    ran = Counter(e["node_id"] for e in effects(conveyor_service.db.url))
    assert all(ran[f"s{i}"] == 1 for i in range(3))


def test_a_batch_message_with_a_malformed_job_id_runs_the_others(
    conveyor_service: Conveyor,
) -> None:
    # Given an execution whose lone node's job is queued, and a batch message naming it
    # beside garbage (a hand-made message, an older or foreign client)
    import conveyor.tasks

    conveyor_service.apply(parse_workflow({"name": "lone", "nodes": [py("only", "add", a=2, b=3)]}))
    held: list[Any] = []
    original = conveyor_service.dispatcher
    conveyor_service.dispatcher = _Holding(held)  # type: ignore[assignment]
    try:
        execution_id = conveyor_service.trigger("lone", {})
    finally:
        conveyor_service.dispatcher = original
    (job,) = held

    conveyor.tasks.app.send_task(
        "conveyor.node.run_many", args=[["not-a-uuid", str(job.job_id)]], queue="workflow-node"
    )

    row = wait_for(conveyor_service, execution_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"only": {"sum": 5}}


class _Holding:
    def __init__(self, held: list[Any]) -> None:
        self.held = held

    def publish(self, dispatches: Any, *, batch: bool = True) -> None:
        self.held.extend(dispatches)
