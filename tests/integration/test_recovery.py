"""Durability mechanisms against real PostgreSQL, Redis and the in-process worker: enqueue in
the caller's transaction, active-execution deduplication, heartbeats, and the recovery sweep
that reclaims dead workers' jobs and re-publishes lost messages."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

import conveyor
from conveyor import metrics
from conveyor.engine import claiming, failure, success, triggering
from conveyor.engine.states import ExecutionStatus, JobStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import NodeCancelled
from conveyor.models import Execution, Job, JobAttempt, NodeState
from conveyor.service import Conveyor, utcnow
from tests.conftest import REDIS_DB, REDIS_SERVER
from tests.support.services import effects, wait_for


def add_flow(service: Conveyor, name: str = "adder", seconds: float = 0.0) -> None:
    node = {"id": "add", "type": "python", "config": {"function": "test.sleep_add"},
            "inputs": {"a": 1, "b": 2, "seconds": seconds}}  # fmt: skip
    service.apply(parse_workflow({"name": name, "nodes": [node]}))


def executions(service: Conveyor) -> int:
    with service.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).select_from(Execution)) or 0)


def claimed(service: Conveyor, worker: str) -> tuple[triggering.Triggered, claiming.NodeRun]:
    """An adder execution whose one node job ``worker`` has claimed, not published."""
    add_flow(service)
    made = service.db.run(
        lambda s: triggering.trigger(s, workflow_name="adder", tenant="default", input={},
                                 now=utcnow(), source=TriggerSource.API)
    )  # fmt: skip
    (job_id,) = [d.job_id for d in made.dispatches]  # planned by the trigger: one root
    run = service.db.run(lambda s: claiming.claim_node(s, job_id, utcnow(), worker))
    assert run is not None
    return made, run


def age(service: Conveyor, **values: Any) -> None:
    """Move every job's clocks back, as if the time had passed."""
    with service.db.transaction() as store:
        store.session.execute(update(Job).values(**values))


# -- enqueue in the application's transaction --------------------------------------------------


def test_enqueue_commits_with_the_callers_transaction_and_only_then_publishes(
    conveyor_service: Conveyor,
) -> None:
    add_flow(conveyor_service)
    with Session(conveyor_service.db.engine) as session, session.begin():
        execution_id = conveyor.enqueue(session, "adder", {"order": 1})
        # inside the transaction: nothing is visible to others, nothing is sent yet
        assert executions(conveyor_service) == 0

    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing_and_sends_nothing(
    conveyor_service: Conveyor,
) -> None:
    add_flow(conveyor_service)
    with Session(conveyor_service.db.engine) as session:
        with pytest.raises(RuntimeError), session.begin():
            conveyor.enqueue(session, "adder")
            raise RuntimeError("the application's own work failed")
        with session.begin():  # a later commit of the same session must not send it either
            pass

    time.sleep(0.5)
    assert executions(conveyor_service) == 0
    assert effects(conveyor_service.db.url) == []


# -- deduplication -----------------------------------------------------------------------------


def test_a_dedupe_key_returns_the_active_execution_and_frees_once_it_finishes(
    conveyor_service: Conveyor,
) -> None:
    add_flow(conveyor_service, seconds=0.5)

    first, replayed = conveyor_service.start("adder", dedupe_key="customer-9")
    again, replayed_again = conveyor_service.start("adder", dedupe_key="customer-9")
    assert (again, replayed, replayed_again) == (first, False, True)
    assert wait_for(conveyor_service, first).status is ExecutionStatus.COMPLETED

    later, replayed_later = conveyor_service.start("adder", dedupe_key="customer-9")
    assert later != first and not replayed_later


# -- heartbeats and the recovery sweep ---------------------------------------------------------


def test_a_running_node_renews_its_heartbeat(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conveyor_service, "heartbeat_interval", 0.2)
    monkeypatch.setattr(conveyor_service, "cancel_poll", 0.1)
    add_flow(conveyor_service, seconds=1.5)
    execution_id = conveyor_service.trigger("adder")

    beats = set()
    deadline = time.monotonic() + 10
    while len(beats) < 3:
        assert time.monotonic() < deadline, beats
        with conveyor_service.db.transaction() as store:
            beats.update(
                store.session.scalars(
                    select(Job.heartbeat_at).where(
                        Job.execution_id == execution_id,
                        Job.node_id.is_not(None),
                        Job.status == JobStatus.PROCESSING,
                    )
                )
            )
        time.sleep(0.1)
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED


