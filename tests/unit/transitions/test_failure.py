"""A node's failed try (conveyor.engine.failure): retried after its backoff, or dead-lettered
and its execution failed (or gone on without it); a try that ended after its execution was
stopped; a lost worker's try reclaimed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from conveyor.engine import cancellation, dead_letters, due, failure
from conveyor.engine.claiming import NodeRun
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import NodeCancelled, NonRetryableError
from tests.support.bench import Bench, node

# Three tries, 10 s then 20 s apart, no jitter
RETRY = {"retry": {"max_attempts": 3, "backoff": 10, "factor": 2, "jitter": 0}}


def test_a_retryable_failure_waits_its_backoff_then_runs_again(bench: Bench) -> None:
    made = bench.trigger(bench.apply("flaky", node("a"), defaults=RETRY).name)
    run = bench.claim_node(made.execution_id, "a")

    failed = bench.fail(run, RuntimeError("flaky"))

    assert (failed.outcome, failed.retry_in, failed.dispatches) == (JobStatus.RETRY_WAIT, 10, [])
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.retry_count, job.next_run_at, job.last_error) == (
        JobStatus.RETRY_WAIT, 1, bench.clock() + timedelta(seconds=10), "RuntimeError: flaky",
    )  # fmt: skip
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.error) == (NodeStatus.QUEUED, "RuntimeError: flaky")
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.FAILED, "RuntimeError: flaky")

    # When its time comes, it is published and its second try fails too: twice the wait
    bench.clock.advance(10)
    (published,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    second = bench.claimed(published.job_id)
    assert second.attempt == 2
    assert bench.fail(second, RuntimeError("flaky")).retry_in == 20
    assert [a.attempt_number for a in bench.probe.attempts(job.id)] == [1, 2]


def test_a_failure_that_is_not_retryable_dead_letters_the_job_and_fails_the_execution(
    bench: Bench,
) -> None:
    # Given a failing node beside a running one, a queued one and one waiting on it
    made = bench.trigger(bench.apply(
        "broken", node("a"), node("busy"), node("idle"), node("after", "a"), defaults=RETRY,
    ).name)  # fmt: skip
    run = bench.claim_node(made.execution_id, "a")
    bench.claim_node(made.execution_id, "busy")

    failed = bench.fail(run, NonRetryableError("bad input"))

    assert (failed.outcome, failed.retry_in) == (JobStatus.DEAD_LETTER, None)
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.last_error) == (
        JobStatus.DEAD_LETTER, "bad input (the error is not retryable)",
    )  # fmt: skip
    execution = bench.probe.execution(made.execution_id)
    assert (execution.status, execution.error) == (
        ExecutionStatus.FAILED, "node 'a' failed after 1 attempt(s): bad input",
    )  # fmt: skip
    assert bench.statuses(made.execution_id) == {
        "a": "failed", "busy": "running", "idle": "cancelled", "after": "cancelled",
    }  # fmt: skip
    assert bench.job(made.execution_id, "idle").status is JobStatus.CANCELLED
    assert bench.job(made.execution_id, "busy").status is JobStatus.PROCESSING


def test_the_last_try_of_a_retryable_failure_dead_letters_the_job(bench: Bench) -> None:
    once = {"retry": {"max_attempts": 1}}
    made = bench.trigger(bench.apply("once", node("a"), defaults=once).name)

    failed = bench.fail(bench.claim_node(made.execution_id, "a"), RuntimeError("down"))

    assert failed.outcome is JobStatus.DEAD_LETTER
    assert bench.job(made.execution_id, "a").last_error == (
        "RuntimeError: down (all 1 attempt(s) failed)"
    )
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED


def test_a_node_that_continues_on_failure_settles_failed_and_the_execution_goes_on(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply(
        "tolerant", node("a", continue_on_failure=True), node("b", "a"),
    ).name)  # fmt: skip

    failed = bench.fail(bench.claim_node(made.execution_id, "a"), NonRetryableError("meh"))

    assert failed.outcome is JobStatus.DEAD_LETTER
    (published,) = failed.dispatches
    assert bench.statuses(made.execution_id) == {"a": "failed", "b": "queued"}
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING
    bench.succeed(bench.claimed(published.job_id), {"n": 1})
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"b": {"n": 1}})


def test_a_failure_after_the_execution_was_cancelled_cancels_the_job(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", node("a"), node("b", "a"), defaults=RETRY).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    failed = bench.fail(run, RuntimeError("stopped midway"))

    assert failed.outcome is JobStatus.CANCELLED
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.last_error) == (JobStatus.CANCELLED, "RuntimeError: stopped midway")
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.error) == (NodeStatus.CANCELLED, "RuntimeError: stopped midway")
    assert [a.status for a in bench.probe.attempts(job.id)] == [AttemptStatus.FAILED]
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.CANCELLED


def stopped(bench: Bench, run: NodeRun, output: Any) -> failure.Failed | None:
    error = NodeCancelled("returned after it was told to stop")
    return bench.units.run(
        lambda s: failure.complete_stopped(s, run, output, error, bench.clock(), 0.1)
    )


def test_a_node_that_stopped_for_a_cancel_is_cancelled_with_its_output_kept(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    assert stopped(bench, run, {"partial": True}) is None

    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.output) == (NodeStatus.CANCELLED, {"partial": True})
    assert bench.job(made.execution_id, "a").status is JobStatus.CANCELLED


def test_a_node_that_stopped_for_a_cancel_since_undone_runs_again(bench: Bench) -> None:
    # Given a node still running when its sibling's failure failed the execution
    made = bench.trigger(bench.apply("pair", node("a"), node("b")).name)
    running = bench.claim_node(made.execution_id, "b")
    bench.fail(bench.claim_node(made.execution_id, "a"), NonRetryableError("bad"))
    # When the dead letter is requeued (the execution runs again) before the node returns
    dead = bench.job(made.execution_id, "a").id
    bench.units.run(lambda s: dead_letters.requeue(s, dead, None, bench.clock()))

    failed = stopped(bench, running, {"partial": True})

    # Then its try counts as stopped, not failed: it runs again at once, its output dropped
    assert failed is not None
    assert (failed.outcome, failed.retry_in) == (JobStatus.RETRY_WAIT, 0.001)
    b = bench.probe.nodes(made.execution_id)["b"]
    assert (b.status, b.output) == (NodeStatus.QUEUED, None)


def test_a_lost_workers_try_fails_and_the_retry_policy_decides(bench: Bench) -> None:
    made = bench.trigger(bench.apply("lost", node("a"), defaults=RETRY).name)
    run = bench.claim_node(made.execution_id, "a")

    failed = bench.units.run(lambda s: failure.reclaim(s, run.job, bench.clock()))

    assert (failed.outcome, failed.retry_in) == (JobStatus.RETRY_WAIT, 10)
    (attempt,) = bench.probe.attempts(run.job.id)
    assert (attempt.status, attempt.error) == (
        AttemptStatus.FAILED, "the worker running it stopped sending heartbeats",
    )  # fmt: skip


def test_a_lost_workers_late_outcome_leaves_the_job_to_the_try_that_runs_it_now(
    bench: Bench,
) -> None:
    # Given a try reclaimed as lost, and the job's next try running
    made = bench.trigger(bench.apply("lost", node("a"), defaults=RETRY).name)
    lost = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: failure.reclaim(s, lost.job, bench.clock()))
    bench.clock.advance(10)
    (published,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    current = bench.claimed(published.job_id)
    before = bench.rows(made.execution_id)

    # When the lost try reports after all, success or failure
    assert not bench.alone(lost, {"late": True})
    assert bench.complete(lost, {"late": True}) == []
    assert bench.fail(lost, RuntimeError("late")).outcome is None

    # Then nothing changed but the lost try's attempt row (its failure recorded again)
    after = bench.rows(made.execution_id)
    assert (after.execution, after.nodes, after.jobs) == (before.execution, before.nodes,
                                                          before.jobs)  # fmt: skip
    assert bench.alone(current, {"n": 1})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_failed_trys_traceback_is_kept_with_its_error_and_a_never_raised_one_has_none(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("traced", node("a"), defaults=RETRY).name)
    job = bench.job(made.execution_id, "a")

    bench.fail(bench.claim_node(made.execution_id, "a"), _raised(RuntimeError("traced")))
    bench.clock.advance(10)
    (published,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    bench.fail(bench.claimed(published.job_id), RuntimeError("never raised"))

    first, second = bench.probe.attempts(job.id)
    assert first.traceback is not None and first.error == "RuntimeError: traced"
    assert first.traceback.startswith("Traceback (most recent call last):")
    assert first.traceback.rstrip().endswith("RuntimeError: traced")
    assert second.traceback is None
