"""How a node's success is recorded, against real PostgreSQL: a node that makes no successor
ready is settled by one statement (and its execution completed, when it was the last and
its output makes the execution's); every other case takes the transaction, which still
completes the execution in its settle when the outputs in hand are all its output reads."""

from __future__ import annotations

import uuid
from typing import Any

from conveyor.engine import cancellation, claiming, success, triggering
from conveyor.engine.records import Dispatch, NodeHints
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution
from conveyor.service import Conveyor, utcnow
from tests.support.services import statements


def add(node_id: str, needs: list[str] | None = None, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": "test.add"},
            "needs": needs or [], "inputs": {"a": 1, "b": 2, **inputs}}  # fmt: skip


def triggered(service: Conveyor, name: str, nodes: list[dict[str, Any]], **extra: Any) -> Any:
    """An execution of a new workflow, planned by its trigger and not published: the test
    claims and records its nodes itself."""
    service.apply(parse_workflow({"name": name, "nodes": nodes, **extra}))
    return service.db.run(
        lambda s: triggering.trigger(s, workflow_name=name, tenant="default", input={"x": 7},
                                 now=utcnow(), source=TriggerSource.API)
    )  # fmt: skip


def claim(service: Conveyor, job_id: uuid.UUID, hints: NodeHints | None = None) -> claiming.NodeRun:
    run = service.db.autocommit(lambda s: claiming.claim_node(s, job_id, utcnow(), "tester", hints))
    assert run is not None
    return run


def queued_job(service: Conveyor, execution_id: uuid.UUID, node_id: str) -> uuid.UUID:
    with service.db.transaction() as store:
        pairs = store.execution_jobs(execution_id)
    (job_id,) = [job.id for job, _ in pairs if job.node_id == node_id]
    return job_id


def alone(service: Conveyor, run: claiming.NodeRun, output: Any) -> bool:
    return service.db.autocommit(lambda s: success.complete_alone(s, run, output, utcnow(), 0.01))


def complete(service: Conveyor, run: claiming.NodeRun, output: Any) -> list[Dispatch]:
    return service.db.run(
        lambda s: success.complete_node(s, run, output, utcnow(), 0.01)
    ).dispatches


def execution(service: Conveyor, execution_id: uuid.UUID) -> Execution:
    with service.db.transaction() as store:
        row = store.session.get(Execution, execution_id)
        assert row is not None
        store.session.expunge(row)
        return row


