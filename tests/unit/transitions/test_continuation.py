"""A chain's next step claimed in the transaction of the success that made it ready
(conveyor.engine.claiming.claim_continuation): the worker runs it next, with no message, while
no job of a higher priority waits in its queue."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conveyor.engine import claiming, success
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import AfterCommit
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobStatus,
    NodeStatus,
    Priority,
)
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"), node("c", "b"))


def _continue(bench: Bench, run: claiming.NodeRun, output: object) -> tuple[
    AfterCommit, claiming.NodeRun | None
]:  # fmt: skip
    """A success and, in its transaction, the claim of the one step it made ready."""

    def record(store: Any) -> tuple[AfterCommit, claiming.NodeRun | None]:
        after = success.complete_node(store, run, output, bench.clock(), 0.01)
        step = success.continuation(after, NODE_QUEUE)
        assert step is not None, after
        return after, claiming.claim_continuation(store, step, bench.clock(), "tester")

    return bench.units.run(record)


def test_a_success_claims_the_chains_next_step_in_its_own_transaction(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name, {"x": 7})
    a = bench.claim_node(made.execution_id, "a")

    _, b = _continue(bench, a, {"n": 1})

    assert b is not None
    assert (b.node.id, b.attempt, b.job.status) == ("b", 1, JobStatus.PROCESSING)
    assert b.context["nodes"] == {"a": {"n": 1}}
    assert b.context["input"] == {"x": 7}
    # every node keeps its job and try rows, as a claim from a message makes them
    (attempt,) = bench.probe.attempts(b.job.id)
    assert (attempt.status, attempt.worker) == (AttemptStatus.RUNNING, "tester")
    nodes = bench.probe.nodes(made.execution_id)
    assert (nodes["a"].status, nodes["b"].status) == (NodeStatus.COMPLETED, NodeStatus.RUNNING)
    assert bench.job(made.execution_id, "a").status is JobStatus.COMPLETED


def test_a_chain_runs_to_its_end_by_continuations_alone(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")
    _, b = _continue(bench, a, 1)
    assert b is not None
    _, c = _continue(bench, b, 2)
    assert c is not None

    assert bench.succeed(c, 3) == []

    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED
    assert bench.statuses(made.execution_id) == {
        "a": "completed",
        "b": "completed",
        "c": "completed",
    }
    for node_id in "abc":
        (attempt,) = bench.probe.attempts(bench.job(made.execution_id, node_id).id)
        assert attempt.status is AttemptStatus.SUCCEEDED


def test_no_continuation_while_a_job_of_higher_priority_waits_in_the_queue(bench: Bench) -> None:
    chain = bench.apply("chain", *CHAIN).name
    made = bench.trigger(chain, priority=Priority.NORMAL)
    urgent = bench.trigger(chain, priority=Priority.HIGH)  # its first job waits, queued
    a = bench.claim_node(made.execution_id, "a")

    after, b = _continue(bench, a, 1)

    assert b is None
    # the step's message is published as any other's, its job queued and untouched
    (published,) = after.dispatches
    job = bench.job(made.execution_id, "b")
    assert (published.job_id, job.status) == (job.id, JobStatus.QUEUED)
    assert bench.probe.attempts(job.id) == []
    assert bench.job(urgent.execution_id, "a").status is JobStatus.QUEUED


def test_a_job_of_the_same_or_lower_priority_does_not_stop_a_continuation(bench: Bench) -> None:
    chain = bench.apply("chain", *CHAIN).name
    made = bench.trigger(chain, priority=Priority.NORMAL)
    bench.trigger(chain, priority=Priority.NORMAL)
    bench.trigger(chain, priority=Priority.LOW)
    a = bench.claim_node(made.execution_id, "a")

    _, b = _continue(bench, a, 1)

    assert b is not None and b.node.id == "b"


def test_a_step_whose_job_was_taken_meanwhile_is_not_claimed_again(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")
    (step,) = bench.complete(a, 1)
    bench.claimed(step.job_id)  # its message's worker took it

    assert bench.units.run(lambda s: claiming.claim_continuation(s, step, bench.clock())) is None

    assert len(bench.probe.attempts(step.job_id)) == 1


# A chain's step in one unit (success.chain_step + success.complete_step: PostgreSQL's one
# statement, the other adapters' parts in turn), run as the service runs it: autocommit.


def _step(
    bench: Bench, run: claiming.NodeRun, output: object, *, claim: bool = True
) -> tuple[AfterCommit, claiming.NodeRun | None] | None:
    def record(store: Any) -> tuple[AfterCommit, claiming.NodeRun | None] | None:
        now = bench.clock()
        step = success.chain_step(run, output, now, claim=claim)
        assert step is not None, "not a chain's step"
        return success.complete_step(store, run, output, now, 0.01, step, "tester")

    return bench.units.autocommit(record)


def _decided(bench: Bench, run: claiming.NodeRun, output: object) -> success.Step | None:
    return success.chain_step(run, output, bench.clock(), claim=True)


def test_a_chain_step_records_the_success_and_claims_the_next_node_at_once(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name, {"x": 7})
    a = bench.claim_node(made.execution_id, "a")

    stepped = _step(bench, a, {"n": 1, "t": (1, 2)})

    assert stepped is not None
    after, b = stepped
    assert after.dispatches == [] and b is not None
    assert (b.node.id, b.attempt, b.job.status) == ("b", 1, JobStatus.PROCESSING)
    # what b reads is what was stored (JSON), as a claim from a message reads it
    assert b.context["nodes"] == {"a": {"n": 1, "t": [1, 2]}}
    assert b.context["input"] == {"x": 7}
    rows = bench.rows(made.execution_id)
    assert rows.execution.remaining_nodes == 2
    assert (rows.nodes["a"].status, rows.nodes["b"].status) == (
        NodeStatus.COMPLETED,
        NodeStatus.RUNNING,
    )
    assert rows.nodes["b"].waiting_on == 0 and rows.nodes["b"].started_at is not None
    assert rows.nodes["a"].output == {"n": 1, "t": [1, 2]}
    assert rows.jobs["a"].status is JobStatus.COMPLETED
    (a_try,) = rows.attempts[rows.jobs["a"].id]
    assert a_try.status is AttemptStatus.SUCCEEDED
    (b_try,) = rows.attempts[b.job.id]
    assert (b_try.status, b_try.worker, b_try.attempt_number) == (
        AttemptStatus.RUNNING,
        "tester",
        1,
    )
    assert (rows.jobs["b"].status, rows.jobs["b"].priority) == (
        JobStatus.PROCESSING,
        rows.jobs["a"].priority,
    )


def test_a_chain_runs_to_its_end_by_steps_alone(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    run = bench.claim_node(made.execution_id, "a")
    for output in (1, 2):
        stepped = _step(bench, run, output)
        assert stepped is not None and stepped[1] is not None
        run = stepped[1]
    assert run.node.id == "c" and run.context["nodes"] == {"b": 2}

    assert bench.succeed(run, 3) == []

    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.remaining_nodes) == (ExecutionStatus.COMPLETED, 0)
    assert set(bench.statuses(made.execution_id).values()) == {"completed"}


def test_a_step_not_to_claim_queues_the_next_job_for_its_message(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")

    stepped = _step(bench, a, 1, claim=False)

    assert stepped is not None
    after, b = stepped
    job = bench.job(made.execution_id, "b")
    assert b is None and [d.job_id for d in after.dispatches] == [job.id]
    assert job.status is JobStatus.QUEUED and bench.probe.attempts(job.id) == []
    assert bench.statuses(made.execution_id) == {
        "a": "completed",
        "b": "queued",
        "c": "pending",
    }
    # its message's worker claims it as any other
    assert bench.claimed(job.id).context["nodes"] == {"a": 1}


def test_a_step_leaves_its_next_job_queued_while_a_higher_priority_waits(bench: Bench) -> None:
    chain = bench.apply("chain", *CHAIN).name
    made = bench.trigger(chain, priority=Priority.LOW)
    bench.trigger(chain, priority=Priority.NORMAL)  # its first job waits, queued
    a = bench.claim_node(made.execution_id, "a")

    stepped = _step(bench, a, 1)

    assert stepped is not None
    after, b = stepped
    assert b is None and [d.job_id for d in after.dispatches] == [
        bench.job(made.execution_id, "b").id
    ]
    assert bench.job(made.execution_id, "b").status is JobStatus.QUEUED
    assert bench.job(made.execution_id, "a").status is JobStatus.COMPLETED


def test_a_step_whose_try_was_taken_over_changes_nothing(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")
    before = bench.rows(made.execution_id)
    stale = claiming.NodeRun(**{**a.__dict__, "job": replace(a.job, retry_count=1)})

    assert _step(bench, stale, 1) is None

    assert bench.rows(made.execution_id) == before


def test_a_step_in_a_cancelled_execution_changes_nothing(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")
    bench.units.run(
        lambda s: s.finish_execution(made.execution_id, ExecutionStatus.CANCELLED, bench.clock())
    )
    before = bench.rows(made.execution_id)

    assert _step(bench, a, 1) is None

    assert bench.rows(made.execution_id) == before


def test_a_step_whose_next_node_settled_otherwise_changes_nothing(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: s.set_node(made.execution_id, "b", NodeStatus.SKIPPED))
    before = bench.rows(made.execution_id)

    assert _step(bench, a, 1) is None

    assert bench.rows(made.execution_id) == before


def test_only_a_chains_shape_makes_a_step(bench: Bench) -> None:
    shapes = {
        "fan": (node("a"), node("b", "a"), node("c", "a")),
        "join": (node("a"), node("z"), node("b", "a", "z")),
        "delay": (node("a"), node("b", "a", type="delay", config={"seconds": 5})),
        "map": (node("a"), node("b", "a", map={"over": "{{ nodes.a }}"})),
        "last": (node("a"),),
    }
    for name, nodes in shapes.items():
        made = bench.trigger(bench.apply(name, *nodes).name)
        a = bench.claim_node(made.execution_id, "a")
        assert _decided(bench, a, [1]) is None, name
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    step = _decided(bench, bench.claim_node(made.execution_id, "a"), 1)
    assert step is not None and (step.job.node_id, step.dispatch.node) == ("b", "b")
