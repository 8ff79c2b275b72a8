"""The store port's contracts for executions and node states (Catalog, Executions, NodeStates
in conveyor.engine.ports), method by method: what each changes, and that it changes nothing
from a status it does not expect."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import Created, ExecutionRecord, Finish, NewJob, NodeRow
from conveyor.engine.states import (
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
)
from conveyor.exceptions import ExecutionNotFound, StoreError, TenantNotFound
from conveyor.ids import new_id
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"))
JOIN = (node("a"), node("b"), node("c", "a", "b"))


def record(bench: Bench, workflow: Any) -> ExecutionRecord:
    return ExecutionRecord(
        id=new_id(), tenant_id=workflow.tenant_id, workflow_id=workflow.id,
        status=ExecutionStatus.RUNNING, priority=Priority.HIGH, input={"x": 1},
        created_at=bench.clock(),
    )  # fmt: skip


def create(bench: Bench, execution: ExecutionRecord, names: tuple[str, str] = ("default", "chain"),
           **values: Any) -> Created:  # fmt: skip
    return bench.units.autocommit(
        lambda s: s.create_execution(
            execution, names=names, trigger="api", now=bench.clock(), **values
        )
    )


def planned(**values: Any) -> dict[str, Any]:
    return {"waiting_on": {"a": 0, "b": 1}, "queued": ("a",), **values}


# -- create_execution ------------------------------------------------------------------------


def test_create_execution_stores_a_planned_execution_with_its_states_and_first_jobs(
    bench: Bench,
) -> None:
    execution = record(bench, bench.apply("chain", *CHAIN))
    job_id = new_id()

    made = create(bench, execution, **planned(jobs=[NewJob(id=job_id, node_id="a", max_retries=2)]))

    assert made is Created.CREATED
    stored = bench.probe.execution(execution.id)
    assert (stored.status, stored.remaining_nodes, stored.input) == (
        ExecutionStatus.RUNNING, 2, {"x": 1},
    )  # fmt: skip
    assert stored.started_at == bench.clock() and stored.trigger == "api"
    nodes = bench.probe.nodes(execution.id)
    assert {n: (r.status, r.waiting_on) for n, r in nodes.items()} == {
        "a": (NodeStatus.QUEUED, 0), "b": (NodeStatus.PENDING, 1),
    }  # fmt: skip
    (job,) = bench.probe.jobs(execution.id)
    assert (job.id, job.kind, job.queue, job.status, job.node_id) == (
        job_id, JobKind.NODE, NODE_QUEUE, JobStatus.QUEUED, "a",
    )  # fmt: skip
    assert (job.priority, job.max_retries, job.enqueued_at) == (Priority.HIGH, 2, bench.clock())


def test_create_execution_without_a_plan_stores_it_pending_with_its_start_job(
    bench: Bench,
) -> None:
    execution = record(bench, bench.apply("chain", *CHAIN))
    start = new_id()

    assert create(bench, execution, start_job=start) is Created.CREATED

    stored = bench.probe.execution(execution.id)
    assert (stored.status, stored.remaining_nodes, stored.started_at) == (
        ExecutionStatus.PENDING, 0, None,
    )  # fmt: skip
    assert bench.probe.nodes(execution.id) == {}
    (job,) = bench.probe.jobs(execution.id)
    assert (job.id, job.kind, job.queue, job.status, job.node_id, job.max_retries) == (
        start, JobKind.EXECUTION, EXECUTION_QUEUE, JobStatus.QUEUED, None, 0,
    )  # fmt: skip


def test_create_execution_of_a_version_that_is_not_the_latest_stores_nothing(
    bench: Bench,
) -> None:
    first = bench.apply("chain", *CHAIN)
    bench.apply("chain", *CHAIN, node("c", "b"))  # version 2
    before = bench.probe.counts()

    jobs = [NewJob(id=new_id(), node_id="a", max_retries=0)]
    made = create(bench, record(bench, first), **planned(jobs=jobs))

    assert made is Created.STALE
    assert bench.probe.counts() == before


def test_create_execution_named_for_another_tenant_is_stale(bench: Bench) -> None:
    workflow = bench.apply("chain", *CHAIN)
    bench.apply("chain", *CHAIN, tenant="other")  # the same name, another tenant's version
    before = bench.probe.counts()

    assert create(bench, record(bench, workflow), ("other", "chain")) is Created.STALE
    assert bench.probe.counts() == before


def test_create_execution_named_for_a_tenant_that_does_not_exist_is_stale(bench: Bench) -> None:
    workflow = bench.apply("chain", *CHAIN)
    before = bench.probe.counts()

    assert create(bench, record(bench, workflow), ("ghost", "chain")) is Created.STALE
    assert bench.probe.counts() == before


def test_an_idempotency_key_makes_one_execution_whatever_its_status(bench: Bench) -> None:
    workflow = bench.apply("chain", *CHAIN)
    first = record(bench, workflow)
    assert create(bench, first, **planned(idempotency_key="order-7")) is Created.CREATED
    bench.units.run(
        lambda s: s.finish_execution(first.id, ExecutionStatus.COMPLETED, bench.clock())
    )
    before = bench.probe.counts()

    again = create(bench, record(bench, workflow), **planned(
        idempotency_key="order-7", jobs=[NewJob(id=new_id(), node_id="a", max_retries=0)],
    ))  # fmt: skip

    assert again is Created.KEY_TAKEN
    assert bench.probe.counts() == before
    with bench.store() as store:
        assert store.execution_by_key(workflow.tenant_id, "order-7") == (first.id, "chain")
        assert store.execution_by_key(workflow.tenant_id, "order-8") is None


def test_a_deduplication_key_is_taken_only_while_its_execution_is_active(bench: Bench) -> None:
    workflow = bench.apply("chain", *CHAIN)
    first = record(bench, workflow)
    assert create(bench, first, **planned(dedupe_key="nightly")) is Created.CREATED
    with bench.store() as store:
        assert store.active_by_dedupe(workflow.tenant_id, "nightly") == (first.id, "chain")

    assert create(bench, record(bench, workflow), **planned(dedupe_key="nightly")) is (
        Created.KEY_TAKEN
    )
    bench.units.run(lambda s: s.finish_execution(first.id, ExecutionStatus.FAILED, bench.clock()))
    with bench.store() as store:
        assert store.active_by_dedupe(workflow.tenant_id, "nightly") is None
    assert create(bench, record(bench, workflow), **planned(dedupe_key="nightly")) is (
        Created.CREATED
    )


# -- reads -------------------------------------------------------------------------------------


def test_an_unknown_execution_is_not_found_and_has_no_status(bench: Bench) -> None:
    missing = new_id()
    with bench.store() as store:
        with pytest.raises(ExecutionNotFound) as raised:
            store.execution(missing)
        assert store.execution_status(missing) is None
        assert store.execution_status(missing, lock=True) is None
    assert str(raised.value) == (
        f"no execution has id {missing}; list them with `conveyor executions list`"
    )


def test_an_unknown_tenant_is_not_found_but_the_default_one_is_made_on_first_use(
    bench: Bench,
) -> None:
    with bench.store() as store:
        with pytest.raises(TenantNotFound) as raised:
            store.tenant_id("acme")
        with pytest.raises(TenantNotFound):
            store.trigger_target("acme", "chain")
        assert store.tenant_named("default") is None  # a read by name makes nothing
        made = store.tenant_id("default")
    with bench.store() as store:
        assert store.tenant_id("default") == made
        assert store.tenant_named("default") == made
        assert store.tenant_named("acme") is None
        assert store.trigger_target("default", "nothing") == (made, None)
    assert str(raised.value) == (
        "no tenant is named 'acme'; create it with `conveyor tenants create acme`"
    )


def test_each_applied_change_is_a_new_version_and_the_latest_is_found(bench: Bench) -> None:
    first = bench.apply("chain", *CHAIN)
    assert bench.apply("chain", *CHAIN) == first  # unchanged: no new version
    second = bench.apply("chain", *CHAIN, node("c", "b"))
    other = bench.apply("solo", node("a"))

    assert (first.version, second.version) == (1, 2)
    with bench.store() as store:
        assert store.latest_workflow(first.tenant_id, "chain") == second
        assert store.workflow(first.id) == first
        assert store.trigger_target("default", "chain") == (first.tenant_id, second.id)
        keys = {(first.tenant_id, "chain"), (first.tenant_id, "solo"), (first.tenant_id, "none")}
        assert store.latest_workflows(keys) == {
            (first.tenant_id, "chain"): second, (first.tenant_id, "solo"): other,
        }  # fmt: skip


# -- node states -------------------------------------------------------------------------------


def test_node_rows_read_outputs_only_when_asked(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    bench.units.run(lambda s: s.set_node(
        made.execution_id, "a", NodeStatus.COMPLETED, output={"n": 1}, branch="if_true",
        error="an earlier try failed", finished_at=bench.clock(),
    ))  # fmt: skip

    with bench.store() as store:
        full = store.node_rows(made.execution_id, ["a", "b", "nope"])
        lean = store.node_rows(made.execution_id, ["a"], outputs=False)
        none = store.node_rows(made.execution_id, [])

    assert full == {
        "a": NodeRow(node_id="a", status=NodeStatus.COMPLETED, branch="if_true",
                     output={"n": 1}, error="an earlier try failed"),
        "b": NodeRow(node_id="b", status=NodeStatus.PENDING),
    }  # fmt: skip
    assert lean == {"a": NodeRow(node_id="a", status=NodeStatus.COMPLETED, branch="if_true")}
    assert none == {}


def test_decrement_waiting_counts_down_each_node_once_and_refuses_unknown_ones(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    with bench.store() as store:
        assert store.decrement_waiting(made.execution_id, ["c", "c"]) == {"c": 1}
    before = bench.rows(made.execution_id)

    with pytest.raises(StoreError) as raised:
        bench.units.run(lambda s: s.decrement_waiting(made.execution_id, ["c", "x", "y"]))

    assert str(raised.value) == (f"nodes ['x', 'y'] have no state in execution {made.execution_id}")
    assert bench.rows(made.execution_id) == before  # the unit of work rolled back


def test_queue_nodes_queues_only_pending_nodes(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    bench.units.run(lambda s: s.set_node(made.execution_id, "a", NodeStatus.RUNNING))

    bench.units.run(lambda s: s.queue_nodes(made.execution_id, ["a", "b"]))

    assert bench.statuses(made.execution_id) == {"a": "running", "b": "queued"}


def test_a_failed_unit_of_work_leaves_no_trace(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    before, counts = bench.rows(made.execution_id), bench.probe.counts()

    def work(store: Any) -> None:
        store.set_node(made.execution_id, "b", NodeStatus.SKIPPED, finished_at=bench.clock())
        store.cancel_unstarted(made.execution_id, bench.clock())
        store.create_tenant("fresh")
        raise RuntimeError("the caller's error")

    with pytest.raises(RuntimeError):
        bench.units.run(work)

    assert bench.rows(made.execution_id) == before
    assert bench.probe.counts() == counts
    with bench.store() as store, pytest.raises(TenantNotFound):
        store.tenant_id("fresh")


# -- executions --------------------------------------------------------------------------------


def test_start_execution_starts_a_pending_execution_once(bench: Bench) -> None:
    execution = record(bench, bench.apply("chain", *CHAIN))
    create(bench, execution, start_job=new_id())

    assert bench.units.run(lambda s: s.start_execution(execution.id, 2, bench.clock()))
    assert not bench.units.run(lambda s: s.start_execution(execution.id, 5, bench.clock()))

    stored = bench.probe.execution(execution.id)
    assert (stored.status, stored.remaining_nodes) == (ExecutionStatus.RUNNING, 2)


def test_settle_nodes_counts_down_and_completes_the_execution_only_when_last(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    finish = Finish(output={"done": True}, now=bench.clock())

    assert bench.units.run(lambda s: s.settle_nodes(made.execution_id, 1, finish)) == 1
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING
    assert bench.units.run(lambda s: s.settle_nodes(made.execution_id, 1, finish)) == 0

    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output, done.finished_at) == (
        ExecutionStatus.COMPLETED, {"done": True}, bench.clock(),
    )  # fmt: skip
    assert bench.units.run(lambda s: s.settle_nodes(made.execution_id, 1)) is None


def test_settle_nodes_without_finish_leaves_the_last_settle_to_the_caller(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)

    assert bench.units.run(lambda s: s.settle_nodes(made.execution_id, 1)) == 0

    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING


def test_finish_execution_finishes_an_active_execution_once(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)

    def finish(status: ExecutionStatus, **values: Any) -> bool:
        return bench.units.run(
            lambda s: s.finish_execution(made.execution_id, status, bench.clock(), **values)
        )

    assert finish(ExecutionStatus.FAILED, error="node a failed")
    assert not finish(ExecutionStatus.COMPLETED, output={"late": 1})

    stored = bench.probe.execution(made.execution_id)
    assert (stored.status, stored.error, stored.output) == (
        ExecutionStatus.FAILED, "node a failed", None,
    )  # fmt: skip


def test_cancel_unstarted_cancels_waiting_work_and_returns_its_node_jobs(bench: Bench) -> None:
    # Given nodes running (a), queued (b), parked for a permit (p), waiting for a retry (c),
    # and pending (d)
    made = bench.trigger(bench.apply(
        "five", node("a"), node("b"), node("p"), node("c"), node("d", "a"),
        defaults={"retry": {"max_attempts": 3, "jitter": 0}},
    ).name)  # fmt: skip
    bench.claim_node(made.execution_id, "a")
    parked = bench.job(made.execution_id, "p").id
    assert bench.units.run(lambda s: s.transition_job(parked, JobStatus.QUEUED, JobStatus.PARKED))
    bench.fail(bench.claim_node(made.execution_id, "c"), RuntimeError("flaky"))
    jobs = bench.jobs(made.execution_id)
    assert jobs["c"].status is JobStatus.RETRY_WAIT

    with bench.store() as store:
        returned = store.cancel_unstarted(made.execution_id, bench.clock())

    assert sorted(returned) == sorted([jobs["b"].id, jobs["p"].id, jobs["c"].id])
    after = bench.jobs(made.execution_id)
    assert {n: j.status for n, j in after.items()} == {
        "a": JobStatus.PROCESSING, "b": JobStatus.CANCELLED, "p": JobStatus.CANCELLED,
        "c": JobStatus.CANCELLED,
    }  # fmt: skip
    assert after["b"].completed_at == bench.clock()
    assert bench.statuses(made.execution_id) == {
        "a": "running", "b": "cancelled", "p": "cancelled", "c": "cancelled", "d": "cancelled",
    }  # fmt: skip


def test_cancel_unstarted_cancels_a_start_job_but_returns_only_node_jobs(bench: Bench) -> None:
    execution = record(bench, bench.apply("chain", *CHAIN))
    create(bench, execution, start_job=new_id())

    with bench.store() as store:
        assert store.cancel_unstarted(execution.id, bench.clock()) == []

    (job,) = bench.probe.jobs(execution.id)
    assert job.status is JobStatus.CANCELLED
