"""Reruns of a finished execution from a node (conveyor.engine.reruns), and the Store methods
they stand on (tests/contract runs these cases on every adapter)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from conveyor.engine import cancellation, dead_letters, due, reruns
from conveyor.engine.records import NewJob
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import (
    DuplicateExecution,
    ExecutionNotFound,
    InvalidTransition,
    NonRetryableError,
    RerunError,
)
from conveyor.ids import new_id
from tests.support.bench import Bench, condition, node
from tests.unit.transitions.test_mapping import expand, item_run, items, own_job

NO_RETRY = {"retry": {"max_attempts": 1}}
DIAMOND = (node("a"), node("b", "a"), node("c", "a"), node("d", "b", "c"))


def rerun(
    bench: Bench,
    execution_id: uuid.UUID,
    from_node: str,
    input: dict[str, Any] | None = None,
    tenant_id: uuid.UUID | None = None,
) -> reruns.Rerun:
    return bench.units.run(
        lambda s: reruns.rerun(
            s, execution_id, from_node, requested_by="cli:tester", now=bench.clock(),
            input=input, tenant_id=tenant_id,
        )
    )  # fmt: skip


def failed_diamond(bench: Bench) -> uuid.UUID:
    """A diamond whose middle node b died (c completed, d never started)."""
    made = bench.trigger(bench.apply("diamond", *DIAMOND).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"a": 1})
    bench.succeed(bench.claim_node(made.execution_id, "c"), {"c": 3})
    bench.fail(bench.claim_node(made.execution_id, "b"), NonRetryableError("bad b"))
    return made.execution_id


def test_a_rerun_from_a_middle_node_of_a_failed_diamond_runs_it_and_downstream_only(
    bench: Bench,
) -> None:
    execution_id = failed_diamond(bench)
    assert bench.statuses(execution_id) == {
        "a": "completed", "b": "failed", "c": "completed", "d": "cancelled",
    }  # fmt: skip
    b_job = bench.job(execution_id, "b").id
    bench.clock.advance(5)

    done = rerun(bench, execution_id, "b")

    # Then b is queued again on its own job, d waits for it; a and c keep their outputs
    assert (done.nodes, done.queued) == (["b", "d"], ["b"])
    assert [d.job_id for d in done.dispatches] == [b_job]
    execution = bench.probe.execution(execution_id)
    assert (execution.status, execution.error, execution.remaining_nodes, execution.reruns) == (
        ExecutionStatus.RUNNING, None, 2, 1,
    )  # fmt: skip
    assert bench.statuses(execution_id) == {
        "a": "completed", "b": "queued", "c": "completed", "d": "pending",
    }  # fmt: skip
    assert bench.probe.nodes(execution_id)["d"].waiting_on == 1
    assert bench.probe.nodes(execution_id)["c"].output == {"c": 3}
    b = bench.claimed(b_job)
    assert (b.attempt, b.job.try_number) == (1, 2)  # a fresh set of tries, numbered on
    assert b.context["nodes"] == {"a": {"a": 1}}
    (d,) = bench.succeed(b, {"b": 2})
    d_run = bench.claimed(d.job_id)
    assert d_run.context["nodes"] == {"b": {"b": 2}, "c": {"c": 3}}
    bench.succeed(d_run, {"d": 4})
    finished = bench.probe.execution(execution_id)
    assert (finished.status, finished.output) == (ExecutionStatus.COMPLETED, {"d": {"d": 4}})
    assert [(t.attempt_number, t.status.value) for t in bench.probe.attempts(b_job)] == [
        (1, "failed"), (2, "succeeded"),
    ]  # fmt: skip
    assert len(bench.probe.attempts(bench.job(execution_id, "a").id)) == 1
    assert len(bench.probe.attempts(bench.job(execution_id, "c").id)) == 1


def test_a_rerun_of_a_completed_execution_from_its_root_runs_every_node_on_its_own_job(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("chain", node("a"), node("b", "a")).name)
    (b,) = bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    bench.succeed(bench.claimed(b.job_id), {"n": 2})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED
    jobs = {n: bench.job(made.execution_id, n).id for n in ("a", "b")}

    done = rerun(bench, made.execution_id, "a")

    assert done.nodes == ["a", "b"]
    held = bench.job(made.execution_id, "b")
    assert (held.status, held.tries_before, held.retry_count) == (JobStatus.HELD, 1, 0)
    assert bench.statuses(made.execution_id) == {"a": "queued", "b": "pending"}
    assert bench.probe.execution(made.execution_id).output is None
    a = bench.claimed(jobs["a"])
    (b_again,) = bench.succeed(a, {"n": 10})
    assert b_again.job_id == jobs["b"]  # its held job, not a new one
    b_run = bench.claimed(b_again.job_id)
    assert b_run.job.try_number == 2
    bench.succeed(b_run, {"n": 20})
    finished = bench.probe.execution(made.execution_id)
    assert (finished.status, finished.output) == (ExecutionStatus.COMPLETED, {"b": {"n": 20}})
    assert len(bench.probe.jobs(made.execution_id)) == 2
    for job_id in jobs.values():
        assert [t.attempt_number for t in bench.probe.attempts(job_id)] == [1, 2]


def test_a_rerun_input_takes_the_place_of_the_nodes_rendered_inputs(bench: Bench) -> None:
    execution_id = failed_diamond(bench)

    done = rerun(bench, execution_id, "b", input={"x": 5})

    b = bench.claimed(done.dispatches[0].job_id)
    assert b.inputs == {"x": 5}
    (d,) = bench.succeed(b, {"b": 2})
    assert bench.claimed(d.job_id).inputs is None  # only the rerun's node


def test_a_rerun_input_holds_for_a_requeue_of_its_node_until_a_later_rerun_from_another(
    bench: Bench,
) -> None:
    execution_id = failed_diamond(bench)
    b_job = rerun(bench, execution_id, "b", input={"x": 5}).dispatches[0].job_id
    bench.fail(bench.claimed(b_job), NonRetryableError("still bad"))
    bench.units.run(lambda s: dead_letters.requeue(s, b_job, None, bench.clock()))

    b = bench.claimed(b_job)
    assert b.inputs == {"x": 5}  # the same rerun: its input still
    bench.fail(b, NonRetryableError("bad again"))

    done = rerun(bench, execution_id, "a")
    assert done.nodes == ["a", "b", "c", "d"]
    (a_job,) = [d.job_id for d in done.dispatches]
    dispatched = bench.succeed(bench.claimed(a_job), {"a": 2})
    b_again = next(d for d in dispatched if d.node == "b")
    assert bench.claimed(b_again.job_id).inputs is None


def test_a_dead_letter_of_a_rerun_is_requeued_and_the_held_downstream_job_runs_after_it(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("chain3", node("a"), node("b", "a"), node("c", "b")).name)
    (b,) = bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    (c,) = bench.succeed(bench.claimed(b.job_id), {"n": 2})
    bench.succeed(bench.claimed(c.job_id), {"n": 3})

    (b_again,) = rerun(bench, made.execution_id, "b").dispatches
    bench.fail(bench.claimed(b_again.job_id), NonRetryableError("bad"))
    assert bench.statuses(made.execution_id) == {
        "a": "completed", "b": "failed", "c": "cancelled",
    }  # fmt: skip
    assert bench.job(made.execution_id, "c").status is JobStatus.HELD  # not cancelled: held
    (requeued,) = bench.units.run(
        lambda s: dead_letters.requeue(s, b_again.job_id, None, bench.clock())
    )
    (c_again,) = bench.succeed(bench.claimed(requeued.job_id), {"n": 20})

    assert c_again.job_id == c.job_id
    bench.succeed(bench.claimed(c.job_id), {"n": 30})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED
    assert [t.attempt_number for t in bench.probe.attempts(b.job_id)] == [1, 2, 3]


def test_a_rerun_decides_the_skips_downstream_anew(bench: Bench) -> None:
    # Given a condition on its inputs that took its true branch, the false one skipped
    check = condition("check", if_true=["yes"], if_false=["no"])
    check["config"]["expression"] = "inputs.go"
    check["inputs"] = {"go": "{{ input.go }}"}
    made = bench.trigger(
        bench.apply("branches", check, node("yes", "check"), node("no", "check")).name,
        {"go": True},
    )
    (yes,) = bench.succeed(bench.claim_node(made.execution_id, "check"), {"branch": "if_true"})
    bench.succeed(bench.claimed(yes.job_id), {"n": 1})
    assert bench.statuses(made.execution_id)["no"] == "skipped"

    # When it runs again from the condition, which takes the other branch this time
    (again,) = rerun(bench, made.execution_id, "check", input={"go": False}).dispatches
    assert bench.statuses(made.execution_id) == {
        "check": "queued", "yes": "pending", "no": "pending",
    }  # fmt: skip
    run = bench.claimed(again.job_id)
    assert run.inputs == {"go": False}
    (no,) = bench.succeed(run, {"branch": "if_false"})

    # Then the true branch is skipped, the false one runs
    assert bench.statuses(made.execution_id) == {
        "check": "completed", "yes": "skipped", "no": "queued",
    }  # fmt: skip
    bench.succeed(bench.claimed(no.job_id), {"n": 2})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED


def test_a_rerun_from_a_node_on_a_branch_not_taken_is_refused_and_changes_nothing(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply(
        "branches", condition("check", if_true=["yes"], if_false=["no"]),
        node("yes", "check"), node("no", "check"),
    ).name)  # fmt: skip
    (yes,) = bench.succeed(bench.claim_node(made.execution_id, "check"), {"branch": "if_true"})
    bench.succeed(bench.claimed(yes.job_id), {"n": 1})
    before = bench.rows(made.execution_id)

    with pytest.raises(InvalidTransition, match="would be skipped again"):
        rerun(bench, made.execution_id, "no")

    assert bench.rows(made.execution_id) == before


def test_a_cancelled_execution_reruns_the_nodes_the_cancel_stopped_too(bench: Bench) -> None:
    # Given a diamond cancelled after a, with b and c queued and never run
    made = bench.trigger(bench.apply("diamond", *DIAMOND).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"a": 1})
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    done = rerun(bench, made.execution_id, "b")

    # Then c, stopped by the cancel, runs as well: the execution could not complete without it
    assert (done.nodes, sorted(done.queued)) == (["b", "c", "d"], ["b", "c"])
    assert bench.probe.execution(made.execution_id).remaining_nodes == 3
    for published in done.dispatches:
        bench.succeed(bench.claimed(published.job_id), {"ok": True})
    bench.succeed(bench.claim_node(made.execution_id, "d"), {"d": 1})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED


def test_a_delay_downstream_waits_again_for_its_time_on_its_held_job(bench: Bench) -> None:
    made = bench.trigger(bench.apply(
        "later", node("a"), node("wait", "a", type="delay", config={"seconds": 60}),
    ).name)  # fmt: skip
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    wait_job = bench.job(made.execution_id, "wait").id
    bench.clock.advance(61)
    bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    bench.succeed(bench.claimed(wait_job), {"delayed_seconds": 60})
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.COMPLETED

    (a,) = rerun(bench, made.execution_id, "a").dispatches
    published = bench.succeed(bench.claimed(a.job_id), {"n": 2})

    assert published == []  # the delay is not published: it waits in the database
    wait = bench.job(made.execution_id, "wait")
    assert (wait.id, wait.status, wait.next_run_at) == (
        wait_job, JobStatus.SCHEDULED, bench.clock() + timedelta(seconds=60),
    )  # fmt: skip


# -- refusals ------------------------------------------------------------------------------------


def test_a_running_execution_cannot_be_rerun(bench: Bench) -> None:
    made = bench.trigger(bench.apply("diamond", *DIAMOND).name)
    before = bench.rows(made.execution_id)

    with pytest.raises(InvalidTransition, match="is running: only a finished one"):
        rerun(bench, made.execution_id, "a")

    assert bench.rows(made.execution_id) == before


def test_an_unknown_node_is_refused_naming_the_workflows_nodes(bench: Bench) -> None:
    execution_id = failed_diamond(bench)
    before = bench.rows(execution_id)

    with pytest.raises(RerunError, match=r"has no node 'x'; .*: a, b, c, d$"):
        rerun(bench, execution_id, "x")

    assert bench.rows(execution_id) == before


def test_an_input_for_a_node_that_reads_none_is_refused(bench: Bench) -> None:
    made = bench.trigger(bench.apply(
        "later", node("a"), node("wait", "a", type="delay", config={"seconds": 0}),
    ).name)  # fmt: skip
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    with pytest.raises(RerunError, match="reads no inputs"):
        rerun(bench, made.execution_id, "wait", input={"x": 1})


def test_another_tenants_execution_is_not_found(bench: Bench) -> None:
    execution_id = failed_diamond(bench)
    other = bench.units.run(lambda s: s.create_tenant("other"))
    before = bench.rows(execution_id)

    with pytest.raises(ExecutionNotFound):
        rerun(bench, execution_id, "b", tenant_id=other)
    with pytest.raises(ExecutionNotFound):
        rerun(bench, new_id(), "b")

    assert bench.rows(execution_id) == before
    own = bench.probe.execution(execution_id).tenant_id
    assert rerun(bench, execution_id, "b", tenant_id=own).nodes == ["b", "d"]


def test_a_rerun_is_refused_while_another_execution_holds_its_dedupe_key(bench: Bench) -> None:
    # Given an execution with a dedupe key that failed, and a newer one with the key running
    bench.apply("diamond", *DIAMOND)
    first = bench.trigger("diamond", dedupe_key="k").execution_id
    bench.succeed(bench.claim_node(first, "a"), {"a": 1})
    bench.fail(bench.claim_node(first, "b"), NonRetryableError("bad"))
    second = bench.trigger("diamond", dedupe_key="k").execution_id
    before = bench.rows(first)

    with pytest.raises(InvalidTransition, match=f"while execution {second}, which has"):
        rerun(bench, first, "b")

    assert bench.rows(first) == before
    bench.units.run(lambda s: cancellation.cancel_execution(s, second, bench.clock()))
    assert rerun(bench, first, "b").nodes == ["b", "c", "d"]
    # the rerun is the key's active execution now
    assert bench.trigger("diamond", dedupe_key="k").execution_id == first


# -- the store's methods ---------------------------------------------------------------------------


def test_revive_execution_refuses_a_dedupe_key_active_elsewhere_and_changes_nothing(
    bench: Bench,
) -> None:
    bench.apply("one", node("a"))
    first = bench.trigger("one", dedupe_key="k").execution_id
    bench.fail(bench.claim_node(first, "a"), NonRetryableError("bad"))
    bench.trigger("one", dedupe_key="k")
    before = bench.probe.execution(first)

    with pytest.raises(DuplicateExecution):
        bench.units.run(lambda s: s.revive_execution(first, (ExecutionStatus.FAILED,)))

    assert bench.probe.execution(first) == before


def test_revive_execution_takes_only_the_statuses_it_is_given(bench: Bench) -> None:
    made = bench.trigger(bench.apply("one", node("a")).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})

    assert not bench.units.run(lambda s: s.revive_execution(made.execution_id))
    assert bench.units.run(
        lambda s: s.revive_execution(made.execution_id, (ExecutionStatus.COMPLETED,))
    )
    revived = bench.probe.execution(made.execution_id)
    assert (revived.status, revived.output, revived.finished_at) == (
        ExecutionStatus.RUNNING, None, None,
    )  # fmt: skip


def test_rerun_input_is_the_latest_reruns_for_its_own_node_only(bench: Bench) -> None:
    execution_id = bench.trigger(bench.apply("one", node("a")).name).execution_id

    def add(node_id: str, input: dict[str, Any] | None) -> None:
        bench.units.run(
            lambda s: s.add_rerun(execution_id, node_id, input, "key:ops", bench.clock())
        )

    def read(node_id: str) -> Any:
        return bench.units.run(lambda s: s.rerun_input(execution_id, node_id))

    assert read("a") is None
    add("a", {"x": [1, "two"]})
    assert (read("a"), read("b")) == ({"x": [1, "two"]}, None)
    add("b", None)
    assert (read("a"), read("b")) == (None, None)
    assert bench.probe.execution(execution_id).reruns == 2


def test_dedupe_holder_names_the_other_active_execution_of_the_key_and_tenant(
    bench: Bench,
) -> None:
    bench.apply("one", node("a"))
    bench.apply("one", node("a"), tenant="other")
    first = bench.trigger("one", dedupe_key="k").execution_id
    plain = bench.trigger("one").execution_id

    def holder(execution_id: uuid.UUID) -> uuid.UUID | None:
        return bench.units.run(lambda s: s.dedupe_holder(execution_id))

    assert (holder(first), holder(plain)) == (None, None)
    bench.units.run(lambda s: cancellation.cancel_execution(s, first, bench.clock()))
    bench.trigger("one", dedupe_key="k", tenant="other")
    assert holder(first) is None  # another tenant's key is another key
    second = bench.trigger("one", dedupe_key="k").execution_id
    assert holder(first) == second


def test_hold_jobs_leaves_a_try_in_flight_alone_and_numbers_the_held_ones_on(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("pair", node("a"), node("b")).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    bench.claim_node(made.execution_id, "b")  # processing

    bench.units.run(lambda s: s.hold_jobs(made.execution_id, ["a", "b"]))

    a, b = bench.job(made.execution_id, "a"), bench.job(made.execution_id, "b")
    assert (a.status, a.tries_before, a.completed_at) == (JobStatus.HELD, 1, None)
    assert b.status is JobStatus.PROCESSING


def test_take_held_jobs_queues_only_held_jobs_and_says_which(bench: Bench) -> None:
    made = bench.trigger(bench.apply("pair", node("a"), node("b"), node("c")).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})
    bench.succeed(bench.claim_node(made.execution_id, "b"), {"n": 1})
    bench.units.run(lambda s: s.hold_jobs(made.execution_id, ["a"]))
    bench.clock.advance(3)
    later = bench.clock() + timedelta(seconds=30)
    new = [
        NewJob(id=new_id(), node_id="a", max_retries=4, next_run_at=later),
        NewJob(id=new_id(), node_id="b", max_retries=4),
    ]

    def take() -> dict[str, uuid.UUID]:
        return bench.units.run(
            lambda s: s.take_held_jobs(s.execution(made.execution_id), new, bench.clock())
        )

    a_id = bench.job(made.execution_id, "a").id
    assert take() == {"a": a_id}
    a = bench.job(made.execution_id, "a")
    assert (a.status, a.next_run_at, a.max_retries, a.enqueued_at) == (
        JobStatus.SCHEDULED, later, 4, bench.clock(),
    )  # fmt: skip
    assert bench.job(made.execution_id, "b").status is JobStatus.COMPLETED
    assert take() == {}  # taken once


def test_reset_nodes_clears_what_the_nodes_did(bench: Bench) -> None:
    made = bench.trigger(bench.apply("pair", node("a"), node("b")).name)
    bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})

    bench.units.run(lambda s: s.reset_nodes(made.execution_id, ["a"]))

    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.output, a.branch, a.error, a.started_at, a.finished_at) == (
        NodeStatus.PENDING, None, None, None, None, None,
    )  # fmt: skip
    assert bench.probe.nodes(made.execution_id)["b"].status is NodeStatus.QUEUED


# -- through a map ----------------------------------------------------------------------------


def failed_map(bench: Bench) -> uuid.UUID:
    """a gives rows, m maps over them (fail_fast), z after: item 1 of three died (item 0
    completed, item 2 was cancelled by the map's failure); the execution failed."""
    name = bench.apply(
        "mapped", node("a"), node("m", "a", map={"over": "{{ nodes.a.rows }}", "concurrency": 2}),
        node("z", "m"), defaults=NO_RETRY,
    ).name  # fmt: skip
    execution_id = bench.trigger(name).execution_id
    bench.succeed(bench.claim_node(execution_id, "a"), {"rows": [1, 2, 3]})
    expand(bench, execution_id)
    bench.complete(item_run(bench, execution_id, 0), "one")
    bench.fail(item_run(bench, execution_id, 1), NonRetryableError("bad row"))
    return execution_id


def test_a_rerun_through_a_map_runs_its_items_again_on_their_jobs_keeping_their_tries(
    bench: Bench,
) -> None:
    execution_id = failed_map(bench)
    assert [j.status.value for j in items(bench, execution_id)] == [
        "completed", "dead_letter", "cancelled",
    ]  # fmt: skip
    earlier = [j.id for j in items(bench, execution_id)]

    done = rerun(bench, execution_id, "m")

    # Then the map node and its items are reset: held, outputs and errors cleared, no counter
    assert (done.nodes, done.queued) == (["m", "z"], ["m"])
    assert [d.job_id for d in done.dispatches] == [own_job(bench, execution_id).id]
    reset = items(bench, execution_id)
    assert [(j.status, j.output, j.last_error) for j in reset] == [(JobStatus.HELD, None, None)] * 3
    assert [j.tries_before for j in reset] == [1, 1, 0]
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.output, m.items_total, m.items_left, m.items_failed) == (
        NodeStatus.QUEUED, None, None, None, None,
    )  # fmt: skip

    # When its own try renders the list again: each item takes its index's job again
    published = expand(bench, execution_id)
    assert [d.job_id for d in published] == earlier[:2]  # the window of two
    assert [j.id for j in items(bench, execution_id)] == earlier
    assert [j.status.value for j in items(bench, execution_id)] == ["queued", "queued", "held"]
    again = [item_run(bench, execution_id, i) for i in (0, 1)]
    assert [r.job.try_number for r in again] == [2, 2]  # numbered on after the earlier tries
    bench.complete(again[1], "TWO")
    bench.complete(again[0], "ONE")  # releases the held item a window after it, by its index
    assert items(bench, execution_id)[2].status is JobStatus.QUEUED
    assert [j.data for j in items(bench, execution_id)] == [{"releases": 2}, {}, {}]
    (z,) = bench.complete(item_run(bench, execution_id, 2), "THREE")

    # Then it completes with the new outputs, and every earlier try is kept
    assert bench.probe.nodes(execution_id)["m"].output == ["ONE", "TWO", "THREE"]
    bench.succeed(bench.claimed(z.job_id), {"z": 1})
    assert bench.probe.execution(execution_id).status is ExecutionStatus.COMPLETED
    tries = [[a.status.value for a in bench.probe.attempts(j)] for j in earlier]
    assert tries == [["succeeded", "succeeded"], ["failed", "succeeded"], ["succeeded"]]


