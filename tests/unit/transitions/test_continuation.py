"""A chain's next step claimed in the transaction of the success that made it ready
(conveyor.engine.claiming.claim_continuation): the worker runs it next, with no message, while
no job of a higher priority waits in its queue."""

from __future__ import annotations

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
