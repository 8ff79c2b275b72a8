"""What a node message's Celery task reports once its jobs' outcomes are committed: the state
Flower shows (conveyor.tasks.report). Raising is how a task reaches RETRY or FAILURE; the
acceptance test test_flower checks them in Flower itself."""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import Retry

from conveyor.engine.states import JobStatus
from conveyor.exceptions import DeadLettered, TryFailed
from conveyor.service.workers import Ran
from conveyor.tasks import report


def ran(
    node: str, outcome: JobStatus | None, error: str = "", retry_in: float | None = None
) -> Ran:
    return Ran(job_id=uuid.uuid4(), outcome=outcome, workflow="orders", node=node, error=error,
               retry_in=retry_in)  # fmt: skip


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