def test_a_rerun_from_upstream_of_a_map_maps_over_its_new_list_shorter_or_longer(
    bench: Bench,
) -> None:
    # Given a completed run over three rows
    name = bench.apply("mapped", node("a"), node("m", "a", map={"over": "{{ nodes.a.rows }}"}),
                       defaults=NO_RETRY).name  # fmt: skip
    execution_id = bench.trigger(name).execution_id

    def run_over(rows: list[int]) -> None:
        bench.succeed(bench.claim_node(execution_id, "a"), {"rows": rows})
        expand(bench, execution_id)
        for i, row in enumerate(rows):
            bench.complete(item_run(bench, execution_id, i), row * 10)

    run_over([1, 2, 3])
    first = [j.id for j in items(bench, execution_id)]

    # When it is rerun from a, which gives two rows now
    rerun(bench, execution_id, "a")
    run_over([7, 8])

    # Then the map's output is the two rows', on the first two jobs; the third is retired
    done = bench.probe.execution(execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"m": [70, 80]})
    third = items(bench, execution_id)[2]
    assert (third.id, third.status, third.output) == (first[2], JobStatus.CANCELLED, None)
    assert third.last_error == "not in the map's list since a rerun (2 item(s) now)"
    outputs = bench.units.run(lambda s: s.item_outputs(execution_id, "m"))
    assert [(r.index, r.output) for r in outputs] == [(0, 70), (1, 80)]

    # When it is rerun again over four rows: the three jobs again, and a new one
    rerun(bench, execution_id, "a")
    run_over([4, 5, 6, 7])

    assert bench.probe.execution(execution_id).output == {"m": [40, 50, 60, 70]}
    found = items(bench, execution_id)
    assert [j.id for j in found[:3]] == first and found[3].id not in first
    assert [len(bench.probe.attempts(j.id)) for j in found] == [3, 3, 2, 1]


