"""What a node message's Celery task reports once its jobs' outcomes are committed: the state
Flower shows (conveyor.tasks.report). Raising is how a task reaches RETRY or FAILURE; the
acceptance test test_flower checks them in Flower itself."""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import Retry

from conveyor.config import Settings
from conveyor.engine.states import JobStatus
from conveyor.exceptions import DeadLettered, Snoozed, TryFailed, TryReclaimed
from conveyor.service.workers import Ran
from conveyor.tasks import report, run_many, run_node
from conveyor.tasks.app import create_app


def ran(
    node: str,
    outcome: JobStatus | None,
    error: str = "",
    retry_in: float | None = None,
    reclaimed: bool = False,
) -> Ran:
    return Ran(job_id=uuid.uuid4(), outcome=outcome, workflow="orders", node=node, error=error,
               retry_in=retry_in, reclaimed=reclaimed)  # fmt: skip


def test_a_job_that_completed_or_did_not_run_here_is_a_success_that_says_so() -> None:
    assert report([ran("charge", JobStatus.COMPLETED)]) == "completed"
    assert report([ran("charge", None)]).startswith("dropped")
    assert report([ran("charge", JobStatus.PARKED)]).startswith("parked")
    assert report([ran("a", JobStatus.COMPLETED), ran("b", JobStatus.CANCELLED)]) == (
        "orders/a: completed; orders/b: cancelled: its execution was stopped"
    )


def test_a_dead_letter_is_a_failure_whose_message_is_the_nodes_error() -> None:
    with pytest.raises(DeadLettered) as raised:
        report([ran("charge", JobStatus.DEAD_LETTER, "RuntimeError: declined")])
    assert str(raised.value) == "RuntimeError: declined"


def test_a_try_to_be_retried_is_a_retry_around_the_nodes_error_and_publishes_nothing() -> None:
    with pytest.raises(Retry) as raised:
        report([ran("charge", JobStatus.RETRY_WAIT, "RuntimeError: busy", retry_in=2.0)])
    assert str(raised.value) == "tried again in 2.0s: RuntimeError: busy"
    assert isinstance(raised.value.exc, TryFailed)
    assert str(raised.value.exc) == "RuntimeError: busy"
    assert raised.value.sig is None  # raised, not self.retry(): no message to send


def test_a_snoozed_try_is_a_retry_around_a_snooze_not_a_failure() -> None:
    snoozed = Ran(
        job_id=uuid.uuid4(), outcome=JobStatus.RETRY_WAIT, workflow="ledger", node="post",
        error="snoozed for 30s: not synced", retry_in=30.0, snoozed=True,
    )  # fmt: skip
    with pytest.raises(Retry) as raised:
        report([snoozed])
    assert str(raised.value) == "runs again in 30.0s: snoozed for 30s: not synced"
    assert isinstance(raised.value.exc, Snoozed)
    # Beside a try that failed, the message is a failed try's retry
    with pytest.raises(Retry) as raised:
        report([snoozed, ran("b", JobStatus.RETRY_WAIT, "RuntimeError: busy", retry_in=1.0)])
    assert isinstance(raised.value.exc, TryFailed)


def test_a_node_that_cancelled_its_execution_or_skipped_is_a_success_that_says_why() -> None:
    cancelled = Ran(
        job_id=uuid.uuid4(), outcome=JobStatus.CANCELLED, workflow="export", node="render",
        error="cancelled by the node: the document was deleted", by_node=True,
    )  # fmt: skip
    assert report([cancelled]) == "cancelled by the node: the document was deleted"
    skipped = Ran(
        job_id=uuid.uuid4(), outcome=JobStatus.COMPLETED, workflow="digest", node="check",
        error="skipped by the node: nothing changed", by_node=True,
    )  # fmt: skip
    assert report([skipped]) == "skipped by the node: nothing changed"


def test_a_packed_message_shows_its_worst_job_naming_each_that_failed() -> None:
    jobs = [
        ran("a", JobStatus.COMPLETED),
        ran("b", JobStatus.RETRY_WAIT, "RuntimeError: busy", retry_in=1.0),
        ran("c", JobStatus.DEAD_LETTER, "RuntimeError: declined"),
    ]
    with pytest.raises(DeadLettered, match=r"^orders/c: RuntimeError: declined$"):
        report(jobs)
    with pytest.raises(Retry, match=r"orders/b: RuntimeError: busy"):
        report(jobs[:2])


def test_a_failed_try_whose_job_recovery_reclaimed_is_a_failure_not_a_dropped_message() -> None:
    # the try ran and failed; recovery had taken its job meanwhile and runs it again
    with pytest.raises(TryReclaimed) as raised:
        report([ran("charge", None, "RuntimeError: declined", reclaimed=True)])
    assert str(raised.value) == "failed; its job was reclaimed by recovery: RuntimeError: declined"
    with pytest.raises(TryReclaimed, match=r"reclaimed by recovery: orders/b: RuntimeError: x$"):
        report([ran("a", None), ran("b", None, "RuntimeError: x", reclaimed=True)])
    assert report([ran("charge", None)]).startswith("dropped")  # a message that ran nothing


def test_the_app_acks_a_node_message_whose_task_raised_the_state_flower_shows() -> None:
    # The node task raises DeadLettered, TryReclaimed or Retry after the outcome is committed:
    # create_app sets the ack on failure itself rather than trusting Celery's default.
    changed = create_app(Settings()).conf.table(with_defaults=False)
    assert changed["task_acks_late"] is True
    assert changed["task_acks_on_failure_or_timeout"] is True
    for task in (run_node, run_many):  # expected failures: logged without a traceback
        assert {DeadLettered, TryReclaimed} <= set(task.throws)