def test_a_lone_node_is_recorded_and_its_execution_completed_by_one_statement(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(conveyor_service, "lone", [add("only")])
    run = claim(conveyor_service, made.dispatches[0].job_id)

    with statements(conveyor_service) as sent:
        assert alone(conveyor_service, run, {"sum": 3})

    assert len(sent) == 1, sent  # and in autocommit: no BEGIN or COMMIT round trip
    done = execution(conveyor_service, made.execution_id)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == {"only": {"sum": 3}}
    assert done.finished_at is not None
    with conveyor_service.db.transaction() as store:
        ((job, attempts),) = store.execution_jobs(made.execution_id)
        (node,) = store.execution_nodes(made.execution_id)
    assert job.status is JobStatus.COMPLETED and job.completed_at is not None
    assert [a.status.value for a in attempts] == ["succeeded"]
    assert node.status is NodeStatus.COMPLETED and node.output == {"sum": 3}


def test_the_output_template_of_a_lone_node_is_rendered_by_the_one_statement(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(
        conveyor_service, "templated", [add("only")],
        output={"total": "{{ nodes.only.sum + input.x }}"},
    )  # fmt: skip
    run = claim(conveyor_service, made.dispatches[0].job_id)

    assert alone(conveyor_service, run, {"sum": 3})

    assert execution(conveyor_service, made.execution_id).output == {"total": 10}


def test_a_chain_settles_each_node_and_the_last_completes_the_execution(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(conveyor_service, "chain", [add("first"), add("second", ["first"])])
    first = claim(conveyor_service, made.dispatches[0].job_id)

    assert not alone(conveyor_service, first, {"sum": 3})  # something waits on it
    assert execution(conveyor_service, made.execution_id).remaining_nodes == 2  # unchanged
    complete(conveyor_service, first, {"sum": 3})
    assert execution(conveyor_service, made.execution_id).remaining_nodes == 1

    second = claim(conveyor_service, queued_job(conveyor_service, made.execution_id, "second"))
    assert second.context["nodes"]["first"] == {"sum": 3}
    assert alone(conveyor_service, second, {"sum": 4})

    done = execution(conveyor_service, made.execution_id)
    assert (done.status, done.remaining_nodes) == (ExecutionStatus.COMPLETED, 0)
    assert done.output == {"second": {"sum": 4}}


def test_two_sinks_take_the_transaction_and_the_last_reads_the_others_output(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(conveyor_service, "two", [add("a"), add("b")])
    a, b = (claim(conveyor_service, d.job_id) for d in made.dispatches)

    # The execution's output reads both sinks: not computable from one node's output.
    assert not alone(conveyor_service, a, {"sum": 1})
    complete(conveyor_service, a, {"sum": 1})
    running = execution(conveyor_service, made.execution_id)
    assert (running.status, running.remaining_nodes) == (ExecutionStatus.RUNNING, 1)
    assert not alone(conveyor_service, b, {"sum": 2})
    complete(conveyor_service, b, {"sum": 2})

    done = execution(conveyor_service, made.execution_id)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == {"a": {"sum": 1}, "b": {"sum": 2}}


def test_a_sink_of_a_cancelled_execution_changes_nothing_in_one_statement(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(conveyor_service, "cancelled", [add("only")])
    run = claim(conveyor_service, made.dispatches[0].job_id)
    conveyor_service.db.run(lambda s: cancellation.cancel_execution(s, made.execution_id, utcnow()))

    assert not alone(conveyor_service, run, {"sum": 3})
    with conveyor_service.db.transaction() as store:
        ((job, _),) = store.execution_jobs(made.execution_id)
    assert job.status is JobStatus.PROCESSING  # untouched: the general path decides

    complete(conveyor_service, run, {"sum": 3})
    done = execution(conveyor_service, made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.CANCELLED, None)
    with conveyor_service.db.transaction() as store:
        ((job, _),) = store.execution_jobs(made.execution_id)
        (node,) = store.execution_nodes(made.execution_id)
    assert job.status is JobStatus.CANCELLED
    assert node.status is NodeStatus.CANCELLED and node.output == {"sum": 3}


def node_state(service: Conveyor, execution_id: uuid.UUID, node_id: str) -> Any:
    with service.db.transaction() as store:
        (found,) = [n for n in store.execution_nodes(execution_id) if n.node_id == node_id]
    return found


def test_a_fan_out_member_that_leaves_the_join_waiting_is_one_statement(
    conveyor_service: Conveyor,
) -> None:
    made = triggered(
        conveyor_service, "fan", [add("root"), add("a", ["root"]), add("b", ["root"]),
                                  add("join", ["a", "b"])],
    )  # fmt: skip
    root = claim(conveyor_service, made.dispatches[0].job_id)
    assert not alone(conveyor_service, root, {"sum": 3})  # it makes a and b ready
    members = {d.hints.node_id: d for d in complete(conveyor_service, root, {"sum": 3})}  # type: ignore[union-attr]
    # A member's claim, hinted, reads its need's output in the same statement
    with statements(conveyor_service) as sent:
        a = claim(conveyor_service, members["a"].job_id, members["a"].hints)
    assert len(sent) == 1, sent
    assert a.context["nodes"] == {"root": {"sum": 3}}
    b = claim(conveyor_service, members["b"].job_id)  # no hints: read after the claim
    assert b.context["nodes"] == {"root": {"sum": 3}}

    # The first member: the join still waits on the other, so one statement does it all
    with statements(conveyor_service) as sent:
        assert alone(conveyor_service, a, {"sum": 4})
    assert len(sent) == 1, sent
    assert node_state(conveyor_service, made.execution_id, "a").status is NodeStatus.COMPLETED
    assert node_state(conveyor_service, made.execution_id, "join").waiting_on == 1
    assert execution(conveyor_service, made.execution_id).remaining_nodes == 2

    # The second makes the join ready: the transaction enqueues it
    assert not alone(conveyor_service, b, {"sum": 5})
    assert node_state(conveyor_service, made.execution_id, "b").status is NodeStatus.RUNNING
    complete(conveyor_service, b, {"sum": 5})
    join = claim(conveyor_service, queued_job(conveyor_service, made.execution_id, "join"))
    assert join.context["nodes"] == {"a": {"sum": 4}, "b": {"sum": 5}}
    assert alone(conveyor_service, join, {"sum": 9})

    done = execution(conveyor_service, made.execution_id)
    assert (done.status, done.remaining_nodes) == (ExecutionStatus.COMPLETED, 0)
    assert done.output == {"join": {"sum": 9}}