def test_a_rerun_over_an_empty_list_now_retires_every_earlier_item(bench: Bench) -> None:
    name = bench.apply("mapped", node("a"), node("m", "a", map={"over": "{{ nodes.a.rows }}"}),
                       defaults=NO_RETRY).name  # fmt: skip
    execution_id = bench.trigger(name).execution_id
    bench.succeed(bench.claim_node(execution_id, "a"), {"rows": [1]})
    expand(bench, execution_id)
    bench.complete(item_run(bench, execution_id, 0), "one")

    rerun(bench, execution_id, "a")
    bench.succeed(bench.claim_node(execution_id, "a"), {"rows": []})
    expand(bench, execution_id)

    assert bench.probe.execution(execution_id).output == {"m": []}
    assert [j.status for j in items(bench, execution_id)] == [JobStatus.CANCELLED]


def test_a_rerun_input_for_a_map_node_is_refused_and_changes_nothing(bench: Bench) -> None:
    execution_id = failed_map(bench)
    before = bench.probe.nodes(execution_id), items(bench, execution_id)

    with pytest.raises(RerunError, match=r"node 'm' maps over a list, and each item's inputs"):
        rerun(bench, execution_id, "m", input={"x": 1})

    assert (bench.probe.nodes(execution_id), items(bench, execution_id)) == before


