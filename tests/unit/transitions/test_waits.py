"""Wait nodes (conveyor.engine.waits): a try waits, holding nothing, for an application event of
its name and key; an event wakes every wait on its key once, and is kept for the waits that
begin after it; a timeout fails the node or takes its on_timeout branch; a stop cancels it."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from typing import Any

from conveyor.engine import cancellation, dead_letters, waits
from conveyor.engine.claiming import NodeRun
from conveyor.engine.records import AfterCommit
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus
from tests.support.bench import Bench, node


def wait_node(
    node_id: str, *needs: str, fields: dict[str, Any] | None = None, **config: Any
) -> dict[str, Any]:
    return node(
        node_id, *needs, type="wait",
        config={"event": "payment.confirmed", "key": "{{ input.order }}", **config},
        **(fields or {}),
    )  # fmt: skip


def order_flow(bench: Bench, name: str = "order", tenant: str = "default", **config: Any) -> None:
    """wait (for the order's payment) -> ship."""
    bench.apply(name, wait_node("wait", **config), node("ship", "wait"), tenant=tenant)


def begin(bench: Bench, run: NodeRun) -> waits.Began:
    return bench.units.run(lambda s: waits.begin_wait(s, run, bench.clock(), random.Random(7)))


def started_wait(bench: Bench, order: str, name: str = "order", tenant: str = "default",
                 ) -> tuple[uuid.UUID, NodeRun]:  # fmt: skip
    made = bench.trigger(name, {"order": order}, tenant=tenant)
    run = bench.claim_node(made.execution_id, "wait")
    return made.execution_id, run


def send(
    bench: Bench, key: str, payload: Any, *, tenant: str = "default",
    event: str = "payment.confirmed", keep_for: timedelta = waits.DEFAULT_RETENTION,
) -> waits.Sent:  # fmt: skip
    def work(s: Any) -> waits.Sent:
        return waits.send_event(
            s, s.tenant_id(tenant), event, key, payload, bench.clock(), keep_for
        )

    return bench.units.run(work)


def expire(bench: Bench) -> tuple[int, AfterCommit]:
    return bench.units.run(lambda s: waits.expire_waits(s, bench.clock(), 100))


def ship_job(bench: Bench, execution_id: uuid.UUID) -> JobStatus:
    return bench.job(execution_id, "ship").status


def test_a_wait_holds_its_job_without_a_worker_until_its_event_completes_it_with_the_payload(
    bench: Bench,
) -> None:
    order_flow(bench)
    execution_id, run = started_wait(bench, "A1")

    began = begin(bench, run)

    assert began.waiting and not began.woke
    assert bench.job(execution_id, "wait").status is JobStatus.WAITING_EVENT
    assert bench.statuses(execution_id) == {"wait": "waiting", "ship": "pending"}

    bench.clock.advance(5)
    sent = send(bench, "A1", {"amount": 12})

    assert sent.woke == [run.job.id]
    assert [d.job_id for d in sent.after.dispatches] == [bench.job(execution_id, "ship").id]
    assert bench.statuses(execution_id) == {"wait": "completed", "ship": "queued"}
    assert bench.probe.nodes(execution_id)["wait"].output == {"amount": 12}
    (attempt,) = bench.probe.attempts(run.job.id)
    assert attempt.status is AttemptStatus.SUCCEEDED


def test_an_event_sent_before_the_wait_began_is_kept_and_taken_when_it_begins(
    bench: Bench,
) -> None:
    order_flow(bench)
    made = bench.trigger("order", {"order": "A2"})
    bench.clock.advance(1)

    assert send(bench, "A2", {"paid": True}).woke == []  # nothing waits yet: kept
    run = bench.claim_node(made.execution_id, "wait")
    began = begin(bench, run)

    assert began.woke and not began.waiting
    assert bench.statuses(made.execution_id) == {"wait": "completed", "ship": "queued"}
    assert bench.probe.nodes(made.execution_id)["wait"].output == {"paid": True}


def test_an_event_that_came_before_the_execution_started_is_not_taken(bench: Bench) -> None:
    order_flow(bench)
    send(bench, "A3", {"stale": True})
    bench.clock.advance(1)
    execution_id, run = started_wait(bench, "A3")

    assert begin(bench, run).waiting
    assert bench.statuses(execution_id)["wait"] == "waiting"


def test_two_events_for_one_wait_wake_it_once_with_the_first(bench: Bench) -> None:
    order_flow(bench)
    execution_id, run = started_wait(bench, "A4")
    begin(bench, run)

    first = send(bench, "A4", {"n": 1})
    second = send(bench, "A4", {"n": 2})

    assert (first.woke, second.woke) == ([run.job.id], [])
    assert second.after.dispatches == []
    assert bench.probe.nodes(execution_id)["wait"].output == {"n": 1}
    assert len(bench.probe.attempts(run.job.id)) == 1


def test_two_events_kept_before_the_wait_began_wake_it_once_with_the_earlier(
    bench: Bench,
) -> None:
    order_flow(bench)
    made = bench.trigger("order", {"order": "A5"})
    bench.clock.advance(1)
    send(bench, "A5", {"n": 1})
    bench.clock.advance(1)
    send(bench, "A5", {"n": 2})

    begin(bench, bench.claim_node(made.execution_id, "wait"))

    assert bench.probe.nodes(made.execution_id)["wait"].output == {"n": 1}
    assert bench.statuses(made.execution_id) == {"wait": "completed", "ship": "queued"}


def test_one_event_wakes_every_wait_on_its_key(bench: Bench) -> None:
    order_flow(bench)
    one, run_one = started_wait(bench, "shared")
    two, run_two = started_wait(bench, "shared")
    begin(bench, run_one)
    begin(bench, run_two)

    sent = send(bench, "shared", {"ok": 1})

    assert sorted(sent.woke) == sorted([run_one.job.id, run_two.job.id])
    assert ship_job(bench, one) is ship_job(bench, two) is JobStatus.QUEUED


def test_an_event_of_another_key_name_or_tenant_wakes_nothing(bench: Bench) -> None:
    order_flow(bench)
    order_flow(bench, tenant="other")
    execution_id, run = started_wait(bench, "B1")
    begin(bench, run)
    before = bench.rows(execution_id)

    assert send(bench, "B2", {}).woke == []
    assert send(bench, "B1", {}, event="payment.failed").woke == []
    assert send(bench, "B1", {}, tenant="other").woke == []

    assert bench.rows(execution_id) == before
    # and the event kept in the other tenant is not taken by this tenant's waits either
    _, run_later = started_wait(bench, "B1")
    assert begin(bench, run_later).waiting


def test_a_wait_past_its_timeout_fails_without_a_retry(bench: Bench) -> None:
    bench.apply(
        "order",
        wait_node("wait", timeout=60, fields={"retry": {"max_attempts": 3, "backoff": 1}}),
        node("ship", "wait"),
    )
    execution_id, run = started_wait(bench, "C1")
    begin(bench, run)

    bench.clock.advance(59)
    assert expire(bench)[0] == 0
    bench.clock.advance(2)
    settled, _ = expire(bench)

    assert settled == 1
    assert bench.job(execution_id, "wait").status is JobStatus.DEAD_LETTER
    assert bench.statuses(execution_id) == {"wait": "failed", "ship": "cancelled"}
    assert bench.probe.execution(execution_id).status is ExecutionStatus.FAILED
    (attempt,) = bench.probe.attempts(run.job.id)
    assert attempt.status is AttemptStatus.FAILED
    assert "timed out after 61 s without event" in (attempt.error or "")
    assert send(bench, "C1", {}).woke == []  # too late: nothing waits


def test_a_wait_past_its_timeout_takes_its_on_timeout_branch(bench: Bench) -> None:
    bench.apply(
        "order",
        wait_node("wait", timeout="{{ input.patience }}", on_event=["ship"], on_timeout=["remind"]),
        node("ship", "wait"),
        node("remind", "wait"),
    )
    made = bench.trigger("order", {"order": "C2", "patience": 30})
    run = bench.claim_node(made.execution_id, "wait")
    begin(bench, run)

    bench.clock.advance(31)
    settled, after = expire(bench)

    assert settled == 1
    assert [d.job_id for d in after.dispatches] == [bench.job(made.execution_id, "remind").id]
    assert bench.statuses(made.execution_id) == {
        "wait": "completed", "ship": "skipped", "remind": "queued",
    }  # fmt: skip
    assert bench.probe.nodes(made.execution_id)["wait"].output == {
        "timed_out": True, "event": "payment.confirmed", "key": "C2",
    }  # fmt: skip


def test_an_event_before_the_timeout_takes_the_on_event_branch(bench: Bench) -> None:
    bench.apply(
        "order",
        wait_node("wait", timeout=30, on_event=["ship"], on_timeout=["remind"]),
        node("ship", "wait"),
        node("remind", "wait"),
    )
    made = bench.trigger("order", {"order": "C3"})
    begin(bench, bench.claim_node(made.execution_id, "wait"))

    send(bench, "C3", {"branch": "on_timeout"})  # a payload's own "branch" chooses nothing
    bench.clock.advance(31)

    assert expire(bench)[0] == 0
    assert bench.statuses(made.execution_id) == {
        "wait": "completed", "ship": "queued", "remind": "skipped",
    }  # fmt: skip


def test_cancelling_an_execution_cancels_its_wait_and_a_later_event_wakes_nothing(
    bench: Bench,
) -> None:
    order_flow(bench, timeout=10)
    execution_id, run = started_wait(bench, "D1")
    begin(bench, run)

    bench.units.run(lambda s: cancellation.cancel_execution(s, execution_id, bench.clock()))

    assert bench.job(execution_id, "wait").status is JobStatus.CANCELLED
    assert bench.statuses(execution_id) == {"wait": "cancelled", "ship": "cancelled"}
    (attempt,) = bench.probe.attempts(run.job.id)
    assert attempt.status is AttemptStatus.CANCELLED
    assert send(bench, "D1", {}).woke == []
    bench.clock.advance(11)
    assert expire(bench)[0] == 0


def test_a_wait_whose_execution_stopped_before_it_began_ends_cancelled(bench: Bench) -> None:
    order_flow(bench)
    execution_id, run = started_wait(bench, "D2")
    bench.units.run(lambda s: cancellation.cancel_execution(s, execution_id, bench.clock()))

    began = begin(bench, run)

    assert not began.waiting and began.failed is not None
    assert bench.job(execution_id, "wait").status is JobStatus.CANCELLED


def test_an_expired_event_is_not_taken_and_the_retention_sweep_drops_it(bench: Bench) -> None:
    order_flow(bench)
    made = bench.trigger("order", {"order": "E1"})
    send(bench, "E1", {}, keep_for=timedelta(seconds=10))
    bench.clock.advance(11)

    assert begin(bench, bench.claim_node(made.execution_id, "wait")).waiting
    assert bench.units.run(lambda s: s.drop_expired_events(bench.clock(), 100)) == 1
    assert bench.units.run(lambda s: s.drop_expired_events(bench.clock(), 100)) == 0


def test_a_key_that_renders_empty_fails_the_try_without_a_retry(bench: Bench) -> None:
    order_flow(bench)
    made = bench.trigger("order", {"order": ""})
    run = bench.claim_node(made.execution_id, "wait")

    began = begin(bench, run)

    assert began.failed is not None and began.error is not None
    assert "config.key" in str(began.error)
    assert bench.job(made.execution_id, "wait").status is JobStatus.DEAD_LETTER


def test_a_timed_out_wait_requeued_from_its_dead_letter_waits_again_and_its_event_wakes_it(
    bench: Bench,
) -> None:
    # Given a wait that timed out and failed its execution
    order_flow(bench, timeout=60)
    execution_id, run = started_wait(bench, "F1")
    begin(bench, run)
    bench.clock.advance(61)
    expire(bench)
    dead = bench.job(execution_id, "wait")
    assert dead.status is JobStatus.DEAD_LETTER

    # When its dead letter is requeued, its next try claimed and begun
    (published,) = bench.units.run(lambda s: dead_letters.requeue(s, dead.id, None, bench.clock()))
    again = begin(bench, bench.claimed(published.job_id))

    # Then it waits again, with a new timeout, and its event (late but kept) wakes it
    assert again.waiting
    bench.clock.advance(30)
    assert expire(bench)[0] == 0
    assert send(bench, "F1", {"paid": "late"}).woke == [dead.id]
    assert bench.statuses(execution_id) == {"wait": "completed", "ship": "queued"}
    assert bench.probe.execution(execution_id).status is ExecutionStatus.RUNNING


def _delivery(bench: Bench, payload: Any, **wakes: Any) -> uuid.UUID:
    """A verified delivery of type ``paid`` stored for an endpoint that wakes ``wakes``."""
    from conveyor.engine import subscriptions
    from conveyor.engine.credentials import Verified
    from conveyor.engine.states import SignatureScheme

    tenant = bench.units.run(lambda s: s.tenant_id("default"))
    endpoint = bench.units.run(lambda s: s.add_endpoint(
        tenant, f"pay-{uuid.uuid4().hex[:6]}", SignatureScheme.STANDARD, "secret", bench.clock(),
        **wakes))  # fmt: skip
    verified = Verified(delivery_id=uuid.uuid4().hex, event="paid", payload=payload)
    return bench.units.run(lambda s: subscriptions.store_delivery(
        s, endpoint, verified, bench.clock(), timedelta(days=1))).id  # fmt: skip


def deliver(bench: Bench, delivery_id: uuid.UUID) -> waits.Delivered:
    return bench.units.run(lambda s: waits.deliver_webhook(s, delivery_id, bench.clock()))


def test_a_webhook_delivery_wakes_the_wait_its_endpoints_key_template_names(
    bench: Bench,
) -> None:
    order_flow(bench)
    execution_id, run = started_wait(bench, "W1")
    begin(bench, run)
    named = "payment.{{ 'confirmed' if event == 'paid' else event }}"
    delivery = _delivery(bench, {"order": "W1", "amount": 9}, wakes_key="{{ payload.order }}",
                         wakes_event=named)  # fmt: skip

    delivered = deliver(bench, delivery)

    assert delivered.woke == [run.job.id] and delivered.woke_executions == [execution_id]
    assert bench.probe.nodes(execution_id)["wait"].output == {"order": "W1", "amount": 9}
    assert deliver(bench, delivery).woke == []  # handled once


def test_a_delivery_wakes_nothing_when_its_endpoint_names_no_key_or_it_renders_none(
    bench: Bench,
) -> None:
    order_flow(bench)
    execution_id, run = started_wait(bench, "W2")
    begin(bench, run)

    plain = deliver(bench, _delivery(bench, {"order": "W2"}))
    keyless = deliver(bench, _delivery(bench, {"other": 1}, wakes_key="{{ payload.order }}",
                                       wakes_event="payment.confirmed"))  # fmt: skip

    assert (plain.woke, keyless.woke) == ([], [])
    assert bench.statuses(execution_id)["wait"] == "waiting"
