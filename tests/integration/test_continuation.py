"""Continuations end to end (real PostgreSQL, the Redis broker and limiter, the in-process
worker): a chain's next step claimed by the worker whose success made it ready, in that
success's transaction, and run next without a message (docs/guarantees.md#continuations)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import before_task_publish

from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, Priority
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.integration.test_execution import py
from tests.support.nodes import overlap_peak
from tests.support.services import effects, wait_for

NODE_TASKS = ("conveyor.node.run", "conveyor.node.run_many")


def chain(name: str, steps: int, **extra: Any) -> dict[str, Any]:
    """``steps`` nodes in a line, each adding one to the sum before it."""
    nodes = [py("s0", "add", a=0, b=1)] + [
        py(f"s{i}", "add", [f"s{i - 1}"], a=f"{{{{ nodes.s{i - 1}.sum }}}}", b=1)
        for i in range(1, steps)
    ]
    return {"name": name, "nodes": nodes, **extra}


@pytest.fixture
def node_messages() -> Iterator[Counter[str]]:
    """The node tasks' messages published while the test runs."""
    counts: Counter[str] = Counter()

    def count(sender: str | None = None, **_: Any) -> None:
        if sender in NODE_TASKS:
            counts[sender] += 1

    before_task_publish.connect(count, weak=False)
    yield counts
    before_task_publish.disconnect(count)


@pytest.fixture
def steps_in_a_row(conveyor_service: Conveyor) -> Iterator[Any]:
    """Set the worker's CONVEYOR_CONTINUE_STEPS for one test (the in-process worker and the
    test share the service)."""
    saved = conveyor_service.continue_steps

    def set_to(steps: int) -> None:
        conveyor_service.continue_steps = steps

    yield set_to
    conveyor_service.continue_steps = saved


def assert_each_step_once(service: Conveyor, execution_id: Any, steps: int) -> None:
    """Every step's effect exactly once, and its job completed with one succeeded try."""
    ran = Counter(e["node_id"] for e in effects(service.db.url))
    assert ran == Counter({f"s{i}": 1 for i in range(steps)})
    with service.db.transaction() as store:
        pairs = [(j, a) for j, a in store.execution_jobs(execution_id) if j.node_id]
    assert len(pairs) == steps
    for job, attempts in pairs:
        assert job.status is JobStatus.COMPLETED, job
        assert [a.status for a in attempts] == [AttemptStatus.SUCCEEDED], job


