"""What a trigger writes, against real PostgreSQL: one statement (the execution with its node
states and first jobs), all or nothing, checking that the version it planned is still the
latest; a read of the tenant and its latest version first when the process has not seen
them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from conveyor.engine import triggering
from conveyor.engine.records import Created, ExecutionRecord, NewJob
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, Priority
from conveyor.engine.validation import parse_workflow
from conveyor.ids import new_id
from conveyor.models import Execution, Job, NodeState
from conveyor.service import Conveyor, utcnow
from tests.support.services import statements

CHAIN = {
    "name": "chain",
    "nodes": [
        {"id": "a", "type": "python", "config": {"function": "test.add"},
         "inputs": {"a": 1, "b": 2}},
        {"id": "b", "type": "python", "config": {"function": "test.add"}, "needs": ["a"],
         "inputs": {"a": 1, "b": 2}},
    ],
}  # fmt: skip


def trigger(service: Conveyor, **keys: Any) -> triggering.Triggered:
    return service.db.autocommit(
        lambda s: triggering.trigger(s, workflow_name="chain", tenant="default", input={"x": 1},
                                 now=utcnow(), **keys)
    )  # fmt: skip


def counts(service: Conveyor) -> tuple[int, int, int]:
    with service.db.transaction() as store:
        return tuple(  # type: ignore[return-value]
            store.session.scalar(select(func.count()).select_from(table))
            for table in (Execution, NodeState, Job)
        )


def test_a_trigger_is_one_statement(conveyor_service: Conveyor) -> None:
    conveyor_service.apply(parse_workflow(CHAIN))
    trigger(conveyor_service)  # the first reads the latest version (and parses it)

    with statements(conveyor_service) as sent:
        made = trigger(conveyor_service)

    assert len(sent) == 1, sent
    with conveyor_service.db.transaction() as store:
        execution = store.session.get(Execution, made.execution_id)
        nodes = {
            n.node_id: (n.status, n.waiting_on) for n in store.execution_nodes(made.execution_id)
        }
        ((job, _),) = store.execution_jobs(made.execution_id)
    assert execution is not None
    assert (execution.status, execution.remaining_nodes) == (ExecutionStatus.RUNNING, 2)
    assert execution.input == {"x": 1} and execution.started_at is not None
    assert nodes == {"a": (NodeStatus.QUEUED, 0), "b": (NodeStatus.PENDING, 1)}
    assert (job.node_id, job.status) == ("a", JobStatus.QUEUED)
    assert [d.job_id for d in made.dispatches] == [job.id]


def test_an_execution_whose_key_was_taken_meanwhile_writes_nothing(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(CHAIN))
    first = trigger(conveyor_service, idempotency_key="order-7")
    before = counts(conveyor_service)
    with conveyor_service.db.transaction() as store:
        stored = store.execution(first.execution_id)

    # A second insert with the same key (as a racing retry would make it, past the check)
    again = ExecutionRecord(
        id=new_id(), tenant_id=stored.tenant_id, workflow_id=stored.workflow_id,
        status=ExecutionStatus.RUNNING, priority=Priority.NORMAL, input={}, created_at=utcnow(),
    )  # fmt: skip
    created = conveyor_service.db.autocommit(
        lambda s: s.create_execution(
            again, names=("default", "chain"), trigger="api", now=utcnow(),
            idempotency_key="order-7",
            waiting_on={"a": 0, "b": 1}, queued=("a",),
            jobs=[NewJob(id=new_id(), node_id="a", max_retries=0)],
        )
    )  # fmt: skip

    assert created is Created.KEY_TAKEN
    assert counts(conveyor_service) == before  # no execution, node state or job of it
    # And the trigger itself answers with the first execution
    assert trigger(conveyor_service, idempotency_key="order-7").execution_id == first.execution_id


def test_a_tenant_is_made_once_outside_a_transaction_too(conveyor_service: Conveyor) -> None:
    made = conveyor_service.db.autocommit(lambda s: s.create_tenant("fresh"))
    again = conveyor_service.db.autocommit(lambda s: s.create_tenant("fresh"))
    assert made == again
    with conveyor_service.db.transaction() as store:
        assert store.tenant_id("fresh") == made


def test_a_version_applied_elsewhere_is_the_one_the_next_trigger_runs(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(CHAIN))
    first = trigger(conveyor_service)  # this process now knows version 1 as the latest
    # Another process applies version 2 (a third node): this one's cache knows nothing of it
    three = {**CHAIN, "nodes": [*CHAIN["nodes"], {**CHAIN["nodes"][1], "id": "c"}]}
    conveyor_service.db.run(
        lambda s: s.add_workflow_version(
            s.tenant_id("default"), "chain", parse_workflow(three).digest(),
            parse_workflow(three).model_dump(mode="json"), utcnow(),
        )
    )  # fmt: skip

    made = trigger(conveyor_service)

    with conveyor_service.db.transaction() as store:
        old, new = store.execution(first.execution_id), store.execution(made.execution_id)
        nodes = {n.node_id for n in store.execution_nodes(made.execution_id)}
        version = store.workflow(new.workflow_id).version
    assert new.workflow_id != old.workflow_id and version == 2
    assert nodes == {"a", "b", "c"}
