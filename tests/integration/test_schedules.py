"""Cron schedules against real PostgreSQL, the Redis broker and an in-process Celery worker:
the due check starts each fire once, even when checks race, and obeys the misfire policies."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from conveyor.engine.cron import parse_cron
from conveyor.engine.definitions import ScheduleSpec
from conveyor.engine.states import ExecutionStatus, Priority, ScheduleOrigin
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import ScheduleError
from conveyor.models import Execution, WorkflowVersion
from conveyor.scheduler import schedules
from conveyor.service import Conveyor
from conveyor.store.schedules import Fire
from tests.support.services import effects, wait_for

YEARLY = "0 0 1 1 *"  # its latest slot is months old and the next months away: no race with
# the clock, so a check fires exactly that slot


def now() -> datetime:
    return datetime.now(UTC)


def apply(service: Conveyor, name: str = "report", **extra: Any) -> None:
    node = {
        "id": "sum",
        "type": "python",
        "config": {"function": "test.add"},
        "inputs": {"a": "{{ input.a }}", "b": 1},
    }
    output = {"slot": "{{ execution.scheduled_for }}", "sum": "{{ nodes.sum.sum }}"}
    service.apply(parse_workflow({"name": name, "nodes": [node], "output": output, **extra}))


def add(service: Conveyor, name: str, cron: str = YEARLY, **spec: Any) -> uuid.UUID:
    """Add a schedule of workflow 'report' and make its latest slot due."""
    model = ScheduleSpec(name=name, cron=cron, input={"a": 2}, **spec)
    record = service.db.run(
        lambda s: schedules.add(s, tenant="default", workflow="report", spec=model, now=now())
    )
    make_due(
        service, record.id, parse_cron(cron, "UTC").latest(now(), now() - timedelta(days=400), 1)[0]
    )
    return record.id


def make_due(service: Conveyor, schedule_id: uuid.UUID, slot: datetime) -> None:
    service.db.run(lambda s: s.update_schedule(schedule_id, now(), next_run_at=slot))


def schedule(service: Conveyor, name: str) -> Any:
    with service.db.transaction() as store:
        return store.schedule(store.tenant_id("default"), name)


def runs(service: Conveyor, schedule_id: uuid.UUID | None = None) -> list[Execution]:
    with service.db.transaction() as store:
        query = select(Execution).order_by(Execution.scheduled_for)
        if schedule_id is not None:
            query = query.where(Execution.schedule_id == schedule_id)
        return list(store.session.scalars(query))


def test_a_due_schedule_starts_one_run_that_completes_knowing_its_slot(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service)
    schedule_id = add(conveyor_service, "yearly")
    slot = schedule(conveyor_service, "yearly").next_run_at
    before = now()

    started = conveyor_service.check_schedules()

    assert started == 1
    [run] = runs(conveyor_service)
    assert (run.schedule_id, run.scheduled_for, run.trigger) == (schedule_id, slot, "schedule")
    assert run.priority is Priority.NORMAL  # the default of scheduled runs
    done = wait_for(conveyor_service, run.id)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"slot": slot.isoformat(), "sum": 3}
    after = schedule(conveyor_service, "yearly")
    assert after.run_count == 1
    assert after.last_run_at is not None and after.last_run_at >= before
    assert after.next_run_at == parse_cron(YEARLY, "UTC").next_after(slot)
    # and a second check finds nothing due
    assert conveyor_service.check_schedules() == 0
    assert len(runs(conveyor_service)) == 1


def test_checks_racing_each_other_start_every_fire_exactly_once(
    conveyor_service: Conveyor,
) -> None:
    # Given 120 due schedules
    apply(conveyor_service)
    ids = {add(conveyor_service, f"s{i}") for i in range(120)}
    # When eight checks run at once, each taking small batches so that they interleave
    gate = threading.Barrier(8)
    started: list[int] = []

    def check() -> None:
        gate.wait(timeout=10)
        started.append(conveyor_service.check_schedules(batch=7))

    threads = [threading.Thread(target=check) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    # Then each schedule started one run, and each run's node ran once
    assert sum(started) == 120 and len(started) == 8
    all_runs = runs(conveyor_service)
    assert sorted(str(r.schedule_id) for r in all_runs) == sorted(str(i) for i in ids)
    for run in all_runs:
        assert wait_for(conveyor_service, run.id).status is ExecutionStatus.COMPLETED
    assert len(effects(conveyor_service.db.url)) == 120
    assert all(schedule(conveyor_service, f"s{i}").run_count == 1 for i in range(120))


def test_a_fire_already_stored_is_not_stored_again_even_without_the_row_lock(
    conveyor_service: Conveyor,
) -> None:
    # the unique (schedule, slot) index is the guard behind the row locks
    apply(conveyor_service)
    add(conveyor_service, "guarded")
    record = schedule(conveyor_service, "guarded")
    with conveyor_service.db.transaction() as store:
        workflow_id = store.latest_workflow(record.tenant_id, "report").id
    fire = Fire(
        schedule=record, workflow_id=workflow_id, slot=record.next_run_at, priority=Priority.NORMAL
    )

    first = conveyor_service.db.run(lambda s: s.add_fired_executions([fire], now()))
    second = conveyor_service.db.run(lambda s: s.add_fired_executions([fire, fire], now()))

    assert len(first) == 1 and second == []
    assert len(runs(conveyor_service)) == 1


@pytest.mark.parametrize(
    ("policy", "catch_up", "grace", "expected"),
    [
        ("once", 10, 120, 1),  # the newest slot
        ("skip", 10, 120, 1),  # the newest slot is under a minute old: on time, it runs
        ("skip", 10, 5, 0),  # even the newest is older than the grace time
        ("all", 3, 120, 3),  # the newest three
        ("all", 20, 120, 11),  # each of the eleven
    ],
)
def test_after_downtime_the_misfire_policy_decides_which_missed_slots_run(
    conveyor_service: Conveyor,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
    catch_up: int,
    grace: float,
    expected: int,
) -> None:
    # Given an every-minute schedule last checked ten minutes ago
    apply(conveyor_service)
    schedule_id = add(conveyor_service, "minutely", cron="* * * * *", misfire=policy,
                      catch_up=catch_up)  # fmt: skip
    monkeypatch.setattr(conveyor_service, "misfire_grace", grace)
    while not 10 <= now().second < 50:  # the newest slot is 10 to 50 s old when checked
        time.sleep(0.2)
    make_due(
        conveyor_service,
        schedule_id,
        now().replace(second=0, microsecond=0) - timedelta(minutes=10),
    )

    # When the check runs again
    conveyor_service.check_schedules()

    # Then the policy's runs started, for the newest slots, and the next slot is ahead
    after = schedule(conveyor_service, "minutely")
    assert after.next_run_at > now() - timedelta(seconds=1)
    newest = after.next_run_at - timedelta(minutes=1)
    slots = [r.scheduled_for for r in runs(conveyor_service, schedule_id)]
    assert slots == [newest - timedelta(minutes=m) for m in reversed(range(expected))]
    assert after.run_count == expected
    for run in runs(conveyor_service, schedule_id):
        assert wait_for(conveyor_service, run.id).status is ExecutionStatus.COMPLETED


def test_a_schedule_priority_overrides_the_scheduled_default(conveyor_service: Conveyor) -> None:
    apply(conveyor_service)
    add(conveyor_service, "urgent", priority=Priority.HIGH)

    conveyor_service.check_schedules()

    [run] = runs(conveyor_service)
    assert run.priority is Priority.HIGH


def test_a_paused_schedule_starts_nothing_and_resumes_from_the_next_slot(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service)
    add(conveyor_service, "yearly")
    conveyor_service.db.run(lambda s: schedules.pause(s, "default", "yearly", now()))

    assert conveyor_service.check_schedules() == 0

    resumed = conveyor_service.db.run(lambda s: schedules.resume(s, "default", "yearly", now()))
    assert resumed.enabled and resumed.next_run_at > now()  # the missed slot is not run
    assert conveyor_service.check_schedules() == 0
    assert runs(conveyor_service) == []


def test_applying_a_definition_adds_updates_and_removes_its_declared_schedules(
    conveyor_service: Conveyor,
) -> None:
    # Given a definition declaring two schedules, one of which an operator paused,
    # and an operator's own schedule of the same workflow
    apply(conveyor_service, schedules=[{"cron": "@daily"}, {"name": "hourly", "cron": "@hourly"}])
    add(conveyor_service, "manual")
    conveyor_service.db.run(lambda s: schedules.pause(s, "default", "report", now()))
    daily = schedule(conveyor_service, "report")

    # When the definition is applied again with one changed and the other dropped
    apply(conveyor_service, schedules=[{"cron": "0 6 * * *", "timezone": "Asia/Tokyo"}])

    # Then the changed one keeps its identity and pause, the dropped one is gone
    changed = schedule(conveyor_service, "report")
    assert (changed.id, changed.enabled) == (daily.id, False)
    assert (changed.cron, changed.timezone, changed.origin) == (
        "0 6 * * *",
        "Asia/Tokyo",
        ScheduleOrigin.DEFINITION,
    )
    assert schedule(conveyor_service, "hourly") is None
    assert schedule(conveyor_service, "manual").origin is ScheduleOrigin.MANUAL


def test_a_definition_whose_schedule_name_is_taken_is_refused_and_nothing_is_stored(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service)
    add(conveyor_service, "nightly")

    with pytest.raises(ScheduleError, match="belongs to a schedule of workflow 'report'"):
        apply(conveyor_service, name="other", schedules=[{"name": "nightly", "cron": "@daily"}])

    with conveyor_service.db.transaction() as store:
        other = store.session.scalar(select(func.count()).where(WorkflowVersion.name == "other"))
        assert other == 0
        assert [s.name for s in store.schedules(None)] == ["nightly"]