def continued(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The ``continued`` field of each ``job received`` line that has one."""
    return [
        r.msg["continued"] for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == "job received"
        and "continued" in r.msg
    ]  # fmt: skip


def test_a_chain_of_50_runs_each_step_once_mostly_without_messages(
    conveyor_service: Conveyor,
    node_messages: Counter[str],
    steps_in_a_row: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    steps_in_a_row(16)
    conveyor_service.apply(parse_workflow(chain("fifty", 50)))

    with caplog.at_level(logging.INFO, logger="conveyor.jobs"):
        row = wait_for(conveyor_service, conveyor_service.trigger("fifty", {}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"s49": {"sum": 50}}
    assert_each_step_once(conveyor_service, row.id, 50)
    # The first step's message, then one every 17 steps at most: 16 continue in a row, the
    # 17th is published (so that a worker returns to its queue now and then).
    messages = sum(node_messages.values())
    assert 3 <= messages <= 4, node_messages
    # and each step that came without a message says so in its log, 16 in a row at most
    steps = continued(caplog)
    assert len(steps) == 50 - messages and max(steps) == 16, steps


def test_with_continuations_off_every_step_is_published(
    conveyor_service: Conveyor, node_messages: Counter[str], steps_in_a_row: Any
) -> None:
    steps_in_a_row(0)
    conveyor_service.apply(parse_workflow(chain("published", 10)))

    row = wait_for(conveyor_service, conveyor_service.trigger("published", {}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert_each_step_once(conveyor_service, row.id, 10)
    assert sum(node_messages.values()) == 10


class _Holding:
    def __init__(self, held: list[Any]) -> None:
        self.held = held

    def publish(self, dispatches: Any, *, batch: bool = True) -> None:
        self.held.extend(dispatches)


def test_no_step_continues_while_a_job_of_higher_priority_waits_in_the_queue(
    conveyor_service: Conveyor, node_messages: Counter[str], steps_in_a_row: Any
) -> None:
    # Given a high-priority execution whose job waits in the node queue (its message held)
    steps_in_a_row(16)
    conveyor_service.apply(parse_workflow(chain("urgent", 1)))
    conveyor_service.apply(parse_workflow(chain("routine", 8)))
    held: list[Any] = []
    original = conveyor_service.dispatcher
    conveyor_service.dispatcher = _Holding(held)  # type: ignore[assignment]
    try:
        urgent = conveyor_service.trigger("urgent", {}, priority=Priority.HIGH)
    finally:
        conveyor_service.dispatcher = original
    assert len(held) == 1

    # When a normal-priority chain runs meanwhile
    routine_id = conveyor_service.trigger("routine", {}, priority=Priority.NORMAL)
    routine = wait_for(conveyor_service, routine_id)

    # Then each of its steps went through the queue, behind the waiting job: none continued
    assert routine.status is ExecutionStatus.COMPLETED, routine.error
    assert sum(node_messages.values()) == 8
    # and the high job, published at last, runs
    conveyor_service.dispatcher.publish(held)
    assert wait_for(conveyor_service, urgent).status is ExecutionStatus.COMPLETED


def overlapping_chain(
    name: str, steps: int, key: str, seconds: float = 0.02, **extra: Any
) -> dict[str, Any]:
    """``steps`` nodes in a line, each counting how many such nodes under ``key`` run with it
    (``seconds`` each: long enough that two unlimited chains overlap)."""
    nodes = [
        {
            "id": f"s{i}", "type": "python", "config": {"function": "test.overlap"},
            "needs": [f"s{i - 1}"] if i else [], "inputs": {"key": key, "seconds": seconds},
        }
        for i in range(steps)
    ]  # fmt: skip
    return {"name": name, "nodes": nodes, **extra}


def test_two_chains_under_a_workflow_limit_of_one_never_run_two_steps_at_once(
    conveyor_service: Conveyor, steps_in_a_row: Any
) -> None:
    # Given a workflow limited to one node at a time, and two of its chains at once
    steps_in_a_row(16)
    conveyor_service.apply(
        parse_workflow(overlapping_chain("one-lane", 6, "lane", 0.1, concurrency=1))
    )

    first = conveyor_service.trigger("one-lane", {})
    second = conveyor_service.trigger("one-lane", {})

    # Then both complete, each step once, and never two steps ran at once: a step continues
    # only with its permits, which its predecessor's (still held) leaves none of
    for execution_id in (first, second):
        row = wait_for(conveyor_service, execution_id)
        assert row.status is ExecutionStatus.COMPLETED, row.error
    ran = Counter((e["node_id"]) for e in effects(conveyor_service.db.url))
    assert ran == Counter({f"s{i}": 2 for i in range(6)})
    assert overlap_peak("lane") == 1
    usage = {u.key: u for u in conveyor_service.gate.limiter.snapshot()}  # type: ignore[union-attr]
    assert usage["global"].in_use == 0 and usage["global"].waiting == 0


def test_a_chain_under_a_limit_with_room_continues_holding_each_steps_permits(
    conveyor_service: Conveyor, node_messages: Counter[str], steps_in_a_row: Any
) -> None:
    # Given a workflow limited to two at a time: room for a step beside its predecessor's
    steps_in_a_row(16)
    conveyor_service.apply(parse_workflow(overlapping_chain("two-lanes", 6, "two", concurrency=2)))

    row = wait_for(conveyor_service, conveyor_service.trigger("two-lanes", {}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert sum(node_messages.values()) == 1  # the first step's; the others continued
    ran = Counter((e["node_id"]) for e in effects(conveyor_service.db.url))
    assert ran == Counter({f"s{i}": 1 for i in range(6)})
    usage = {u.key: u for u in conveyor_service.gate.limiter.snapshot()}  # type: ignore[union-attr]
    assert usage["global"].in_use == 0 and usage["global"].waiting == 0


def test_a_map_item_runs_the_held_item_it_released_next_without_a_message(
    conveyor_service: Conveyor,
    node_messages: Counter[str],
    steps_in_a_row: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a map of 12 items with a window of 2: 10 items are held, each released by an
    # item's success
    steps_in_a_row(16)
    saved, conveyor_service.map_window = conveyor_service.map_window, 2
    key = f"released-{id(caplog)}"
    nodes = [
        {"id": "m", "type": "python", "config": {"function": "test.overlap"},
         "map": {"over": "{{ input.rows }}"}, "inputs": {"key": key, "seconds": 0.02}},
    ]  # fmt: skip
    conveyor_service.apply(parse_workflow({"name": "released", "nodes": nodes}))
    try:
        with caplog.at_level(logging.INFO, logger="conveyor.jobs"):
            row = wait_for(
                conveyor_service, conveyor_service.trigger("released", {"rows": [*range(12)]})
            )
    finally:
        conveyor_service.map_window = saved

    # Then every item ran once, the window held (two at once at most), and the items an
    # item released were run by its worker as continuations, not sent as messages
    assert row.status is ExecutionStatus.COMPLETED, row.error
    with conveyor_service.db.transaction() as store:
        item_jobs = [j for j, _ in store.execution_items(row.id, "m", limit=100)]
    assert sorted(j.item_index for j in item_jobs) == list(range(12))
    assert {j.status for j in item_jobs} == {JobStatus.COMPLETED}
    assert 1 <= overlap_peak(key) <= 2
    released = len(continued(caplog))
    assert released >= 8, caplog.text[-2000:]
    assert sum(node_messages.values()) <= 1 + 2 + (10 - released), node_messages