def test_a_job_whose_worker_died_is_reclaimed_and_retried_to_completion(
    conveyor_service: Conveyor,
) -> None:
    # Given a node job claimed by a worker that then died (no outcome, no heartbeat)
    made, _ = claimed(conveyor_service, "dead")
    age(conveyor_service, heartbeat_at=utcnow() - timedelta(minutes=5))

    # When the recovery sweep runs
    done = conveyor_service.recover(heartbeat_timeout=60, lost_after=3600)

    # Then the try counts as failed (worker lost), and the retry runs it to completion
    assert done == {"reclaimed": 1, "republished": 0, "waits_settled": 0, "children_stopped": 0}
    assert wait_for(conveyor_service, made.execution_id).status is ExecutionStatus.COMPLETED
    with conveyor_service.db.transaction() as store:
        [attempts] = [a for j, a in store.execution_jobs(made.execution_id) if j.node_id]
        counts = store.recovery_counts()
    assert [a.status.value for a in attempts] == ["failed", "succeeded"]
    assert "stopped sending heartbeats" in (attempts[0].error or "")
    assert counts["reclaimed"] == 1


def test_a_lost_message_is_republished_only_when_the_broker_cannot_hold_it(
    conveyor_service: Conveyor,
) -> None:
    # Given a committed execution whose root node's message never reached the broker
    add_flow(conveyor_service)
    made = conveyor_service.db.run(
        lambda s: triggering.trigger(s, workflow_name="adder", tenant="default", input={},
                                 now=utcnow(), source=TriggerSource.API)
    )  # fmt: skip
    age(conveyor_service, enqueued_at=utcnow() - timedelta(minutes=5))
    with conveyor_service.db.transaction() as store:  # named without loading the definition
        stale = store.stale_queued(utcnow() - timedelta(minutes=1), 10)
    assert [(j.node_id, j.workflow) for j in stale if j.execution_id == made.execution_id] == [
        ("add", "adder")
    ]

    # When the broker says it holds a message for that queue, nothing is re-sent
    held = conveyor_service.recover(
        heartbeat_timeout=60, lost_after=60, broker_holds=lambda: {"workflow-node": 1}
    )
    # and when it holds none, the message is sent again and the execution runs
    empty = conveyor_service.recover(heartbeat_timeout=60, lost_after=60, broker_holds=dict)

    assert held["republished"] == 0 and empty["republished"] == 1
    assert wait_for(conveyor_service, made.execution_id).status is ExecutionStatus.COMPLETED
    with conveyor_service.db.transaction() as store:
        assert store.recovery_counts()["republished"] == 1


def test_the_broker_may_hold_as_many_node_jobs_as_its_batch_messages_name() -> None:
    # Given a Redis broker no worker reads: two node messages (normal priority), one start job
    url = f"{REDIS_SERVER}/{REDIS_DB + 4}"  # (+1 acceptance, +2 chaos; 14 benchmarks)
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        client.lpush("workflow-node:3", b"first", b"second")
        client.lpush("workflow-execution", b"start")

        held = metrics.broker_holds(url, {"workflow-node": 8})
    finally:
        client.flushdb()
        client.close()

    # Then a node message may name up to 8 jobs (a batch), any other message one
    assert held is not None
    assert (held["workflow-node"], held["workflow-execution"]) == (16, 1)
    assert metrics.broker_holds("memory://localhost/") is None


def test_a_duplicate_message_changes_nothing(conveyor_service: Conveyor) -> None:
    add_flow(conveyor_service)
    made = conveyor_service.db.run(
        lambda s: triggering.trigger(s, workflow_name="adder", tenant="default", input={},
                                 now=utcnow(), source=TriggerSource.API)
    )  # fmt: skip

    conveyor_service.dispatcher.publish(made.dispatches * 3)

    assert wait_for(conveyor_service, made.execution_id).status is ExecutionStatus.COMPLETED
    time.sleep(0.3)
    assert len(effects(conveyor_service.db.url)) == 1


def test_unknown_and_malformed_job_ids_are_dropped(conveyor_service: Conveyor) -> None:
    import conveyor.tasks as tasks

    tasks.app.send_task("conveyor.node.run", args=[str(uuid.uuid4())], queue="workflow-node")
    tasks.app.send_task("conveyor.node.run", args=["not-a-uuid"], queue="workflow-node")
    tasks.app.send_task("conveyor.execution.start", args=[None], queue="workflow-execution")
    add_flow(conveyor_service)

    execution_id = conveyor_service.trigger("adder")  # the workers go on as before

    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED


