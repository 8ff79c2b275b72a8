"""Wait nodes end to end: real PostgreSQL, Redis broker and the in-process worker. Every wait
resumes exactly once with its own event's payload, whether the event came before the wait
began, while it waited, or twice; a wait's start and its event's arrival racing lose no
wake-up; a timeout takes the timeout branch; a tenant cannot wake another tenant's wait."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

import conveyor
from conveyor import metrics
from conveyor.cli import app
from conveyor.engine import claiming, triggering, waits
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import StoreError
from conveyor.models import Execution, Job
from conveyor.service import Conveyor, utcnow
from tests.conftest import REDIS_URL, TEST_DB_URL
from tests.integration.test_api import MakeKey, client
from tests.support.services import effects, in_thread, lock_waiters, wait_for


def wait_node(node_id: str, *needs: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "wait", "needs": list(needs),
            "config": {"event": "paid", "key": "{{ input.order }}", **config}}  # fmt: skip


def got(*needs: str) -> dict[str, Any]:
    """The successor that counts its runs (an effect row a run) and keeps the payload's n."""
    return {"id": "got", "type": "python", "config": {"function": "test.add"},
            "needs": list(needs), "inputs": {"a": "{{ nodes.wait.n }}", "b": 0}}  # fmt: skip


def apply(service: Conveyor, name: str, *nodes: dict[str, Any], tenant: str = "default") -> None:
    service.apply(parse_workflow({"name": name, "nodes": list(nodes)}), tenant=tenant)


def count_waiting(service: Conveyor) -> int:
    with service.db.transaction() as store:
        return int(
            store.session.scalar(select(func.count()).where(Job.status == JobStatus.WAITING_EVENT))
            or 0
        )


def unfinished(service: Conveyor, ids: list[uuid.UUID]) -> int:
    with service.db.transaction() as store:
        return int(
            store.session.scalar(
                select(func.count()).where(
                    Execution.id.in_(ids),
                    Execution.status.in_([ExecutionStatus.PENDING, ExecutionStatus.RUNNING]),
                )
            )
            or 0
        )


