"""A node job's claim (conveyor.engine.claiming): once per job, its try started, the node given
its needs' outputs; a job whose execution finished is cancelled instead of run."""

from __future__ import annotations

from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"))


def test_a_claim_starts_the_try_and_gives_the_node_its_needs_outputs(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name, {"x": 7})
    (published,) = bench.complete(bench.claim_node(made.execution_id, "a"), {"n": 1})

    run = bench.claimed(published.job_id)

    assert (run.node.id, run.attempt, run.job.status) == ("b", 1, JobStatus.PROCESSING)
    assert run.context["nodes"] == {"a": {"n": 1}}
    assert run.context["input"] == {"x": 7}
    assert run.context["execution"]["id"] == str(made.execution_id)
    (attempt,) = bench.probe.attempts(run.job.id)
    assert (attempt.attempt_number, attempt.status, attempt.worker) == (
        1, AttemptStatus.RUNNING, "tester",
    )  # fmt: skip
    # the job's queue and workflow version, which the metrics group tries by
    assert (attempt.queue, attempt.workflow_id) == (run.job.queue, run.job.workflow_id)
    assert attempt.queue == "workflow-node"
    assert bench.probe.nodes(made.execution_id)["b"].status is NodeStatus.RUNNING


def test_a_claim_hinted_with_its_node_reads_the_same_outputs(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    (published,) = bench.complete(bench.claim_node(made.execution_id, "a"), {"n": 1})
    assert published.hints is not None and published.hints.node_id == "b"

    run = bench.claimed(published.job_id, published.hints)

    assert run.context["nodes"] == {"a": {"n": 1}}


def test_a_message_delivered_twice_claims_the_job_once(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    (published,) = made.dispatches
    bench.claimed(published.job_id)
    before = bench.rows(made.execution_id)

    assert bench.claim(published.job_id, published.hints) is None

    assert bench.rows(made.execution_id) == before


def test_a_job_of_an_execution_that_finished_is_cancelled_at_its_claim(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    bench.units.run(
        lambda s: s.finish_execution(made.execution_id, ExecutionStatus.FAILED, bench.clock())
    )

    assert bench.claim(made.dispatches[0].job_id) is None

    job = bench.job(made.execution_id, "a")
    assert (job.status, job.completed_at) == (JobStatus.CANCELLED, bench.clock())
    assert bench.probe.attempts(job.id) == []
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.finished_at) == (NodeStatus.CANCELLED, bench.clock())