# -- retention ---------------------------------------------------------------------------------


def test_the_retention_sweep_deletes_old_finished_executions_and_keeps_the_rest(
    conveyor_service: Conveyor,
) -> None:
    # Given five finished executions, four of them finished 20 days ago: one holding a dead
    # letter no operator has dealt with, one a dead letter discarded to the archive; and one
    # running now
    add_flow(conveyor_service)
    add_flow(conveyor_service, name="slow", seconds=3)
    old, held, archived, recent = (conveyor_service.trigger("adder") for _ in range(4))
    old_failed = conveyor_service.trigger("adder")
    for execution_id in (old, held, archived, recent, old_failed):
        wait_for(conveyor_service, execution_id)
    running = conveyor_service.trigger("slow")
    long_ago = utcnow() - timedelta(days=20)
    with conveyor_service.db.transaction() as store:
        store.session.execute(
            update(Execution)
            .where(Execution.id.in_([old, held, archived, old_failed]))
            .values(finished_at=long_ago)
        )
        store.session.execute(
            update(Execution).where(Execution.id.in_([old_failed, held])).values(status="failed")
        )
        store.session.execute(
            update(Job).where(Job.execution_id == held).values(status=JobStatus.DEAD_LETTER)
        )
        store.session.execute(
            update(Job).where(Job.execution_id == archived).values(status=JobStatus.DISCARDED)
        )

    # When the sweep runs with a 14-day retention, in batches of one
    pruned = conveyor_service.prune(timedelta(days=14), batch=1)

    # Then the old ones are gone with every row of theirs; the others are all still there
    assert pruned == 2
    with conveyor_service.db.transaction() as store:
        left = set(store.session.scalars(select(Execution.id)))
        jobs_left = set(store.session.scalars(select(Job.execution_id)))
        attempts = store.session.scalar(
            select(func.count()).select_from(JobAttempt).join(Job).where(Job.execution_id == old)
        )
        states = store.session.scalar(
            select(func.count()).select_from(NodeState).where(NodeState.execution_id == old)
        )
    assert left == {held, archived, recent, running}
    assert jobs_left == {held, archived, recent, running}
    assert attempts == 0 and states == 0
    assert wait_for(conveyor_service, running).status is ExecutionStatus.COMPLETED


def test_dead_letters_no_requeue_can_resume_hold_nothing_back_a_child_s_its_parent_does(
    conveyor_service: Conveyor,
) -> None:
    # Given executions finished 20 days ago, each holding a dead letter: failed, waiting for
    # an operator; completed (a node continued on failure); failed by a map's dead items; a
    # child whose parent is kept (held by its own dead letter), and one whose parent is gone
    add_flow(conveyor_service)
    made = [conveyor_service.trigger("adder") for _ in range(6)]
    for execution_id in made:
        wait_for(conveyor_service, execution_id)
    waiting, went_on, mapped, kept_child, orphan, parent = made
    shapes = {
        waiting: ({"status": "failed"}, {}),
        went_on: ({"status": "completed"}, {}),
        mapped: ({"status": "failed"}, {"item_index": 0}),
        kept_child: ({"status": "failed", "parent_execution_id": parent}, {}),
        orphan: ({"status": "failed", "parent_execution_id": uuid.uuid4()}, {}),
        parent: ({"status": "failed"}, {}),
    }
    with conveyor_service.db.transaction() as store:
        store.session.execute(update(Execution).values(finished_at=utcnow() - timedelta(days=20)))
        for execution_id, (execution, job) in shapes.items():
            store.session.execute(
                update(Execution).where(Execution.id == execution_id).values(**execution)
            )
            store.session.execute(
                update(Job)
                .where(Job.execution_id == execution_id)
                .values(status=JobStatus.DEAD_LETTER, **job)
            )

    # When the sweep runs
    pruned = conveyor_service.prune(timedelta(days=14))

    # Then only those a requeue could resume stay, and the child whose parent stays
    with conveyor_service.db.transaction() as store:
        left = set(store.session.scalars(select(Execution.id)))
    assert (pruned, left) == (3, {waiting, parent, kept_child})

    # And once the parent's dead letter is discarded and its archive let go, the child goes
    # with it (a sweep later)
    with conveyor_service.db.transaction() as store:
        store.session.execute(
            update(Job)
            .where(Job.execution_id == parent)
            .values(status=JobStatus.DISCARDED, completed_at=utcnow() - timedelta(days=20))
        )
    archive = timedelta(days=10)
    assert conveyor_service.prune(timedelta(days=14), archive_older_than=archive) == 1
    assert conveyor_service.prune(timedelta(days=14), archive_older_than=archive) == 1
    with conveyor_service.db.transaction() as store:
        assert set(store.session.scalars(select(Execution.id))) == {waiting}


