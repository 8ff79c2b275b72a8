"""A newer input for an active execution with the same deduplication key, under the
workflow's dedupe policy (conveyor.engine.triggering): keep_first drops it, replace puts it in
place of a run not started, follow_up leaves one follow-up that starts when the active one
finishes."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest
from pydantic import ValidationError

from conveyor.engine import cancellation, triggering
from conveyor.engine.definitions import Workflow
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus, JobKind, Priority
from conveyor.engine.triggering import DedupeOutcome
from conveyor.exceptions import NonRetryableError
from conveyor.testing.tables import ExecutionRow
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"))
LARGE = (*(node(f"r{i}") for i in range(triggering.INLINE_PLAN_NODES)), node("sink", "r0"))


def policy(name: str) -> dict[str, object]:
    return {"dedupe": {"policy": name}}


def left(bench: Bench, input: object) -> dict[str, object]:
    """A follow-up's stored value: the input, left now (the test's clock)."""
    return {"input": input, "left_at": bench.clock().astimezone(UTC).isoformat()}


def finish_chain(bench: Bench, execution_id: uuid.UUID) -> list[Dispatch]:
    """Run a, then b: the execution completes; the messages its last step published."""
    bench.succeed(bench.claim_node(execution_id, "a"), {"a": 1})
    return bench.succeed(bench.claim_node(execution_id, "b"), {"b": 2})


def active(bench: Bench, first: uuid.UUID) -> ExecutionRow | None:
    """The active execution with the deduplication key "k", in the tenant of ``first``."""
    tenant_id = bench.probe.execution(first).tenant_id
    found = bench.units.autocommit(lambda s: s.active_by_dedupe(tenant_id, "k"))
    return None if found is None else bench.probe.execution(found[0])


def test_keep_first_answers_with_the_active_execution_and_drops_the_newer_input(
    bench: Bench,
) -> None:
    bench.apply("chain", *CHAIN)
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")

    again = bench.trigger("chain", {"v": 2}, dedupe_key="k")

    assert (again.execution_id, again.dedupe, again.replayed) == (
        first.execution_id, DedupeOutcome.DEDUPLICATED, True,
    )  # fmt: skip
    execution = bench.probe.execution(first.execution_id)
    assert (execution.input, execution.follow_up) == ({"v": 1}, None)
    assert first.dedupe is None


def test_replace_puts_the_latest_input_in_place_of_a_run_not_started(bench: Bench) -> None:
    bench.apply("chain", *CHAIN, **policy("replace"))
    later = bench.clock() + timedelta(minutes=5)
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k", run_at=later)

    answers = [bench.trigger("chain", {"v": v}, dedupe_key="k") for v in range(2, 11)]

    assert {(a.execution_id, a.dedupe) for a in answers} == {
        (first.execution_id, DedupeOutcome.REPLACED)
    }
    execution = bench.probe.execution(first.execution_id)
    assert (execution.status, execution.input, execution.follow_up) == (
        ExecutionStatus.PENDING, {"v": 10}, None,
    )  # fmt: skip


def test_replace_leaves_a_follow_up_once_the_run_has_started(bench: Bench) -> None:
    # A small workflow is planned by its trigger: running, its first node queued at once
    bench.apply("chain", *CHAIN, **policy("replace"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")

    again = bench.trigger("chain", {"v": 2}, dedupe_key="k")

    assert (again.execution_id, again.dedupe) == (first.execution_id, DedupeOutcome.FOLLOW_UP)
    execution = bench.probe.execution(first.execution_id)
    assert (execution.input, execution.follow_up) == ({"v": 1}, left(bench, {"v": 2}))


def test_replace_does_not_touch_a_run_whose_start_job_was_claimed(bench: Bench) -> None:
    # A large workflow gets a start job, which an execution worker claims to plan it
    bench.apply("large", *LARGE, **policy("replace"))
    first = bench.trigger("large", {"v": 1}, dedupe_key="k")
    start = bench.job(first.execution_id, None)
    assert bench.trigger("large", {"v": 2}, dedupe_key="k").dedupe is DedupeOutcome.REPLACED
    bench.units.autocommit(lambda s: s.claim_job(start.id, JobKind.EXECUTION, bench.clock()))

    again = bench.trigger("large", {"v": 3}, dedupe_key="k")

    assert again.dedupe is DedupeOutcome.FOLLOW_UP
    execution = bench.probe.execution(first.execution_id)
    assert (execution.input, execution.follow_up) == ({"v": 2}, left(bench, {"v": 3}))


def test_follow_up_keeps_only_the_latest_input_and_starts_it_when_the_active_one_completes(
    bench: Bench,
) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    answers = [bench.trigger("chain", {"v": v}, dedupe_key="k") for v in range(2, 11)]
    assert {(a.execution_id, a.dedupe) for a in answers} == {
        (first.execution_id, DedupeOutcome.FOLLOW_UP)
    }
    assert active(bench, first.execution_id).id == first.execution_id  # type: ignore[union-attr]

    published = finish_chain(bench, first.execution_id)

    assert bench.probe.execution(first.execution_id).status is ExecutionStatus.COMPLETED
    follow = active(bench, first.execution_id)
    assert follow is not None and follow.id != first.execution_id
    assert (follow.status, follow.input, follow.follow_up) == (
        ExecutionStatus.RUNNING, {"v": 10}, None,
    )  # fmt: skip
    (root,) = bench.probe.jobs(follow.id)
    assert [d.job_id for d in published] == [root.id]
    assert bench.probe.execution(first.execution_id).follow_up is None


def test_the_latest_follow_up_is_taken_once_with_the_time_it_was_left(bench: Bench) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k", priority=Priority.HIGH)
    bench.trigger("chain", {"v": 2}, dedupe_key="k")
    latest = bench.clock.advance(30)
    bench.trigger("chain", {"v": 3}, dedupe_key="k")

    taken = bench.units.run(lambda s: s.take_follow_up(first.execution_id))

    assert taken is not None
    assert (taken.input, taken.left_at, taken.dedupe_key, taken.priority) == (
        {"v": 3}, latest, "k", Priority.HIGH,
    )  # fmt: skip
    assert bench.units.run(lambda s: s.take_follow_up(first.execution_id)) is None
    assert bench.probe.execution(first.execution_id).follow_up is None


def test_a_trigger_after_the_follow_up_started_is_deduplicated_onto_it(bench: Bench) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    bench.trigger("chain", {"v": 2}, dedupe_key="k")
    finish_chain(bench, first.execution_id)
    follow = active(bench, first.execution_id)
    assert follow is not None and follow.id != first.execution_id

    again = bench.trigger("chain", {"v": 3}, dedupe_key="k")

    assert (again.execution_id, again.dedupe) == (follow.id, DedupeOutcome.FOLLOW_UP)
    assert bench.probe.execution(follow.id).follow_up == left(bench, {"v": 3})


def test_the_follow_up_keeps_the_priority_and_trigger_source_of_the_run_before_it(
    bench: Bench,
) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k", priority=Priority.LOW)
    bench.trigger("chain", {"v": 2}, dedupe_key="k", priority=Priority.HIGH)

    finish_chain(bench, first.execution_id)

    follow = active(bench, first.execution_id)
    assert follow is not None and follow.id != first.execution_id
    assert (follow.priority, follow.trigger) == (Priority.LOW, "api")


def test_follow_up_starts_when_the_active_execution_fails(bench: Bench) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    bench.trigger("chain", {"v": 2}, dedupe_key="k")

    failed = bench.fail(bench.claim_node(first.execution_id, "a"), NonRetryableError("bad"))

    assert bench.probe.execution(first.execution_id).status is ExecutionStatus.FAILED
    follow = active(bench, first.execution_id)
    assert follow is not None and follow.id != first.execution_id
    assert (follow.status, follow.input) == (ExecutionStatus.RUNNING, {"v": 2})
    assert [d.job_id for d in failed.dispatches] == [j.id for j in bench.probe.jobs(follow.id)]


def test_a_cancelled_execution_drops_its_follow_up(bench: Bench) -> None:
    bench.apply("chain", *CHAIN, **policy("follow_up"))
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    bench.trigger("chain", {"v": 2}, dedupe_key="k")

    bench.units.run(lambda s: cancellation.cancel_execution(s, first.execution_id, bench.clock()))

    assert active(bench, first.execution_id) is None


def test_keep_first_completes_without_looking_for_a_follow_up(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    bench.trigger("chain", {"v": 2}, dedupe_key="k")

    assert finish_chain(bench, first.execution_id) == []
    assert active(bench, first.execution_id) is None


def test_a_follow_up_policy_applied_while_a_keep_first_run_is_active_leaves_no_follow_up(
    bench: Bench,
) -> None:
    # Given a run of a keep_first version, then a follow_up version applied
    bench.apply("chain", *CHAIN)
    first = bench.trigger("chain", {"v": 1}, dedupe_key="k")
    bench.apply("chain", *CHAIN, description="v2", **policy("follow_up"))
    bench.trigger("chain", {"v": 0}, dedupe_key="other")  # v2 is now the latest known here

    again = bench.trigger("chain", {"v": 2}, dedupe_key="k")

    # Then the active run's version decides (its finish would never start a follow-up)
    assert again.dedupe is DedupeOutcome.DEDUPLICATED
    assert bench.probe.execution(first.execution_id).follow_up is None


def test_an_unknown_dedupe_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationError, match=r"keep_first.*replace.*follow_up"):
        Workflow.model_validate({"name": "w", "nodes": [node("a")], **policy("latest")})
