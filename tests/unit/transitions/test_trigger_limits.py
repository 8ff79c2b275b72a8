"""Per-trigger limits (conveyor.engine.trigger_limits): maximum attempts and a try's timeout
given by a trigger, stored with its execution, override the definition's for that run."""

from __future__ import annotations

import pytest

from conveyor.engine import due, trigger_limits, triggering
from conveyor.engine.records import Limits
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.exceptions import TriggerLimitError
from tests.support.bench import Bench, node

# The definition's: three attempts, a try's timeout of 300 s (the defaults)
FLAKY = (node("a"),)


def fail_twice(bench: Bench, limits: Limits | None) -> tuple[JobStatus | None, JobStatus | None]:
    """Trigger with ``limits``, fail node a's first two tries: each failure's outcome."""
    made = bench.trigger(bench.apply("flaky", *FLAKY).name, limits=limits)
    outcomes = []
    for _ in range(2):
        job = bench.job(made.execution_id, "a")
        if job.status is JobStatus.RETRY_WAIT:
            bench.clock.advance(3600)
            bench.units.run(lambda s: due.promote_due(s, bench.clock()))
        outcomes.append(bench.fail(bench.claim_node(made.execution_id, "a"),
                                   RuntimeError("not yet")).outcome)  # fmt: skip
    return outcomes[0], outcomes[1]


def test_a_triggers_max_attempts_overrides_the_definitions(bench: Bench) -> None:
    assert fail_twice(bench, Limits(max_attempts=2)) == (
        JobStatus.RETRY_WAIT, JobStatus.DEAD_LETTER,
    )  # fmt: skip


def test_without_limits_the_definitions_max_attempts_holds(bench: Bench) -> None:
    assert fail_twice(bench, None) == (JobStatus.RETRY_WAIT, JobStatus.RETRY_WAIT)


def test_a_triggers_limits_are_stored_with_its_execution_and_read_by_the_claim(
    bench: Bench,
) -> None:
    bench.apply("flaky", *FLAKY)
    given = bench.trigger("flaky", limits=Limits(max_attempts=5, timeout=2.5))
    plain = bench.trigger("flaky")

    run = bench.claim_node(given.execution_id, "a")

    assert run.execution.limits == Limits(max_attempts=5, timeout=2.5)
    assert run.timeout == 2.5
    assert bench.probe.execution(given.execution_id).max_attempts == 5
    assert bench.probe.execution(given.execution_id).timeout == 2.5
    assert bench.probe.execution(plain.execution_id).max_attempts is None
    # each node job's max_retries says what the retry decision will allow
    assert bench.job(given.execution_id, "a").max_retries == 4
    assert bench.job(plain.execution_id, "a").max_retries == 2
    plain_run = bench.claim_node(plain.execution_id, "a")
    assert (plain_run.execution.limits, plain_run.timeout) == (None, 300.0)


def test_a_large_executions_limits_reach_the_nodes_its_start_job_plans(bench: Bench) -> None:
    nodes = [node(f"r{i}") for i in range(triggering.INLINE_PLAN_NODES + 1)]
    bench.apply("wide", *nodes)
    made = bench.trigger("wide", limits=Limits(timeout=7.0))
    start = bench.job(made.execution_id, None)
    bench.units.run(lambda s: triggering.start_execution(s, start.id, bench.clock(), "planner"))

    run = bench.claim_node(made.execution_id, "r0")
    assert bench.job(made.execution_id, "r0").max_retries == 2  # the definition's 3 tries

    assert (run.timeout, bench.probe.execution(made.execution_id).status) == (
        7.0, ExecutionStatus.RUNNING,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("max_attempts", "timeout", "says"),
    [
        (0, None, "max_attempts input should be greater than or equal to 1"),
        (101, None, "max_attempts input should be less than or equal to 100"),
        (None, 0, "timeout input should be greater than 0"),
        (None, 86_401, "timeout input should be less than or equal to 86400"),
    ],
)
def test_limits_out_of_the_definitions_bounds_are_refused(
    max_attempts: int | None, timeout: float | None, says: str
) -> None:
    with pytest.raises(TriggerLimitError, match=says):
        trigger_limits.checked(max_attempts, timeout)


def test_limits_within_bounds_are_kept_and_none_given_is_none() -> None:
    assert trigger_limits.checked() is None
    assert trigger_limits.checked(100, 86_400) == Limits(max_attempts=100, timeout=86_400.0)
    assert trigger_limits.checked(None, 5) == Limits(timeout=5.0)