def test_the_archive_is_deleted_only_past_its_own_retention_counted_from_the_discard(
    conveyor_service: Conveyor,
) -> None:
    # Given two executions finished 20 days ago, each holding a dead letter discarded to the
    # archive: one 20 days ago, one yesterday
    add_flow(conveyor_service)
    long_discarded, lately_discarded = (conveyor_service.trigger("adder") for _ in range(2))
    for execution_id in (long_discarded, lately_discarded):
        wait_for(conveyor_service, execution_id)
    now = utcnow()
    with conveyor_service.db.transaction() as store:
        store.session.execute(update(Execution).values(finished_at=now - timedelta(days=20)))
        for execution_id, days in ((long_discarded, 20), (lately_discarded, 1)):
            store.session.execute(
                update(Job)
                .where(Job.execution_id == execution_id)
                .values(status=JobStatus.DISCARDED, completed_at=now - timedelta(days=days))
            )

    # When the sweep runs without an archive retention, then with one of 10 days
    kept_all = conveyor_service.prune(timedelta(days=14))
    pruned = conveyor_service.prune(timedelta(days=14), archive_older_than=timedelta(days=10))

    # Then nothing goes at first; then only the one discarded before the archive's retention
    assert (kept_all, pruned) == (0, 1)
    with conveyor_service.db.transaction() as store:
        assert set(store.session.scalars(select(Execution.id))) == {lately_discarded}


def test_status_changes_are_announced_only_for_executions_a_stream_listens_to(
    conveyor_service: Conveyor,
) -> None:
    import psycopg

    from conveyor.api.stream import channel

    add_flow(conveyor_service, name="slow", seconds=0.5)
    conninfo = conveyor_service.db.engine.url.set(drivername="postgresql").render_as_string(
        hide_password=False
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # a LISTEN alone, without a stream_listeners row: nothing is announced
        unheard = conveyor_service.trigger("slow")
        conn.execute(f'LISTEN "{channel(unheard)}"')
        wait_for(conveyor_service, unheard)
        assert list(conn.notifies(timeout=0.5)) == []

        # registered: the execution's changes (and its node's) are
        heard = conveyor_service.trigger("slow")
        conn.execute(f'LISTEN "{channel(heard)}"')
        conn.execute(
            "INSERT INTO stream_listeners (id, execution_id, created_at) VALUES (%s, %s, now())",
            (uuid.uuid4(), heard),
        )
        wait_for(conveyor_service, heard)
        payloads = [n.payload for n in conn.notifies(timeout=0.5)]
    assert any('"status" : "completed"' in p and '"execution"' in p for p in payloads), payloads


def test_a_node_stopped_by_a_cancel_that_was_undone_runs_again_not_dead_lettered(
    conveyor_service: Conveyor,
) -> None:
    # Given a node told to stop because its execution ended, which is running again (an
    # operator requeued a dead letter meanwhile)
    made, run = claimed(conveyor_service, "w")

    # When its try ends with NodeCancelled
    stopped = NodeCancelled("node 'add' was stopped: its execution was cancelled")
    failed = conveyor_service.db.run(lambda s: failure.fail_node(s, run, stopped, utcnow(), 0.1))

    # Then it waits a moment and runs again, as the promoter publishes it: not a failure
    assert failed.outcome is JobStatus.RETRY_WAIT and (failed.retry_in or 1) < 0.1
    conveyor_service.promote_due()
    assert wait_for(conveyor_service, made.execution_id).status is ExecutionStatus.COMPLETED


def test_a_late_outcome_of_a_reclaimed_try_leaves_the_job_to_the_try_that_runs_it_now(
    conveyor_service: Conveyor,
) -> None:
    # Given a try whose worker missed its heartbeats: reclaimed, and its job claimed again by
    # another worker (nothing published: each step by hand)
    made, late = claimed(conveyor_service, "a")
    service = conveyor_service
    service.db.run(lambda s: failure.reclaim(s, late.job, utcnow()))
    with service.db.transaction() as store:  # due and promoted at once: the worker's own
        # maintenance thread (every 0.05 s here) cannot promote and run it in between
        store.session.execute(update(Job).values(next_run_at=utcnow() - timedelta(seconds=1)))
        [due] = store.promote_due(utcnow(), 10)
    now_run = service.db.run(lambda s: claiming.claim_node(s, due.id, utcnow(), "b"))
    assert now_run is not None and now_run.job.try_number == late.job.try_number + 1

    # When the first worker's try ends after all, by a success or by a failure
    output = {"sum": -1}
    alone = service.db.autocommit(lambda s: success.complete_alone(s, late, output, utcnow(), 0.1))
    completed = service.db.run(
        lambda s: success.complete_node(s, late, output, utcnow(), 0.1)
    ).dispatches
    failed = service.db.run(lambda s: failure.fail_node(s, late, RuntimeError(), utcnow(), 0.1))

    # Then none of them settles the job: the second try still runs it, and its outcome is
    # the node's
    assert (alone, completed, failed.outcome) == (False, [], None)
    service.db.run(lambda s: success.complete_node(s, now_run, {"sum": 3}, utcnow(), 0.1))
    done = wait_for(service, made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"add": {"sum": 3}})
    with service.db.transaction() as store:
        [(_, attempts)] = store.execution_jobs(made.execution_id)
    assert [(a.worker, a.status.value) for a in attempts] == [("a", "failed"), ("b", "succeeded")]


