"""Outcomes a node chooses (conveyor.engine.outcomes): a snooze waits as a retry waits without
spending an attempt, up to max_snoozes in a row; a node cancels its execution."""

from __future__ import annotations

from datetime import timedelta

from conveyor.engine import cancellation, due, outcomes
from conveyor.engine.claiming import NodeRun
from conveyor.engine.failure import Failed
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import CancelExecution, Skip, Snooze
from tests.support.bench import Bench, node

ONCE = {"retry": {"max_attempts": 1}}


def _snooze(bench: Bench, run: NodeRun, seconds: float, reason: str = "not synced") -> Failed:
    return bench.units.run(
        lambda s: outcomes.snooze_node(s, run, Snooze(seconds, reason), bench.clock(), 0.01)
    )


def _again(bench: Bench) -> NodeRun:
    (published,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    return bench.claimed(published.job_id)


def test_a_snooze_waits_in_the_database_without_spending_an_attempt(bench: Bench) -> None:
    made = bench.trigger(bench.apply("ledger", node("a"), defaults=ONCE).name)
    run = bench.claim_node(made.execution_id, "a")

    failed = _snooze(bench, run, 30)

    assert (failed.outcome, failed.retry_in, failed.snoozed) == (JobStatus.RETRY_WAIT, 30, True)
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.retry_count, job.next_run_at, job.last_error) == (
        JobStatus.RETRY_WAIT, 0, bench.clock() + timedelta(seconds=30), None,
    )  # fmt: skip
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.error) == (NodeStatus.QUEUED, None)
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.SNOOZED, "not synced")

    # Not due yet: nothing promoted; when due, the next try is still attempt 1
    assert bench.units.run(lambda s: due.promote_due(s, bench.clock())) == []
    bench.clock.advance(30)
    second = _again(bench)
    assert (second.attempt, second.job.try_number) == (1, 2)


def test_a_node_snoozing_five_times_then_succeeding_spends_one_attempt(bench: Bench) -> None:
    made = bench.trigger(bench.apply("ledger", node("a"), defaults=ONCE).name)
    run = bench.claim_node(made.execution_id, "a")
    for _ in range(5):
        assert _snooze(bench, run, 5).outcome is JobStatus.RETRY_WAIT
        bench.clock.advance(5)
        run = _again(bench)

    bench.succeed(run, {"synced": True})

    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED
    job = bench.job(made.execution_id, "a")
    statuses = [a.status for a in bench.probe.attempts(job.id)]
    assert statuses == [AttemptStatus.SNOOZED] * 5 + [AttemptStatus.SUCCEEDED]


def test_past_max_snoozes_in_a_row_the_node_fails_with_a_clear_error(bench: Bench) -> None:
    made = bench.trigger(bench.apply("ledger", node("a", max_snoozes=2), defaults=ONCE).name)
    run = bench.claim_node(made.execution_id, "a")
    for _ in range(2):
        _snooze(bench, run, 1)
        bench.clock.advance(1)
        run = _again(bench)

    failed = _snooze(bench, run, 1)

    assert failed.outcome is JobStatus.DEAD_LETTER
    job = bench.job(made.execution_id, "a")
    assert job.last_error is not None
    assert "snoozed 2 time(s) in a row, its max_snoozes" in job.last_error
    assert "raise max_snoozes" in job.last_error
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED


def test_the_bound_counts_snoozes_in_a_row_a_failed_try_starts_it_again(bench: Bench) -> None:
    retry = {"retry": {"max_attempts": 2, "backoff": 1, "jitter": 0}}
    made = bench.trigger(bench.apply("ledger", node("a", max_snoozes=1), defaults=retry).name)
    run = bench.claim_node(made.execution_id, "a")
    _snooze(bench, run, 1)
    bench.clock.advance(1)
    run = _again(bench)
    assert bench.fail(run, RuntimeError("flaky")).outcome is JobStatus.RETRY_WAIT
    bench.clock.advance(1)
    run = _again(bench)

    assert _snooze(bench, run, 1).outcome is JobStatus.RETRY_WAIT  # one in a row again
    assert run.attempt == 2


def test_a_snooze_after_the_execution_was_cancelled_ends_the_node_cancelled(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("ledger", node("a"), defaults=ONCE).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    assert _snooze(bench, run, 5).outcome is JobStatus.CANCELLED
    assert bench.job(made.execution_id, "a").status is JobStatus.CANCELLED


def test_a_node_cancelling_its_execution_cancels_its_successors_and_dead_letters_nothing(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply(
        "export", node("a"), node("busy"), node("after", "a"), defaults=ONCE,
    ).name)  # fmt: skip
    run = bench.claim_node(made.execution_id, "a")
    bench.claim_node(made.execution_id, "busy")

    failed = bench.units.run(
        lambda s: outcomes.cancel_from_node(
            s, run, CancelExecution("the document was deleted"), bench.clock(), 0.01
        )
    )

    assert failed.outcome is JobStatus.CANCELLED
    execution = bench.probe.execution(made.execution_id)
    reason = "cancelled by node 'a': the document was deleted"
    assert (execution.status, execution.error) == (ExecutionStatus.CANCELLED, reason)
    assert bench.statuses(made.execution_id) == {
        "a": "cancelled", "busy": "running", "after": "cancelled",
    }  # fmt: skip
    a = bench.probe.nodes(made.execution_id)["a"]
    assert a.error == reason
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.last_error) == (JobStatus.CANCELLED, reason)
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.CANCELLED, reason)
    assert not [j for j in bench.probe.jobs(made.execution_id) if j.status is JobStatus.DEAD_LETTER]


def test_a_node_skipping_itself_settles_skipped_and_a_join_with_another_need_runs(
    bench: Bench,
) -> None:
    # Given a → b (only a), and a join of a and c
    made = bench.trigger(bench.apply(
        "export", node("a"), node("c"), node("b", "a"), node("join", "a", "c"), defaults=ONCE,
    ).name)  # fmt: skip
    run = bench.claim_node(made.execution_id, "a")
    bench.succeed(bench.claim_node(made.execution_id, "c"), {"c": 1})

    failed = bench.units.run(
        lambda s: outcomes.skip_node(s, run, Skip("nothing changed"), bench.clock(), 0.01)
    )

    # Then a is skipped, b (all its needs skipped) too, and the join is queued
    assert (failed.outcome, failed.skipped) == (JobStatus.COMPLETED, True)
    assert [d.node for d in failed.dispatches] == ["join"]
    assert bench.statuses(made.execution_id) == {
        "a": "skipped", "c": "completed", "b": "skipped", "join": "queued",
    }  # fmt: skip
    job = bench.job(made.execution_id, "a")
    assert (job.status, job.last_error) == (JobStatus.COMPLETED, None)
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.SKIPPED, "nothing changed")
    bench.succeed(bench.claim_node(made.execution_id, "join"), {"joined": True})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED


def test_a_node_cancelling_an_execution_that_failed_meanwhile_leaves_it_failed(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("export", node("a"), node("b"), defaults=ONCE).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.fail(bench.claim_node(made.execution_id, "b"), RuntimeError("down"))

    failed = bench.units.run(
        lambda s: outcomes.cancel_from_node(s, run, CancelExecution("gone"), bench.clock(), 0.01)
    )

    assert failed.outcome is JobStatus.CANCELLED
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED
    assert bench.statuses(made.execution_id) == {"a": "cancelled", "b": "failed"}