def until(check: Any, timeout: float = 120.0, tick: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "it did not happen in time"
        if tick is not None:
            tick()
        time.sleep(0.05)


@pytest.mark.timeout(600)  # 500 executions of three nodes, 600 events, on a shared machine
def test_five_hundred_waits_each_resume_once_with_their_own_event_in_any_order(
    conveyor_service: Conveyor,
) -> None:
    # Given 500 executions, each waiting on its own key behind a delay: a third held for a
    # second (their events are sent while they are held: before their waits begin)
    service, rng = conveyor_service, random.Random(29)
    apply(service, "pay",
          {"id": "hold", "type": "delay", "config": {"seconds": "{{ input.hold }}"}},
          wait_node("wait", "hold"), got("wait"))  # fmt: skip
    ids, early = {}, []
    for i in range(500):
        held = i % 3 == 0
        ids[i] = service.trigger("pay", {"order": f"o{i}", "hold": 1 if held else 0})
        if held:
            early.append(i)
            # When their events come before their waits began: kept, nothing woken
            assert service.send_event("paid", {"n": i}, key=f"o{i}").woke == []
    late = [i for i in ids if i not in early]
    until(lambda: count_waiting(service) == len(late), tick=service.promote_due)

    # and the others' events come in random order, some of every kind twice
    sends = late + rng.sample(list(ids), 100)
    rng.shuffle(sends)
    woken: dict[int, int] = {}
    for i in sends:
        woke = service.send_event("paid", {"n": i}, key=f"o{i}").woke
        woken[i] = woken.get(i, 0) + len(woke)

    # Then each wait woke once (its first event, or the kept one) and each execution
    # completed, its successor run once on its own payload
    assert {i: n for i, n in woken.items() if n != (i in late)} == {}
    until(lambda: unfinished(service, list(ids.values())) == 0, tick=service.promote_due)
    by_execution = {v: k for k, v in ids.items()}
    runs: dict[int, list[str]] = {}
    for effect in effects(TEST_DB_URL):
        execution_id = uuid.UUID(effect["idempotency_key"].split(":")[0])
        runs.setdefault(by_execution[execution_id], []).append(effect["value"])
    assert {i: len(values) for i, values in runs.items()} == dict.fromkeys(ids, 1)
    assert {i: float(values[0]) for i, values in runs.items()} == {i: float(i) for i in ids}
    for execution_id in rng.sample(list(ids.values()), 5):
        assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED


def test_a_wait_past_its_timeout_takes_its_timeout_branch(conveyor_service: Conveyor) -> None:
    service = conveyor_service
    remind = {"id": "remind", "type": "python", "config": {"function": "test.add"},
              "needs": ["wait"], "inputs": {"a": 1, "b": 1}}  # fmt: skip
    apply(service, "pay",
          wait_node("wait", timeout=1, on_event=["got"], on_timeout=["remind"]),
          got("wait"), remind)  # fmt: skip
    execution_id = service.trigger("pay", {"order": "late"})
    until(lambda: count_waiting(service) == 1)

    until(lambda: unfinished(service, [execution_id]) == 0, tick=service.promote_due)

    row = wait_for(service, execution_id)
    assert row.status is ExecutionStatus.COMPLETED
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["remind"]
    assert service.send_event("paid", {"n": 1}, key="late").woke == []  # too late


def test_a_tenant_cannot_wake_another_tenants_wait(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given the same workflow waiting on the same key in two tenants
    acme, globex = make_key("acme"), make_key("globex")
    for tenant in ("acme", "globex"):
        apply(conveyor_service, "pay", wait_node("wait"), got("wait"), tenant=tenant)
    theirs = conveyor_service.trigger("pay", {"order": "o1"}, tenant="globex")
    ours = conveyor_service.trigger("pay", {"order": "o1"}, tenant="acme")
    until(lambda: count_waiting(conveyor_service) == 2)

    # When acme sends the event through the API
    with client(api_url, acme) as api:
        answer = api.post("/v1/events", json={"type": "paid", "key": "o1", "payload": {"n": 7}})

    # Then acme's wait woke, and globex's still waits
    assert answer.status_code == 202, answer.text
    assert answer.json()["executions"] == []
    assert answer.json()["woke"] == [str(ours)]
    assert wait_for(conveyor_service, ours).status is ExecutionStatus.COMPLETED
    assert count_waiting(conveyor_service) == 1
    with conveyor_service.db.transaction() as store:
        assert store.execution(theirs).status is ExecutionStatus.RUNNING
    with client(api_url, globex) as api:
        answer = api.post("/v1/events", json={"type": "paid", "key": "o1", "payload": {"n": 8}})
    assert answer.json()["woke"] == [str(theirs)]
    assert wait_for(conveyor_service, theirs).status is ExecutionStatus.COMPLETED


def claimed_wait(service: Conveyor, order: str, clock: timedelta = timedelta()) -> claiming.NodeRun:
    """A wait node's try claimed by the test, its execution never published (no worker has
    it), triggered by a process whose clock is ``clock`` off the right time."""
    apply(service, "pay", wait_node("wait"), got("wait"))
    made = service.db.autocommit(
        lambda s: triggering.trigger(
            s, workflow_name="pay", tenant="default", input={"order": order}, now=utcnow() + clock
        )
    )
    (dispatch,) = made.dispatches
    run = service.db.autocommit(lambda s: claiming.claim_node(s, dispatch.job_id, utcnow(), "t"))
    assert run is not None
    return run


def test_an_event_arriving_while_its_wait_begins_waits_for_it_and_wakes_it(
    conveyor_service: Conveyor,
) -> None:
    # Given a wait beginning in a transaction not committed yet
    service = conveyor_service
    run = claimed_wait(service, "race-1")
    began, release = threading.Event(), threading.Event()

    def begin() -> waits.Began:
        with service.db.transaction() as store:
            done = waits.begin_wait(store, run, utcnow())
            began.set()
            release.wait(30)
        return done

    beginning, begun = in_thread(begin)
    assert began.wait(30)

    # When its event arrives meanwhile: it waits for the wait's lock
    sending, sent = in_thread(lambda: service.send_event("paid", {"n": 1}, key="race-1"))
    until(lambda: lock_waiters(service) >= 1, timeout=30)
    release.set()
    beginning.join(30)
    sending.join(30)

    # Then the wait began waiting, and the event, once it had the lock, woke it
    assert begun[0].waiting
    assert sent[0].woke == [run.job.id]
    assert wait_for(service, run.execution.id).status is ExecutionStatus.COMPLETED
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["got"]


def test_a_wait_beginning_while_its_event_arrives_waits_for_it_and_takes_it(
    conveyor_service: Conveyor,
) -> None:
    # Given an event arriving in a transaction not committed yet
    service = conveyor_service
    run = claimed_wait(service, "race-2")
    sent, release = threading.Event(), threading.Event()

    def send() -> waits.Sent:
        with service.db.transaction() as store:
            done = waits.send_event(
                store, run.execution.tenant_id, "paid", "race-2", {"n": 2}, utcnow()
            )
            sent.set()
            release.wait(30)
        return done

    sending, result = in_thread(send)
    assert sent.wait(30)

    # When the wait begins meanwhile: it waits for the event's lock
    beginning, begun = in_thread(
        lambda: service.db.run(lambda s: waits.begin_wait(s, run, utcnow()))
    )
    until(lambda: lock_waiters(service) >= 1, timeout=30)
    release.set()
    sending.join(30)
    beginning.join(30)

    # Then the event woke nothing (nothing waited yet), and the wait took it as it began
    assert result[0].woke == []
    assert begun[0].woke and not begun[0].waiting
    service._after(begun[0].after)  # its successor's message, as the worker publishes it
    assert wait_for(service, run.execution.id).status is ExecutionStatus.COMPLETED
    assert [float(e["value"]) for e in effects(TEST_DB_URL)] == [2.0]


def send_by_clock(service: Conveyor, order: str, clock: timedelta) -> waits.Sent:
    """The event of ``order`` sent by a process whose clock is ``clock`` off the right time."""
    return service.db.run(
        lambda s: waits.send_event(
            s, s.tenant_id("default"), "paid", order, {"n": 4}, utcnow() + clock
        )
    )


def test_a_wait_takes_an_event_whose_senders_clock_lags_the_triggers(
    conveyor_service: Conveyor,
) -> None:
    # Given an execution triggered by a process whose clock runs an hour ahead
    run = claimed_wait(conveyor_service, "skew-1", clock=timedelta(hours=1))

    # When its event is sent after it by a process whose clock is right, before the wait began
    assert send_by_clock(conveyor_service, "skew-1", timedelta()).woke == []

    # Then the wait takes it as it begins: both stamped by the database's clock, the event
    # came after the execution
    began = conveyor_service.db.run(lambda s: waits.begin_wait(s, run, utcnow()))
    assert began.woke and not began.waiting


def test_a_wait_leaves_an_event_sent_before_its_execution_by_a_clock_running_ahead(
    conveyor_service: Conveyor,
) -> None:
    # Given an event sent by a process whose clock runs an hour ahead
    assert send_by_clock(conveyor_service, "skew-2", timedelta(hours=1)).woke == []

    # When an execution waiting for it is triggered after it by a process whose clock is right
    run = claimed_wait(conveyor_service, "skew-2")

    # Then its wait does not take it: it came before the execution, by the database's clock
    began = conveyor_service.db.run(lambda s: waits.begin_wait(s, run, utcnow()))
    assert began.waiting and not began.woke


def test_waiting_executions_are_listed_counted_by_age_and_woken_from_the_cli(
    conveyor_service: Conveyor,
) -> None:
    # Given two executions waiting for their events, and one that completed
    service = conveyor_service
    apply(service, "pay", wait_node("wait"), got("wait"))
    apply(service, "plain", {"id": "a", "type": "python", "config": {"function": "test.noop"}})
    waiting = sorted(str(service.trigger("pay", {"order": f"m{i}"})) for i in range(2))
    done = service.trigger("plain")
    until(lambda: count_waiting(service) == 2)
    assert wait_for(service, done).status is ExecutionStatus.COMPLETED

    # When they are listed as waiting, and measured
    cli = CliRunner()
    listed = cli.invoke(app, ["executions", "list", "--status", "waiting", "--json"])
    snap = metrics.take(service.db, REDIS_URL, None, labelled=False)
    families = {f.name: f for f in metrics.metric_families(snap)}

    # Then the waiting ones are, and the metrics count them by age
    assert listed.exit_code == 0, listed.output
    assert sorted(e["id"] for e in json.loads(listed.output)) == waiting
    assert snap.waits == [2, 2, 2, 2] and snap.oldest_wait < 3600
    assert {s.labels["age_le"]: s.value for s in families["conveyor_waits"].samples} == {
        "60": 2, "3600": 2, "86400": 2, "+Inf": 2,
    }  # fmt: skip

    # and `conveyor events send` wakes one of them
    sent = cli.invoke(app, ["events", "send", "paid", "--key", "m0", "--payload", '{"n": 5}',
                            "--json"])  # fmt: skip
    assert sent.exit_code == 0, sent.output
    (woken,) = json.loads(sent.output)["woke"]
    assert wait_for(service, uuid.UUID(woken)).status is ExecutionStatus.COMPLETED
    assert count_waiting(service) == 1


def test_an_event_sent_in_the_callers_transaction_wakes_only_once_it_commits(
    conveyor_service: Conveyor,
) -> None:
    # Given a wait for order "tx"
    service = conveyor_service
    apply(service, "pay", wait_node("wait"), got("wait"))
    execution_id = service.trigger("pay", {"order": "tx"})
    until(lambda: count_waiting(service) == 1)

    # When the application sends its event in a transaction it rolls back: nothing happened
    with Session(service.db.engine) as session, pytest.raises(RuntimeError), session.begin():
        conveyor.send_event(session, "paid", {"n": 1}, key="tx")
        raise RuntimeError("the application changed its mind")
    assert count_waiting(service) == 1
    with service.db.transaction() as store:
        assert store.first_event(store.tenant_id("default"), "paid", "tx",
                                 datetime.min.replace(tzinfo=UTC), utcnow()) is None  # fmt: skip

    # and then in one it commits: the wait wakes with that payload, once committed
    with Session(service.db.engine) as session, session.begin():
        conveyor.send_event(session, "paid", {"n": 2}, key="tx")
        assert count_waiting(service) == 1  # others see nothing before the commit

    assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED
    assert [float(e["value"]) for e in effects(TEST_DB_URL)] == [2.0]


def test_an_event_sent_in_a_repeatable_read_transaction_is_refused_before_it_writes(
    conveyor_service: Conveyor,
) -> None:
    # (its snapshot may predate a wait committed meanwhile, which it would then miss)
    service = conveyor_service
    engine = service.db.engine.execution_options(isolation_level="REPEATABLE READ")
    refused = pytest.raises(StoreError, match="needs a READ COMMITTED transaction")
    with Session(engine) as session, session.begin(), refused:
        conveyor.send_event(session, "paid", {"n": 1}, key="rr")
    with service.db.transaction() as store:
        assert store.first_event(store.tenant_id("default"), "paid", "rr",
                                 datetime.min.replace(tzinfo=UTC), utcnow()) is None  # fmt: skip