def test_a_rerun_waits_for_the_items_a_cancel_left_running(bench: Bench) -> None:
    name = bench.apply("mapped", node("m", map={"over": "{{ input.rows }}"})).name
    execution_id = bench.trigger(name, {"rows": [1, 2]}).execution_id
    expand(bench, execution_id)
    running = item_run(bench, execution_id, 0)
    bench.units.run(lambda s: cancellation.cancel_execution(s, execution_id, bench.clock()))
    before = bench.probe.nodes(execution_id), items(bench, execution_id)

    with pytest.raises(InvalidTransition, match=r"still has items of map node\(s\) m in flight"):
        rerun(bench, execution_id, "m")
    assert (bench.probe.nodes(execution_id), items(bench, execution_id)) == before

    bench.complete(running, "late")  # it reports: cancelled, its output kept
    rerun(bench, execution_id, "m")
    assert [j.status for j in items(bench, execution_id)] == [JobStatus.HELD] * 2


def test_items_in_flight_names_the_maps_with_an_item_not_settled(bench: Bench) -> None:
    name = bench.apply("two_maps", node("m", map={"over": "{{ input.rows }}"}),
                       node("n", map={"over": "{{ input.rows }}"})).name  # fmt: skip
    execution_id = bench.trigger(name, {"rows": [1, 2]}).execution_id
    expand(bench, execution_id, node_id="m")
    expand(bench, execution_id, node_id="n")
    bench.complete(item_run(bench, execution_id, 0, "n"), 1)
    bench.complete(item_run(bench, execution_id, 1, "n"), 2)

    def busy() -> list[str]:
        return bench.units.run(lambda s: s.items_in_flight(execution_id, ["m", "n"]))

    assert busy() == ["m"]
    item_run(bench, execution_id, 0)  # processing
    assert busy() == ["m"]
