"""Which success a worker continues from (conveyor.engine.success.continuation): one that
left exactly one node job's message to publish, to the worker's own queue."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from conveyor.engine import success
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import AfterCommit, Dispatch, NodeHints
from conveyor.engine.states import JobKind, Priority, priorities_above


def test_only_a_success_that_made_one_node_job_ready_in_the_queue_continues() -> None:
    def dispatch(kind: JobKind = JobKind.NODE, queue: str = NODE_QUEUE) -> Dispatch:
        hints = NodeHints(
            tenant_id=uuid.uuid4(), workflow_id=uuid.uuid4(), priority=Priority.NORMAL,
            enqueued_at=datetime.now(UTC), node_id="b",
        )  # fmt: skip
        return Dispatch(
            job_id=uuid.uuid4(), kind=kind, queue=queue, priority=Priority.NORMAL, hints=hints
        )

    one = dispatch()
    assert success.continuation(AfterCommit(dispatches=[one]), NODE_QUEUE) == one
    assert success.continuation(AfterCommit(), NODE_QUEUE) is None
    two = AfterCommit(dispatches=[dispatch(), dispatch()])  # a fan-out: publish them
    assert success.continuation(two, NODE_QUEUE) is None
    assert success.continuation(AfterCommit(dispatches=[dispatch(queue="x")]), NODE_QUEUE) is None
    start = AfterCommit(dispatches=[dispatch(kind=JobKind.EXECUTION)])  # a follow-up's start
    assert success.continuation(start, NODE_QUEUE) is None
    cancelled = AfterCommit(dispatches=[one], forget=[uuid.uuid4()])
    assert success.continuation(cancelled, NODE_QUEUE) is None


def test_only_higher_priorities_go_before_a_continuation() -> None:
    assert priorities_above(Priority.HIGH) == ()
    assert priorities_above(Priority.NORMAL) == (Priority.HIGH,)
    assert priorities_above(Priority.LOW) == (Priority.HIGH, Priority.NORMAL)