STOPPED = NodeCancelled("node 'add' returned after it was told to stop")


def test_a_node_that_returned_after_a_stop_since_undone_runs_again_its_output_dropped(
    conveyor_service: Conveyor,
) -> None:
    # Given a node told to stop (it saw ctx.cancelled) whose execution runs again by the
    # time its try ends
    made, run = claimed(conveyor_service, "w")

    # When its try returns what it had when it stopped
    failed = conveyor_service.db.run(
        lambda s: failure.complete_stopped(s, run, {"sum": -1}, STOPPED, utcnow(), 0.1)
    )

    # Then the try counts as stopped and the node runs again to its end: the early output
    # is nobody's input
    assert failed is not None and failed.outcome is JobStatus.RETRY_WAIT
    conveyor_service.promote_due()
    done = wait_for(conveyor_service, made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"add": {"sum": 3}})
    with conveyor_service.db.transaction() as store:
        [(_, attempts)] = store.execution_jobs(made.execution_id)
    assert [a.status.value for a in attempts] == ["failed", "succeeded"]


def test_a_node_that_returned_after_a_stop_is_cancelled_its_output_kept_if_still_stopped(
    conveyor_service: Conveyor,
) -> None:
    made, run = claimed(conveyor_service, "w")
    conveyor_service.cancel(made.execution_id)

    failed = conveyor_service.db.run(
        lambda s: failure.complete_stopped(s, run, {"sum": -1}, STOPPED, utcnow(), 0.1)
    )

    assert failed is None
    with conveyor_service.db.transaction() as store:
        [node] = store.execution_nodes(made.execution_id)
        status = store.execution_row(made.execution_id).status
    assert (node.status.value, node.output, status) == (
        "cancelled",
        {"sum": -1},
        ExecutionStatus.CANCELLED,
    )


def test_a_worker_runs_again_a_node_that_stopped_early_on_a_stop_since_undone(
    conveyor_service: Conveyor,
) -> None:
    # Given a node whose first try sees ctx.cancelled and returns early, its execution
    # running on (as when a dead letter is requeued while the node ends)
    node = {"id": "n", "type": "python", "config": {"function": "test.stops_once"}}
    conveyor_service.apply(parse_workflow({"name": "stops-once", "nodes": [node]}))

    # When a worker runs it
    execution_id = conveyor_service.trigger("stops-once")
    deadline = time.monotonic() + 30
    while executions_running(conveyor_service, execution_id) and time.monotonic() < deadline:
        conveyor_service.promote_due()  # the stopped try's short wait, as the promoter does
        time.sleep(0.05)

    # Then its early output is not the node's: it ran again to its end
    done = wait_for(conveyor_service, execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"n": {"cancelled": False}})


def executions_running(service: Conveyor, execution_id: uuid.UUID) -> bool:
    with service.db.transaction() as store:
        return store.execution_row(execution_id).status is ExecutionStatus.RUNNING
