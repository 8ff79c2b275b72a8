"""Reruns and requeued dead letters around waits (docs/definitions.md, "waiting for an
event"): a rerun from a wait node (or upstream of it) waits again and, like any wait of the
execution, takes the earliest event of its key kept since the execution started, so it
resumes at once with the payload that woke it before while that event is kept; a rerun from
an approval asks again, and the new decision is taken; a requeued dead letter of a wait that
timed out waits again and is woken by an event."""

from __future__ import annotations

import random
import uuid

from conveyor.engine import dead_letters, reruns, waits
from conveyor.engine.claiming import NodeRun
from conveyor.engine.states import ExecutionStatus, JobStatus
from tests.support.bench import Bench, node
from tests.unit.transitions.test_approvals import decide, export_flow, waiting_approval
from tests.unit.transitions.test_waits import (
    begin,
    expire,
    order_flow,
    send,
    started_wait,
    wait_node,
)


def rerun(bench: Bench, execution_id: uuid.UUID, from_node: str) -> reruns.Rerun:
    return bench.units.run(
        lambda s: reruns.rerun(
            s, execution_id, from_node, requested_by="cli:tester", now=bench.clock()
        )
    )


def finish_ship(bench: Bench, execution_id: uuid.UUID) -> None:
    bench.succeed(bench.claim_node(execution_id, "ship"), {"shipped": True})


def test_a_rerun_from_a_wait_waits_again_and_takes_the_event_kept_since_the_execution_began(
    bench: Bench,
) -> None:
    # Given an order that waited, was woken by its payment, and completed
    order_flow(bench)
    execution_id, run = started_wait(bench, "R1")
    begin(bench, run)
    send(bench, "R1", {"amount": 5})
    finish_ship(bench, execution_id)
    assert bench.probe.execution(execution_id).status is ExecutionStatus.COMPLETED

    # When it is rerun from the wait, and a second payment came meanwhile
    bench.clock.advance(10)
    send(bench, "R1", {"amount": 7})
    (again,) = rerun(bench, execution_id, "wait").dispatches
    began = begin(bench, bench.claimed(again.job_id))

    # Then the wait took the earliest event kept since the execution started: the first
    assert began.woke and not began.waiting
    assert bench.probe.nodes(execution_id)["wait"].output == {"amount": 5}
    assert bench.statuses(execution_id) == {"wait": "completed", "ship": "queued"}


def test_a_rerun_upstream_of_a_wait_whose_events_expired_waits_for_a_new_one(
    bench: Bench,
) -> None:
    # Given a completed order whose payment event has since expired
    bench.apply("order", node("prepare"), wait_node("wait", "prepare"), node("ship", "wait"))
    made = bench.trigger("order", {"order": "R2"})
    (wait_job,) = bench.succeed(bench.claim_node(made.execution_id, "prepare"), {})
    begin(bench, bench.claimed(wait_job.job_id))
    send(bench, "R2", {"n": 1}, keep_for=waits.DEFAULT_RETENTION)
    finish_ship(bench, made.execution_id)
    bench.clock.advance(waits.DEFAULT_RETENTION.total_seconds() + 1)

    # When it is rerun from upstream of the wait
    (prepare,) = rerun(bench, made.execution_id, "prepare").dispatches
    (wait_again,) = bench.succeed(bench.claimed(prepare.job_id), {})
    began = begin(bench, bench.claimed(wait_again.job_id))

    # Then the wait waits again, and a new event wakes it
    assert began.waiting
    assert bench.statuses(made.execution_id)["wait"] == "waiting"
    assert send(bench, "R2", {"n": 2}).woke == [wait_again.job_id]
    assert bench.probe.nodes(made.execution_id)["wait"].output == {"n": 2}


def test_a_rerun_from_an_approval_asks_again_and_takes_the_new_decision(bench: Bench) -> None:
    # Given an export approved and completed
    export_flow(bench, on_approve=["export"], on_reject=["notify"])
    execution_id, approval_id = waiting_approval(bench)
    decide(bench, approval_id, True, by="ada")
    bench.succeed(bench.claim_node(execution_id, "export"), {})

    # When it is rerun from the approval
    (again,) = rerun(bench, execution_id, "approve").dispatches
    run: NodeRun = bench.claimed(again.job_id)
    began = bench.units.run(lambda s: waits.begin_wait(s, run, bench.clock(), random.Random(1)))

    # Then it waits for a decision again (same id: the node's job), and a rejection is taken
    assert began.waiting and again.job_id == approval_id
    decided = decide(bench, approval_id, False, by="grace")
    assert decided.output["decision"] == "rejected"
    assert bench.statuses(execution_id)["notify"] == "queued"


def test_a_requeued_dead_letter_of_a_timed_out_wait_waits_again_for_its_event(
    bench: Bench,
) -> None:
    # Given a wait that timed out without a branch: its job dead-lettered, the order failed
    order_flow(bench, timeout=60)
    execution_id, run = started_wait(bench, "R3")
    begin(bench, run)
    bench.clock.advance(61)
    expire(bench)
    assert bench.job(execution_id, "wait").status is JobStatus.DEAD_LETTER

    # When its dead letter is requeued
    (requeued,) = bench.units.run(
        lambda s: dead_letters.requeue(s, run.job.id, None, bench.clock())
    )
    began = begin(bench, bench.claimed(requeued.job_id))

    # Then it waits again (its timeout anew), and its event wakes it
    assert began.waiting
    assert send(bench, "R3", {"late": True}).woke == [run.job.id]
    assert bench.statuses(execution_id) == {"wait": "completed", "ship": "queued"}
    assert bench.probe.execution(execution_id).status is ExecutionStatus.RUNNING
