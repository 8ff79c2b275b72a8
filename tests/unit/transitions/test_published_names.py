"""Every message a transition publishes names its workflow and node, for operators: Flower
shows them as the task's name and arguments (conveyor.tasks.dispatch), and a batch's worker
hands a job back under its name (the hints carry it)."""

from __future__ import annotations

from uuid import uuid4

from conveyor.engine import dead_letters, due
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority
from conveyor.exceptions import NonRetryableError
from conveyor.tasks.dispatch import shown_args, shown_name
from tests.support.bench import Bench, node

RETRY = {"retry": {"max_attempts": 2, "backoff": 10, "jitter": 0}}


def named(dispatches: list[Dispatch]) -> list[tuple[str, str, str | None]]:
    return [(d.workflow, d.node, d.hints.workflow if d.hints else None) for d in dispatches]


def test_a_triggers_roots_and_the_successors_a_success_makes_ready_are_named(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("orders", node("charge"), node("ship", "charge")).name)
    assert named(made.dispatches) == [("orders", "charge", "orders")]

    published = bench.succeed(bench.claim_node(made.execution_id, "charge"), {"ok": True})

    assert named(published) == [("orders", "ship", "orders")]
    (ship,) = published
    assert shown_name(ship) == "orders/ship"
    assert shown_args(ship) == f"job={ship.job_id} execution={made.execution_id} " + (
        "workflow=orders node=ship"
    )


def test_a_retry_promoted_and_a_dead_letter_requeued_are_named(bench: Bench) -> None:
    made = bench.trigger(bench.apply("orders", node("charge"), defaults=RETRY).name)
    bench.fail(bench.claim_node(made.execution_id, "charge"), RuntimeError("declined"))
    bench.clock.advance(10)

    promoted = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    assert named(promoted) == [("orders", "charge", "orders")]

    bench.fail(bench.claimed(promoted[0].job_id), NonRetryableError("declined"))
    job = bench.job(made.execution_id, "charge")
    requeued = bench.units.run(lambda s: dead_letters.requeue(s, job.id, None, bench.clock()))
    assert named(requeued) == [("orders", "charge", "orders")]


def test_a_message_without_a_workflow_keeps_the_entry_points_name() -> None:
    delivery = Dispatch(
        job_id=uuid4(), kind=JobKind.WEBHOOK, queue="workflow-webhook", priority=Priority.HIGH,
        label="delivery=1",
    )  # fmt: skip
    start = Dispatch(
        job_id=uuid4(), kind=JobKind.EXECUTION, queue="workflow-execution",
        priority=Priority.HIGH, workflow="orders",
    )  # fmt: skip
    assert (shown_name(delivery), shown_args(delivery)) == (
        None, f"job={delivery.job_id} delivery=1",
    )  # fmt: skip
    assert shown_name(start) == "orders (plan)"
