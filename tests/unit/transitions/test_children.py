"""Child workflows (conveyor.engine.children): a workflow node's try starts a child execution
and waits for it, holding nothing; the child's finish settles the node in the same
transaction, whichever way it finishes; a stop of the parent stops its children."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from typing import Any

import pytest

from conveyor.engine import cancellation, children, claiming, dead_letters, due, outcomes, reruns
from conveyor.engine.claiming import NodeRun
from conveyor.engine.records import Dispatch, ExecutionRecord, ParentLink
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobKind, JobStatus, NodeStatus
from conveyor.exceptions import (
    CancelExecution,
    DefinitionError,
    InvalidTransition,
    NonRetryableError,
)
from conveyor.ids import new_id
from tests.support.bench import Bench, node

NO_RETRY = {"retry": {"max_attempts": 1}}
# Two tries of the workflow node, 10 s apart, no jitter
TWICE = {"retry": {"max_attempts": 2, "backoff": 10, "jitter": 0}}


def child_node(node_id: str, workflow: str, *needs: str, **fields: Any) -> dict[str, Any]:
    config = {"workflow": workflow, **fields.pop("config", {})}
    return node(node_id, *needs, type="workflow", config=config, **fields)


def start(
    bench: Bench, run: NodeRun, max_depth: int = 8, max_children: int = 1000
) -> children.Started:
    return bench.units.run(
        lambda s: children.start_child(
            s,
            run,
            bench.clock(),
            max_depth=max_depth,
            max_children=max_children,
            rng=random.Random(7),
        )
    )


def only_child(bench: Bench, parent_id: uuid.UUID) -> uuid.UUID:
    (child_id,) = bench.units.run(lambda s: s.active_children(parent_id))
    return child_id


def parent_and_child(bench: Bench, **fields: Any) -> tuple[uuid.UUID, NodeRun, uuid.UUID]:
    """A parent (call, then after) whose workflow node "call" has started a child of two
    nodes (one, two): the parent, the claimed try of call, and the child."""
    bench.apply("kid", node("one"), node("two", "one"))
    bench.apply("mom", child_node("call", "kid", inputs={"n": "{{ input.n }}"}, **fields),
                node("after", "call"))  # fmt: skip
    made = bench.trigger("mom", {"n": 3})
    run = bench.claim_node(made.execution_id, "call")
    started = start(bench, run)
    assert started.waiting and started.child_id is not None
    return made.execution_id, run, started.child_id


def finish_child(bench: Bench, child_id: uuid.UUID) -> list[Dispatch]:
    bench.succeed(bench.claim_node(child_id, "one"), {"x": 1})
    return bench.succeed(bench.claim_node(child_id, "two"), {"y": 2})


def test_a_workflow_node_starts_its_child_and_waits_holding_nothing(bench: Bench) -> None:
    bench.apply("kid", node("one"), node("two", "one"))
    bench.apply("mom", child_node("call", "kid", inputs={"n": "{{ input.n }}"}),
                node("after", "call"))  # fmt: skip
    made = bench.trigger("mom", {"n": 3})
    run = bench.claim_node(made.execution_id, "call")

    started = start(bench, run)

    # Then the parent's job and node wait, its try still open, and the child runs its root
    assert started.waiting and started.failed is None
    job = bench.job(made.execution_id, "call")
    assert job.status is JobStatus.WAITING_CHILD
    assert bench.statuses(made.execution_id) == {"call": "waiting", "after": "pending"}
    (attempt,) = bench.probe.attempts(job.id)
    assert attempt.status is AttemptStatus.RUNNING
    child = bench.probe.execution(started.child_id)  # type: ignore[arg-type]
    assert (child.status, child.input, child.trigger, child.depth) == (
        ExecutionStatus.RUNNING, {"n": 3}, "workflow", 1,
    )  # fmt: skip
    assert child.parent == ParentLink(
        execution_id=made.execution_id, node_id="call", job_id=job.id, try_number=1
    )
    assert child.priority == bench.probe.execution(made.execution_id).priority
    assert [(d.node, d.kind) for d in started.dispatches] == [("one", JobKind.NODE)]
    assert bench.job(child.id, "one").status is JobStatus.QUEUED


def test_a_start_run_twice_for_one_try_makes_one_child(bench: Bench) -> None:
    parent_id, run, child_id = parent_and_child(bench)

    again = start(bench, run)  # a duplicate delivery that got this far

    assert (again.waiting, again.child_id, again.dispatches) == (False, None, [])
    assert bench.units.run(lambda s: s.active_children(parent_id)) == [child_id]


def test_the_childs_completion_completes_the_node_with_its_output_and_the_parent_goes_on(
    bench: Bench,
) -> None:
    parent_id, _, child_id = parent_and_child(bench)

    # When the child's last node completes (not in the one-statement path: it has a parent)
    bench.succeed(bench.claim_node(child_id, "one"), {"x": 1})
    last = bench.claim_node(child_id, "two")
    assert bench.alone(last, {"y": 2}) is False
    published = bench.complete(last, {"y": 2})

    # Then in the same transaction the child completed and the parent's node with its output
    assert bench.probe.execution(child_id).status is ExecutionStatus.COMPLETED
    call = bench.probe.nodes(parent_id)["call"]
    assert (call.status, call.output) == (NodeStatus.COMPLETED, {"two": {"y": 2}})
    job = bench.job(parent_id, "call")
    assert job.status is JobStatus.COMPLETED
    assert [a.status for a in bench.probe.attempts(job.id)] == [AttemptStatus.SUCCEEDED]
    assert [d.node for d in published] == ["after"]
    bench.succeed(bench.claim_node(parent_id, "after"), {"done": True})
    assert bench.probe.execution(parent_id).status is ExecutionStatus.COMPLETED


def test_a_child_that_is_a_parents_last_node_completes_the_parent(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), output={"got": "{{ nodes.call.one.v }}"})
    made = bench.trigger("mom")
    start(bench, bench.claim_node(made.execution_id, "call"))
    child_id = only_child(bench, made.execution_id)

    bench.succeed(bench.claim_node(child_id, "one"), {"v": 42})

    parent = bench.probe.execution(made.execution_id)
    assert (parent.status, parent.output) == (ExecutionStatus.COMPLETED, {"got": 42})


def test_a_failed_child_fails_the_node_by_its_retry_policy_and_a_retry_starts_a_new_child(
    bench: Bench,
) -> None:
    parent_id, _, first = parent_and_child(bench, **TWICE)

    # When the child's node fails for good
    failed = bench.fail(bench.claim_node(first, "one"), NonRetryableError("no way"))

    # Then the child failed, and the parent's node waits for its retry, its error naming the
    # child, its failed node and its dead letter
    assert failed.outcome is JobStatus.DEAD_LETTER
    assert bench.probe.execution(first).status is ExecutionStatus.FAILED
    dead = bench.job(first, "one")
    job = bench.job(parent_id, "call")
    assert job.status is JobStatus.RETRY_WAIT
    expected = (
        f"child execution {first} failed at node 'one' (dead letter {dead.id}): node 'one' "
        f"failed after 1 attempt(s): no way"
    )
    assert job.last_error == expected
    assert bench.probe.nodes(parent_id)["call"].status is NodeStatus.QUEUED

    # When its retry comes: a second child; it fails too, and the parent fails
    bench.clock.advance(10)
    (due_call,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    second_try = bench.claimed(due_call.job_id)
    second = start(bench, second_try).child_id
    assert second is not None and second != first
    assert bench.probe.execution(second).parent.try_number == 2  # type: ignore[union-attr]
    bench.fail(bench.claim_node(second, "one"), NonRetryableError("still no"))

    assert bench.job(parent_id, "call").status is JobStatus.DEAD_LETTER
    parent = bench.probe.execution(parent_id)
    assert parent.status is ExecutionStatus.FAILED
    assert f"child execution {second} failed at node 'one'" in (parent.error or "")
    assert bench.statuses(parent_id) == {"call": "failed", "after": "cancelled"}


def test_a_cancelled_parent_cancels_its_children_and_theirs(bench: Bench) -> None:
    bench.apply("grandkid", node("leaf"))
    bench.apply("kid", child_node("deeper", "grandkid"))
    bench.apply("mom", child_node("call", "kid"), node("side"))
    made = bench.trigger("mom")
    start(bench, bench.claim_node(made.execution_id, "call"))
    kid = only_child(bench, made.execution_id)
    start(bench, bench.claim_node(kid, "deeper"))
    grandkid = only_child(bench, kid)
    leaf = bench.claim_node(grandkid, "leaf")  # running: told to stop by its status

    stopped = bench.units.run(
        lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock())
    )

    assert [bench.probe.execution(e).status for e in (made.execution_id, kid, grandkid)] == [
        ExecutionStatus.CANCELLED
    ] * 3
    assert bench.probe.execution(grandkid).error == (
        f"its parent execution {kid} stopped: its parent execution {made.execution_id} "
        f"stopped: cancelled by request"
    )
    assert bench.statuses(made.execution_id) == {"call": "cancelled", "side": "cancelled"}
    assert bench.job(made.execution_id, "call").status is JobStatus.CANCELLED
    assert bench.job(kid, "deeper").status is JobStatus.CANCELLED
    assert set(stopped.forget) == {bench.job(made.execution_id, "side").id,
                                   bench.job(made.execution_id, "call").id,
                                   bench.job(kid, "deeper").id}  # fmt: skip
    assert stopped.dispatches == []
    # the leaf's try, returning now, is recorded cancelled
    assert bench.complete(leaf, {"late": True}) == []
    assert bench.probe.nodes(grandkid)["leaf"].status is NodeStatus.CANCELLED


@pytest.mark.parametrize("stop", ["cancel", "failure elsewhere"])
def test_a_stop_ends_the_try_of_a_node_waiting_for_its_child_cancelled(
    bench: Bench, stop: str
) -> None:
    # Given a workflow node waiting for its child, and a node beside it
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), node("other"), defaults=NO_RETRY)
    made = bench.trigger("mom")
    waiting = bench.claim_node(made.execution_id, "call")
    start(bench, waiting)
    bench.clock.advance(5)

    # When its execution stops (cancelled, or failed by the node beside it)
    if stop == "cancel":
        bench.units.run(
            lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock())
        )
    else:
        bench.fail(bench.claim_node(made.execution_id, "other"), RuntimeError("boom"))

    # Then the try it waited in ended with its job, cancelled, not left running
    assert bench.job(made.execution_id, "call").status is JobStatus.CANCELLED
    (attempt,) = bench.probe.attempts(waiting.job.id)
    assert (attempt.status, attempt.finished_at, attempt.duration) == (
        AttemptStatus.CANCELLED, bench.clock(), 5.0,
    )  # fmt: skip


def tree(bench: Bench) -> tuple[uuid.UUID, list[uuid.UUID], list[uuid.UUID]]:
    """A running tree: mom, whose three workflow nodes each started a kid, whose workflow
    node each started a leaf (its node not started). Mom, her kids and their leaves."""
    bench.apply("leaf", node("one"))
    bench.apply("kid", child_node("deeper", "leaf"))
    bench.apply("mom", *(child_node(f"call{i}", "kid") for i in range(3)))
    made = bench.trigger("mom")
    kids = [start(bench, bench.claim_node(made.execution_id, f"call{i}")).child_id
            for i in range(3)]  # fmt: skip
    leaves = [start(bench, bench.claim_node(kid, "deeper")).child_id for kid in kids if kid]
    assert all(kids) and all(leaves)
    return made.execution_id, kids, leaves  # type: ignore[return-value]


def running(bench: Bench, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    return {e for e in ids if bench.probe.execution(e).status is ExecutionStatus.RUNNING}


def test_a_cancel_stops_a_share_of_a_tree_and_the_orphans_left_a_share_at_a_time(
    bench: Bench,
) -> None:
    mom, kids, leaves = tree(bench)

    # When mom is cancelled by a transaction that may stop two children
    stopped = bench.units.run(lambda s: cancellation.cancel_execution(s, mom, bench.clock(), 2))

    # Then she and two kids (breadth first) are cancelled, and the rest are orphans: the kid
    # whose node was cancelled, and the leaves of the kids cancelled; not the third's leaf,
    # which its running kid still waits for
    assert stopped.more
    assert bench.probe.execution(mom).status is ExecutionStatus.CANCELLED
    assert running(bench, kids) == {kids[2]}
    assert running(bench, leaves) == set(leaves)
    orphans = bench.units.run(lambda s: s.orphaned_children(10))
    assert {child for child, _ in orphans} == {kids[2], leaves[0], leaves[1]}
    assert dict(orphans)[kids[2]] == mom

    # When the orphans are stopped two at a time, until none is left
    shares = []
    while True:
        before = running(bench, kids + leaves)
        more = bench.units.run(lambda s: cancellation.stop_orphans(s, bench.clock(), 2))
        shares.append(len(before - running(bench, kids + leaves)))
        if not more.more:
            break

    # Then every one is cancelled, two or fewer a transaction, each naming why
    assert running(bench, kids + leaves) == set()
    assert max(shares) <= 2 and sum(shares) == 4
    assert bench.probe.execution(kids[2]).error == (
        f"its parent execution {mom} cancelled: cancelled by request"
    )
    leaf = bench.probe.execution(leaves[2]).error or ""  # stopped below its kid, or after
    assert leaf.startswith(f"its parent execution {kids[2]} ")
    assert leaf.endswith(f"its parent execution {mom} cancelled: cancelled by request")
    assert bench.units.run(lambda s: s.orphaned_children(10)) == []


def test_a_child_its_parent_waits_for_is_no_orphan(bench: Bench) -> None:
    mom, kids, leaves = tree(bench)

    assert bench.units.run(lambda s: s.orphaned_children(10)) == []
    stopped = bench.units.run(lambda s: cancellation.stop_orphans(s, bench.clock(), 10))
    assert (stopped.more, stopped.forget) == (False, [])
    assert running(bench, [mom, *kids, *leaves]) == {mom, *kids, *leaves}


def test_a_child_cancelled_alone_fails_its_parents_node_without_a_retry(bench: Bench) -> None:
    parent_id, _, child_id = parent_and_child(bench, **TWICE)

    stopped = bench.units.run(lambda s: cancellation.cancel_execution(s, child_id, bench.clock()))

    assert stopped.finished
    job = bench.job(parent_id, "call")
    assert job.status is JobStatus.DEAD_LETTER
    assert job.last_error == (
        f"child execution {child_id} was cancelled: cancelled by request (the error is not "
        f"retryable)"
    )
    assert bench.probe.execution(parent_id).status is ExecutionStatus.FAILED


def test_a_child_cancelled_by_its_own_node_fails_its_parents_node(bench: Bench) -> None:
    parent_id, _, child_id = parent_and_child(bench, continue_on_failure=True)
    run = bench.claim_node(child_id, "one")

    failed = bench.units.run(
        lambda s: outcomes.cancel_from_node(s, run, CancelExecution("enough"), bench.clock(), 0.01)
    )

    # Then the parent's node failed, tolerated: its successor runs
    assert bench.probe.nodes(parent_id)["call"].status is NodeStatus.FAILED
    assert [d.node for d in failed.dispatches] == ["after"]


def test_a_parent_failing_elsewhere_cancels_its_running_child(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), node("other"), defaults=NO_RETRY)
    made = bench.trigger("mom")
    start(bench, bench.claim_node(made.execution_id, "call"))
    child_id = only_child(bench, made.execution_id)

    failed = bench.fail(bench.claim_node(made.execution_id, "other"), RuntimeError("boom"))

    # (the jobs the stop cancelled, its child's too, returned for the limiter to forget)
    assert set(failed.forget) == {
        bench.job(made.execution_id, "call").id, bench.job(child_id, "one").id,
    }  # fmt: skip
    child = bench.probe.execution(child_id)
    assert child.status is ExecutionStatus.CANCELLED
    assert child.error == (
        f"its parent execution {made.execution_id} stopped: node 'other' failed after 1 "
        f"attempt(s): RuntimeError: boom"
    )
    assert bench.job(made.execution_id, "call").status is JobStatus.CANCELLED
    assert bench.job(child_id, "one").status is JobStatus.CANCELLED


def test_a_child_past_the_maximum_depth_fails_its_node_without_a_retry(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), defaults=TWICE)
    made = bench.trigger("mom")
    run = bench.claim_node(made.execution_id, "call")
    deep = NodeRun(
        job=run.job, execution=_deeper(run.execution, 3), workflow=run.workflow,
        node=run.node, context=run.context,
    )  # fmt: skip

    started = start(bench, deep, max_depth=3)

    assert started.failed is not None and not started.waiting
    assert started.failed.outcome is JobStatus.DEAD_LETTER
    assert bench.job(made.execution_id, "call").last_error == (
        "node 'call' would start a child at depth 4, past the limit of 3 "
        "(CONVEYOR_MAX_CHILD_DEPTH): its workflows start each other in a circle, or nest "
        "deeper than that; break the circle, or raise the setting (the error is not "
        "retryable)"
    )
    assert bench.probe.counts()["executions"] == 1


def test_a_child_past_the_most_an_execution_may_start_fails_its_node_without_a_retry(
    bench: Bench,
) -> None:
    # Given a parent with two workflow nodes, the first of which started its child
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("first", "kid"), child_node("second", "kid"), defaults=TWICE)
    made = bench.trigger("mom")
    assert start(bench, bench.claim_node(made.execution_id, "first"), max_children=2).waiting
    assert start(bench, bench.claim_node(made.execution_id, "second"), max_children=2).waiting
    (second,) = [
        c for c in only_children(bench, made.execution_id)
        if bench.probe.execution(c).parent_node_id == "second"
    ]  # fmt: skip
    bench.fail(bench.claim_node(second, "one"), NonRetryableError("no"))  # its parent retries
    bench.clock.advance(10)
    (due_second,) = bench.units.run(lambda s: due.promote_due(s, bench.clock()))
    retry = bench.claimed(due_second.job_id)

    # When a try would start a third child, under a limit of 2 (the failed one counts)
    started = start(bench, retry, max_children=2)

    # Then the try fails, not retried, naming the node, the execution and the setting
    assert started.failed is not None and started.failed.outcome is JobStatus.DEAD_LETTER
    assert bench.job(made.execution_id, "second").last_error == (
        f"node 'second' would start child number 3 of execution {made.execution_id}, past "
        f"the limit of 2 (CONVEYOR_MAX_CHILDREN): each try of a workflow node starts one; "
        f"start fewer (fewer workflow nodes, or fewer tries of them), or raise "
        f"CONVEYOR_MAX_CHILDREN (the error is not retryable)"
    )
    assert bench.probe.counts()["executions"] == 3


def only_children(bench: Bench, parent_id: uuid.UUID) -> list[uuid.UUID]:
    return bench.units.run(lambda s: s.active_children(parent_id))


def test_children_started_counts_every_child_up_to_the_most_asked(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", *(child_node(f"c{i}", "kid") for i in range(3)))
    made = bench.trigger("mom")
    for i in range(3):
        start(bench, bench.claim_node(made.execution_id, f"c{i}"))
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    counted = [bench.units.run(lambda s, m=m: s.children_started(made.execution_id, m))
               for m in (1, 3, 10)]  # fmt: skip

    assert counted == [1, 3, 3]


def _deeper(execution: ExecutionRecord, depth: int) -> ExecutionRecord:
    return replace(execution, depth=depth)


def test_a_workflow_the_tenant_has_not_applied_fails_the_node(bench: Bench) -> None:
    bench.apply("mom", child_node("call", "nobody"), defaults=TWICE)
    made = bench.trigger("mom")

    started = start(bench, bench.claim_node(made.execution_id, "call"))

    assert started.failed is not None and started.failed.outcome is JobStatus.DEAD_LETTER
    assert bench.probe.execution(made.execution_id).error == (
        "node 'call' failed after 1 attempt(s): node 'call' starts workflow 'nobody', which "
        "this tenant has not applied; apply it first (conveyor workflow apply FILE)"
    )


def test_a_child_runs_its_pinned_version_or_the_latest_when_the_node_starts(
    bench: Bench,
) -> None:
    first = bench.apply("kid", node("one"))
    second = bench.apply("kid", node("one"), node("two", "one"))
    bench.apply("mom", child_node("pinned", "kid", config={"version": 1}),
                child_node("latest", "kid"))  # fmt: skip
    made = bench.trigger("mom")

    start(bench, bench.claim_node(made.execution_id, "pinned"))
    start(bench, bench.claim_node(made.execution_id, "latest"))
    bench.apply("kid", node("other"))  # a third version, applied after they started

    by_node = {
        bench.probe.execution(c).parent_node_id: bench.probe.execution(c).workflow_id
        for c in bench.units.run(lambda s: s.active_children(made.execution_id))
    }
    assert by_node == {"pinned": first.id, "latest": second.id}


def test_a_missing_pinned_version_fails_the_node(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid", config={"version": 7}))
    made = bench.trigger("mom")

    start(bench, bench.claim_node(made.execution_id, "call"))

    assert "starts workflow 'kid' version 7, which this tenant has not applied" in (
        bench.probe.execution(made.execution_id).error or ""
    )


def test_a_large_child_is_planned_by_an_execution_worker(bench: Bench) -> None:
    bench.apply("big", *(node(f"n{i}") for i in range(101)))
    bench.apply("mom", child_node("call", "big"))
    made = bench.trigger("mom")

    started = start(bench, bench.claim_node(made.execution_id, "call"))

    assert [d.kind for d in started.dispatches] == [JobKind.EXECUTION]
    assert bench.probe.execution(started.child_id).status is ExecutionStatus.PENDING  # type: ignore[arg-type]


def test_a_try_reclaimed_before_its_child_started_starts_none(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), defaults=TWICE)
    made = bench.trigger("mom")
    run = bench.claim_node(made.execution_id, "call")
    bench.fail(run, RuntimeError("worker lost"))  # recovery reclaimed it meanwhile

    started = start(bench, run)

    assert (started.waiting, started.failed, started.dispatches) == (False, None, [])
    assert bench.probe.counts()["executions"] == 1


def test_a_childs_dead_letter_is_not_requeued_its_parents_is(bench: Bench) -> None:
    parent_id, _, child_id = parent_and_child(bench, **NO_RETRY)
    bench.fail(bench.claim_node(child_id, "one"), NonRetryableError("no way"))
    dead = bench.job(child_id, "one")

    with pytest.raises(InvalidTransition, match="requeue the parent's dead letter instead"):
        bench.units.run(lambda s: dead_letters.requeue(s, dead.id, None, bench.clock()))

    # The parent's dead letter resumes it: its node's next try starts a new child
    call = bench.job(parent_id, "call")
    (published,) = bench.units.run(lambda s: dead_letters.requeue(s, call.id, None, bench.clock()))
    again = start(bench, bench.claimed(published.job_id))
    assert again.child_id not in (None, child_id)


def test_a_wait_left_unsettled_is_settled_by_the_recovery_sweep(bench: Bench) -> None:
    parent_id, _, child_id = parent_and_child(bench)
    # Given a child finished by a path that settled nothing (none should)
    bench.units.run(
        lambda s: s.finish_execution(
            child_id, ExecutionStatus.COMPLETED, bench.clock(), output={"ok": 1}
        )
    )
    assert bench.units.run(lambda s: s.children_to_settle(10)) == [child_id]

    settled, after = bench.units.run(lambda s: children.settle_waiting(s, bench.clock(), 10))

    assert settled == 1 and [d.node for d in after.dispatches] == ["after"]
    assert bench.probe.nodes(parent_id)["call"].output == {"ok": 1}
    assert bench.units.run(lambda s: s.children_to_settle(10)) == []


# -- the store's part ----------------------------------------------------------------------------


def test_a_second_child_for_the_same_job_and_try_is_refused_by_its_key(bench: Bench) -> None:
    _, run, child_id = parent_and_child(bench)
    version = bench.apply("kid", node("one"), node("two", "one"))
    link = bench.probe.execution(child_id).parent

    def again(try_number: int) -> Any:
        return bench.units.autocommit(
            lambda s: s.create_execution(
                _child_record(run.execution, version.id, link, try_number),
                names=None, trigger="workflow", now=bench.clock(), waiting_on={"one": 0},
                queued=["one"],
            )
        )  # fmt: skip

    assert again(1).value == "key taken"
    assert again(2).value == "created"


def _child_record(
    parent: ExecutionRecord, workflow_id: uuid.UUID, link: ParentLink | None, try_number: int
) -> ExecutionRecord:
    assert link is not None
    return ExecutionRecord(
        id=new_id(), tenant_id=parent.tenant_id, workflow_id=workflow_id,
        status=ExecutionStatus.PENDING, priority=parent.priority, input={},
        created_at=parent.created_at, parent=replace(link, try_number=try_number), depth=1,
    )  # fmt: skip


def test_resume_waiting_takes_only_the_waiting_try(bench: Bench) -> None:
    _, run, _ = parent_and_child(bench)
    job_id = run.job.id

    assert bench.units.run(lambda s: s.resume_waiting(job_id, 2)) is None
    resumed = bench.units.run(lambda s: s.resume_waiting(job_id, 1))
    assert resumed is not None and (resumed.id, resumed.status) == (job_id, JobStatus.PROCESSING)
    assert bench.units.run(lambda s: s.resume_waiting(job_id, 1)) is None


def test_the_outcome_of_an_execution_names_its_first_dead_letter(bench: Bench) -> None:
    bench.apply("two", node("a", continue_on_failure=True), node("b", "a"),
                defaults=NO_RETRY)  # fmt: skip
    made = bench.trigger("two")
    bench.fail(bench.claim_node(made.execution_id, "a"), RuntimeError("first"))
    bench.fail(bench.claim_node(made.execution_id, "b"), RuntimeError("second"))

    outcome = bench.units.run(lambda s: s.execution_outcome(made.execution_id))

    assert outcome is not None
    assert (outcome.status, outcome.dead_letter) == (
        ExecutionStatus.FAILED, (bench.job(made.execution_id, "a").id, "a"),
    )  # fmt: skip
    assert outcome.error == "node 'b' failed after 1 attempt(s): RuntimeError: second"
    assert bench.units.run(lambda s: s.execution_outcome(new_id())) is None


def test_active_children_are_those_pending_or_running_oldest_first(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("a", "kid"), child_node("b", "kid"), child_node("c", "kid"))
    made = bench.trigger("mom")
    made_children = []
    for name in ("a", "b", "c"):
        made_children.append(start(bench, bench.claim_node(made.execution_id, name)).child_id)
        bench.clock.advance(1)
    bench.succeed(bench.claim_node(made_children[1], "one"), {})  # b's child completes

    found = bench.units.run(lambda s: s.active_children(made.execution_id))

    assert found == [made_children[0], made_children[2]]
    assert bench.units.run(lambda s: s.active_children(made_children[0])) == []


def test_a_version_is_found_by_its_number(bench: Bench) -> None:
    first = bench.apply("kid", node("one"))
    bench.apply("kid", node("two"))
    tenant_id = first.tenant_id

    found = bench.units.run(lambda s: s.workflow_version(tenant_id, "kid", 1))

    assert found is not None and found.id == first.id
    assert bench.units.run(lambda s: s.workflow_version(tenant_id, "kid", 3)) is None
    assert bench.units.run(lambda s: s.workflow_version(tenant_id, "other", 1)) is None


# -- cycles ---------------------------------------------------------------------------------


def test_a_circle_of_workflows_starting_each_other_is_refused_when_applied(
    bench: Bench,
) -> None:
    bench.apply("a", child_node("to_b", "b"))  # b is not applied yet: nothing to see
    bench.apply("b", child_node("to_c", "c"))

    with pytest.raises(DefinitionError) as refused:
        bench.apply("c", child_node("to_a", "a"))

    (error,) = refused.value.errors
    assert error == (
        "workflow: its workflow nodes start 'c' again through the workflows applied "
        "(c -> a -> b -> c); workflows may not start each other in a circle: remove one of "
        "these workflow nodes, or start another workflow"
    )
    bench.apply("c", node("leaf"))  # a c that starts nothing is fine


def test_a_pinned_version_that_starts_nothing_closes_no_circle(bench: Bench) -> None:
    bench.apply("b", node("leaf"))
    bench.apply("a", child_node("to_b", "b", config={"version": 1}))
    bench.apply("b", child_node("to_a", "a"))  # version 2 starts a; a pins version 1

    assert bench.apply("a", child_node("to_b", "b", config={"version": 1}), node("x")).version == 2
    with pytest.raises(DefinitionError, match=r"\(a -> b -> a\)"):
        bench.apply("a", child_node("to_b", "b"))


def test_a_childs_input_is_rendered_from_the_nodes_needs_as_it_is_claimed(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", node("first"), child_node("call", "kid", "first",
                                                  inputs={"v": "{{ nodes.first.v }}"}))  # fmt: skip
    made = bench.trigger("mom")
    (after_first,) = bench.complete(bench.claim_node(made.execution_id, "first"), {"v": 9})
    run = bench.units.autocommit(
        lambda s: claiming.claim_node(s, after_first.job_id, bench.clock(), "w", after_first.hints)
    )
    assert run is not None

    started = start(bench, run)

    assert bench.probe.execution(started.child_id).input == {"v": 9}  # type: ignore[arg-type]


def test_a_parent_cancelled_after_its_nodes_claim_starts_no_child(bench: Bench) -> None:
    bench.apply("kid", node("one"))
    bench.apply("mom", child_node("call", "kid"), node("after", "call"))
    made = bench.trigger("mom")
    run = bench.claim_node(made.execution_id, "call")
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    started = start(bench, run)

    assert (started.waiting, started.child_id, started.dispatches) == (False, None, [])
    assert bench.probe.counts()["executions"] == 1  # no child
    assert bench.job(made.execution_id, "call").status is JobStatus.CANCELLED
    assert bench.statuses(made.execution_id) == {"call": "cancelled", "after": "cancelled"}


def test_a_rerun_input_for_a_workflow_node_is_its_childs_input(bench: Bench) -> None:
    parent_id, _, child_id = parent_and_child(bench)
    finish_child(bench, child_id)
    bench.succeed(bench.claim_node(parent_id, "after"), {"done": True})
    bench.units.run(
        lambda s: reruns.rerun(
            s, parent_id, "call", requested_by="cli:tester", now=bench.clock(), input={"n": 9}
        )
    )

    started = start(bench, bench.claim_node(parent_id, "call"))

    assert started.waiting and started.child_id is not None
    assert bench.probe.execution(started.child_id).input == {"n": 9}


def test_a_child_execution_is_not_rerun_its_parent_is(bench: Bench) -> None:
    _, _, child_id = parent_and_child(bench)
    finish_child(bench, child_id)
    before = bench.rows(child_id)

    with pytest.raises(InvalidTransition, match=r"is a child of execution .* rerun the parent"):
        bench.units.run(
            lambda s: reruns.rerun(s, child_id, "one", requested_by="cli:tester", now=bench.clock())
        )

    assert bench.rows(child_id) == before
