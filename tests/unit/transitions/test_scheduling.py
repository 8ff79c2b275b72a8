"""The schedules' due check (conveyor.scheduler.schedules.check_due) and the events and
webhook deliveries that start workflows (conveyor.engine.subscriptions)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta

import pytest

from conveyor.engine import subscriptions
from conveyor.engine.credentials import Verified
from conveyor.engine.definitions import ScheduleSpec
from conveyor.engine.records import DeliveryReceipt, Fire, TraceContext
from conveyor.engine.states import (
    DeliveryStatus,
    ExecutionStatus,
    JobKind,
    Priority,
    SignatureScheme,
)
from conveyor.exceptions import ReplayedDelivery, ScheduleError
from conveyor.scheduler import schedules
from tests.support.bench import Bench, node

EVERY_5 = {"name": "tick", "cron": "*/5 * * * *"}


def check(bench: Bench) -> schedules.Checked:
    return bench.units.run(lambda s: schedules.check_due(s, bench.clock(), limit=10, grace=60))


def test_a_due_schedule_starts_one_run_for_its_slot_and_moves_to_the_next(
    bench: Bench,
) -> None:
    workflow = bench.apply("cron", node("a"), schedules=[EVERY_5])
    slot = bench.clock() + timedelta(minutes=5)
    assert check(bench).claimed == 0
    bench.clock.advance(5 * 60 + 30)

    checked = check(bench)

    assert (checked.claimed, checked.missed) == (1, 0)
    (published,) = checked.dispatches
    assert published.kind is JobKind.EXECUTION
    with bench.store() as store:
        tick = store.schedule(workflow.tenant_id, "tick")
    assert (tick.next_run_at, tick.run_count, tick.last_run_at) == (
        slot + timedelta(minutes=5), 1, bench.clock(),
    )  # fmt: skip
    assert check(bench).claimed == 0  # the next slot has not come
    execution = bench.probe.execution(bench.probe.job(published.job_id).execution_id)
    assert (execution.status, execution.trigger, execution.scheduled_for) == (
        ExecutionStatus.PENDING, "schedule", slot,
    )  # fmt: skip
    assert execution.priority is Priority.NORMAL


def test_a_slot_is_fired_once_however_often_it_is_stored(bench: Bench) -> None:
    workflow = bench.apply("cron", node("a"), schedules=[EVERY_5])
    with bench.store() as store:
        tick = store.schedule(workflow.tenant_id, "tick")
    fire = Fire(schedule=tick, workflow_id=workflow.id, slot=tick.next_run_at,
                priority=Priority.NORMAL)  # fmt: skip

    first = bench.units.run(lambda s: s.add_fired_executions([fire], bench.clock()))
    again = bench.units.run(lambda s: s.add_fired_executions([fire], bench.clock()))

    assert [f for f, _ in first] == [fire] and again == []


def test_a_fires_trace_context_is_stored_with_its_execution(bench: Bench) -> None:
    # Given a due schedule, and a check that gives each fire a trace context (its span's)
    bench.apply("cron", node("a"), schedules=[EVERY_5])
    given = TraceContext(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate="k=v"
    )

    @contextmanager
    def traced(fires: list[Fire]) -> Iterator[list[Fire]]:
        yield [replace(fire, trace=given) for fire in fires]

    bench.clock.advance(5 * 60 + 30)
    checked = bench.units.run(
        lambda s: schedules.check_due(s, bench.clock(), limit=10, grace=60, traced=traced)
    )

    (published,) = checked.dispatches
    execution_id = bench.probe.job(published.job_id).execution_id
    with bench.store() as store:
        assert store.execution(execution_id).trace == given


def test_a_paused_schedule_starts_nothing(bench: Bench) -> None:
    bench.apply("cron", node("a"), schedules=[EVERY_5])
    bench.units.run(lambda s: schedules.pause(s, "default", "tick", bench.clock()))
    bench.clock.advance(10 * 60)

    assert check(bench) == schedules.Checked(claimed=0)


def test_a_schedule_name_is_taken_once_per_tenant(bench: Bench) -> None:
    bench.apply("cron", node("a"), schedules=[EVERY_5])
    spec = ScheduleSpec(name="tick", cron="@daily")

    with pytest.raises(ScheduleError, match="a schedule named 'tick' exists already"):
        bench.units.run(lambda s: schedules.add(
            s, tenant="default", workflow="cron", spec=spec, now=bench.clock()))  # fmt: skip


def test_an_event_starts_each_workflow_subscribed_to_it(bench: Bench) -> None:
    bench.apply("on_signup", node("welcome"), events=["user.signup"])
    bench.apply("also", node("count"), events=["user.signup", "user.left"])
    bench.apply("deaf", node("x"))

    started = bench.units.run(lambda s: subscriptions.emit_event(
        s, "default", "user.signup", {"id": 7}, bench.clock()))  # fmt: skip

    assert len(started) == 2
    inputs = [bench.probe.execution(t.execution_id).input for t in started]
    assert inputs == [{"event": "user.signup", "payload": {"id": 7}}] * 2
    assert all(bench.probe.execution(t.execution_id).priority is Priority.NORMAL for t in started)


def test_a_webhook_delivery_is_stored_once_and_starts_its_workflows_once(bench: Bench) -> None:
    # Given an endpoint, and a workflow listening to its push events
    tenant = bench.units.run(lambda s: s.tenant_id("default"))
    endpoint = bench.units.run(lambda s: s.add_endpoint(
        tenant, "gh", SignatureScheme.GITHUB, "secret", bench.clock()))  # fmt: skip
    bench.apply("on_push", node("build"), webhooks=[{"endpoint": "gh", "events": ["push"]}])
    push = Verified(delivery_id="d-1", event="push", payload={"ref": "main"}, signature="ab12")
    window = timedelta(days=1)

    def store(verified: Verified) -> DeliveryReceipt:
        return bench.units.run(lambda s: subscriptions.store_delivery(
            s, endpoint, verified, bench.clock(), window))  # fmt: skip

    first = store(push)
    waiting = store(push)  # the sender retries before the worker handled it
    with pytest.raises(ReplayedDelivery):  # the same signed body under another id
        store(Verified(delivery_id="d-2", event="push", payload={}, signature="ab12"))
    delivery = first.id

    started = bench.units.run(lambda s: subscriptions.deliver_webhook(s, delivery, bench.clock()))
    again = bench.units.run(lambda s: subscriptions.deliver_webhook(s, delivery, bench.clock()))
    repeat = store(push)  # and again once it was handled

    assert (len(started), again) == (1, [])
    handled = bench.probe.delivery(delivery)
    assert (handled.status, handled.executions) == (DeliveryStatus.PROCESSED, 1)
    assert first == DeliveryReceipt(
        id=delivery, status=DeliveryStatus.RECEIVED, executions=(), repeated=False
    )
    assert waiting == DeliveryReceipt(
        id=delivery, status=DeliveryStatus.RECEIVED, executions=(), repeated=True
    )
    assert repeat == DeliveryReceipt(
        id=delivery, status=DeliveryStatus.PROCESSED, executions=(started[0].execution_id,),
        repeated=True,
    )  # fmt: skip
    assert bench.probe.execution(started[0].execution_id).input == {
        "event": "push", "delivery_id": "d-1", "payload": {"ref": "main"},
    }  # fmt: skip
    assert bench.probe.counts()["executions"] == 1


def test_the_executions_a_delivery_starts_keep_the_trace_context_it_was_received_in(
    bench: Bench,
) -> None:
    tenant = bench.units.run(lambda s: s.tenant_id("default"))
    endpoint = bench.units.run(lambda s: s.add_endpoint(
        tenant, "gh", SignatureScheme.STANDARD, "secret", bench.clock()))  # fmt: skip
    bench.apply("on_push", node("build"), webhooks=[{"endpoint": "gh"}])
    trace = TraceContext(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate="k=v"
    )
    delivery = bench.units.run(lambda s: subscriptions.store_delivery(
        s, endpoint, Verified(delivery_id="d-3", event="push", payload={}), bench.clock(),
        timedelta(days=1), trace).id)  # fmt: skip

    (started,) = bench.units.run(
        lambda s: subscriptions.deliver_webhook(s, delivery, bench.clock())
    )

    with bench.store() as store:
        assert store.execution(started.execution_id).trace == trace


def test_a_delivery_no_workflow_listens_to_is_marked_unmatched(bench: Bench) -> None:
    tenant = bench.units.run(lambda s: s.tenant_id("default"))
    endpoint = bench.units.run(lambda s: s.add_endpoint(
        tenant, "gh", SignatureScheme.STANDARD, "secret", bench.clock()))  # fmt: skip
    bench.apply("on_push", node("build"), webhooks=[{"endpoint": "gh", "events": ["push"]}])
    delivery = bench.units.run(lambda s: subscriptions.store_delivery(
        s, endpoint, Verified(delivery_id="d-9", event="issue", payload={}), bench.clock(),
        timedelta(days=1)).id)  # fmt: skip

    assert (
        bench.units.run(lambda s: subscriptions.deliver_webhook(s, delivery, bench.clock())) == []
    )

    handled = bench.probe.delivery(delivery)
    assert (handled.status, handled.executions) == (DeliveryStatus.UNMATCHED, 0)
    with bench.store() as store:
        assert store.claim_delivery(delivery) is None  # handled: no longer waiting


def test_a_schedule_dropped_from_the_definition_is_removed_but_an_operators_stays(
    bench: Bench,
) -> None:
    workflow = bench.apply("cron", node("a"), schedules=[EVERY_5])
    spec = ScheduleSpec(name="manual", cron="@daily")
    bench.units.run(lambda s: schedules.add(
        s, tenant="default", workflow="cron", spec=spec, now=bench.clock()))  # fmt: skip

    bench.apply("cron", node("a"), node("b"))

    with bench.store() as store:
        left = store.schedules(workflow.tenant_id, workflow="cron")
    assert [s.name for s in left] == ["manual"]


def test_a_resumed_schedule_starts_from_the_first_slot_after_now(bench: Bench) -> None:
    bench.apply("cron", node("a"), schedules=[EVERY_5])
    bench.units.run(lambda s: schedules.pause(s, "default", "tick", bench.clock()))
    bench.clock.advance(12 * 60)  # slots 00:05 and 00:10 pass while paused

    resumed = bench.units.run(lambda s: schedules.resume(s, "default", "tick", bench.clock()))

    assert resumed.enabled
    assert resumed.next_run_at == bench.clock() + timedelta(minutes=3)  # 00:15
    assert check(bench).claimed == 0


def test_an_event_a_workflow_stopped_listening_to_starts_nothing(bench: Bench) -> None:
    bench.apply("on_signup", node("welcome"), events=["user.signup"])
    bench.apply("on_signup", node("welcome"), node("more"))  # no events any more

    started = bench.units.run(lambda s: subscriptions.emit_event(
        s, "default", "user.signup", {}, bench.clock()))  # fmt: skip

    assert started == []
    assert bench.probe.counts()["executions"] == 0


def test_a_signature_is_refused_again_only_within_the_replay_window(bench: Bench) -> None:
    tenant = bench.units.run(lambda s: s.tenant_id("default"))
    endpoint = bench.units.run(lambda s: s.add_endpoint(
        tenant, "gh", SignatureScheme.GITHUB, "secret", bench.clock()))  # fmt: skip
    window = timedelta(hours=1)

    def note() -> bool:
        return bench.units.run(
            lambda s: s.note_signature(endpoint.id, "ab12", bench.clock(), window)
        )

    assert note()
    bench.clock.advance(3600)
    assert not note()  # exactly a window later: still within it
    bench.clock.advance(1)
    assert note()
    assert not note()  # noted again just now
