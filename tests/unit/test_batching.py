"""Sibling batching: which node jobs share a message (pure), and a batch's hand-back."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from conveyor.batches import BatchRun, Durations, Member, run_batch
from conveyor.engine.packing import pack, split
from conveyor.engine.records import Dispatch, NodeHints
from conveyor.engine.states import JobKind, Priority
from conveyor.tasks.dispatch import ARGS_CHARS, shown_args, shown_many_args

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def node(priority: Priority = Priority.NORMAL, queue: str = "workflow-node") -> Dispatch:
    hints = NodeHints(
        tenant_id=uuid.uuid4(), workflow_id=uuid.uuid4(), priority=priority, enqueued_at=NOW
    )
    return Dispatch(
        job_id=uuid.uuid4(), kind=JobKind.NODE, queue=queue, priority=priority, hints=hints
    )


def start_job() -> Dispatch:
    return Dispatch(
        job_id=uuid.uuid4(),
        kind=JobKind.EXECUTION,
        queue="workflow-execution",
        priority=Priority.NORMAL,
    )


def sizes(messages: list[list[Dispatch]]) -> list[int]:
    return [len(m) for m in messages]


@pytest.mark.parametrize(
    ("count", "most", "expected"),
    [(200, 8, [8] * 25), (9, 8, [5, 4]), (8, 8, [8]), (3, 8, [3]), (17, 8, [6, 6, 5])],
)
def test_split_makes_the_fewest_groups_of_even_sizes(
    count: int, most: int, expected: list[int]
) -> None:
    items = [node() for _ in range(count)]

    groups = split(items, most)

    assert sizes(groups) == expected
    assert [d for g in groups for d in g] == items  # every job once, in order


def test_pack_keeps_each_job_alone_when_batching_is_off() -> None:
    items = [node() for _ in range(5)]

    assert pack(items, 1) == [[d] for d in items]


def test_pack_groups_node_jobs_of_one_queue_and_priority_only() -> None:
    high = [node(Priority.HIGH) for _ in range(3)]
    normal = [node() for _ in range(2)]
    other_queue = [node(queue="workflow-other") for _ in range(2)]
    start = start_job()
    unhinted = Dispatch(
        job_id=uuid.uuid4(), kind=JobKind.NODE, queue="workflow-node", priority=Priority.NORMAL
    )
    mixed = [high[0], normal[0], start, high[1], other_queue[0], unhinted, normal[1], high[2]]
    mixed.append(other_queue[1])

    messages = pack(mixed, 8)

    # in the order of each message's first job; a start job and an unhinted node job alone
    assert messages == [high, normal, [start], other_queue, [unhinted]]


def test_pack_of_one_job_is_that_job() -> None:
    one = node()

    assert pack([one], 8) == [[one]]


def members(count: int) -> list[Member]:
    return [(uuid.uuid4(), None) for _ in range(count)]


def test_a_batch_within_its_budget_runs_every_job_in_order_and_hands_back_none() -> None:
    batch = members(5)
    ran: list[uuid.UUID] = []
    handed: list[list[Member]] = []

    run_batch(batch, 10.0, handed.append, lambda job_id, _: ran.append(job_id))

    assert ran == [job_id for job_id, _ in batch]
    assert handed == []


def test_past_its_budget_a_batch_takes_one_more_and_hands_back_the_rest() -> None:
    batch = members(4)
    handed: list[list[Member]] = []
    run = BatchRun(batch, 0.0, handed.append)

    first = run.take()
    after = run.take()

    # the worker, free now, runs the one it takes; the rest go to other workers
    assert first == batch[0]
    assert handed == [batch[1:]]
    assert after is None


def test_a_slow_job_has_the_rest_handed_back_at_the_deadline_not_after_it() -> None:
    # Given a batch whose first job runs for far longer than the budget
    batch = members(3)
    handed_at: list[float] = []
    handed: list[list[Member]] = []
    ran: list[uuid.UUID] = []
    release = threading.Event()

    def hand_back(rest: list[Member]) -> None:
        handed_at.append(time.monotonic())
        handed.append(rest)
        release.set()

    def run(job_id: uuid.UUID, _: object) -> None:
        ran.append(job_id)
        release.wait(5.0)  # the slow node: it ends only once the rest are handed back

    # When it runs
    started = time.monotonic()
    run_batch(batch, 0.1, hand_back, run)

    # Then the jobs not started were handed back while the first still ran, and not run here
    assert handed == [batch[1:]]
    assert handed_at[0] - started < 2.0
    assert ran == [batch[0][0]]


def test_a_job_whose_run_raises_hands_back_the_rest_and_the_error_goes_on() -> None:
    batch = members(4)
    handed: list[list[Member]] = []

    def run(job_id: uuid.UUID, _: object) -> None:
        if job_id == batch[1][0]:
            raise ConnectionError("redis is down")

    with pytest.raises(ConnectionError):
        run_batch(batch, 10.0, handed.append, run)

    assert handed == [batch[2:]]


def test_a_job_past_a_quarter_of_the_budget_has_the_rest_handed_back_early() -> None:
    # Given four jobs with a budget of 1 s (a quarter of it each), the first of which runs 0.6 s
    batch = members(4)
    handed_at: list[float] = []
    handed: list[list[Member]] = []

    def hand_back(rest: list[Member]) -> None:
        handed_at.append(time.monotonic())
        handed.append(rest)

    def run(job_id: uuid.UUID, _: object) -> None:
        if job_id == batch[0][0]:
            time.sleep(0.6)

    started = time.monotonic()
    run_batch(batch, 1.0, hand_back, run)

    # Then the rest went back while it ran, though the batch was well within its budget
    assert handed == [batch[1:]]
    assert handed_at[0] - started < 0.55


def hinted(node_id: str, workflow_id: uuid.UUID) -> Member:
    hints = NodeHints(
        tenant_id=uuid.uuid4(),
        workflow_id=workflow_id,
        priority=Priority.NORMAL,
        enqueued_at=NOW,
        node_id=node_id,
    )
    return uuid.uuid4(), hints


def test_a_node_slow_here_before_has_the_rest_handed_back_before_it_starts() -> None:
    # Given a process that ran node "fetch" for 0.2 s last time, and a batch whose second
    # job is that node
    workflow = uuid.uuid4()
    durations = Durations()
    durations.record(workflow, "fetch", 0.2)
    durations.record(workflow, "parse", 0.001)
    batch = [hinted("parse", workflow), hinted("fetch", workflow), *members(2)]
    events: list[str] = []

    def run(job_id: uuid.UUID, hints: NodeHints | None) -> None:
        events.append(f"ran {hints.node_id if hints else job_id}")

    # When it runs with a budget of 0.4 s: a job's share is 0.1 s, less than "fetch" took
    run_batch(batch, 0.4, lambda rest: events.append(f"handed back {len(rest)}"), run,
              durations.slow)  # fmt: skip

    # Then the two after it went to other workers before it started, not after it ended
    assert events == ["ran parse", "handed back 2", "ran fetch"]


def test_durations_know_only_nodes_this_process_ran() -> None:
    durations = Durations(most=2)
    workflow = uuid.uuid4()
    durations.record(workflow, "a", 1.0)

    assert durations.slow(hinted("a", workflow), 0.5)
    assert not durations.slow(hinted("a", uuid.uuid4()), 0.5)  # another version's "a"
    assert not durations.slow(hinted("b", workflow), 0.5)
    assert not durations.slow((uuid.uuid4(), None), 0.5)  # no hints: unknown
    durations.record(workflow, "b", 1.0)
    durations.record(workflow, "c", 1.0)  # past its size it starts over
    assert not durations.slow(hinted("a", workflow), 0.5)


def test_a_packed_messages_shown_arguments_stop_at_1024_characters_saying_how_many_more() -> None:
    # Given a message of 100 jobs, each shown as ~400 characters (a long label and names)
    long = "x" * 300
    jobs = [
        replace(node(), workflow="orders", node=f"n{i}", label=f"execution={long}")
        for i in range(100)
    ]
    shown = shown_many_args(jobs)
    assert len(shown) <= ARGS_CHARS
    kept = shown.split("; ")[:-1]
    assert len(kept) == 2  # each ~400 characters: the old text joined all 100, ~40 KB
    assert kept == [shown_args(d) for d in jobs[: len(kept)]]  # whole jobs, in order
    assert shown.endswith(f"; … and {100 - len(kept)} more")
    # a message that fits is shown whole, without a tail
    few = [node(), node()]
    assert shown_many_args(few) == "; ".join(shown_args(d) for d in few)
