"""A node's success (conveyor.engine.success, .settling): its successors made ready once, the
branches a condition did not take skipped, the execution completed with its output; alone in
one step when it makes nothing ready."""

from __future__ import annotations

from conveyor.engine import cancellation
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from tests.support.bench import Bench, condition, node

CHAIN = (node("a"), node("b", "a"))
JOIN = (node("root"), node("a", "root"), node("b", "root"), node("join", "a", "b"))


def test_a_chain_runs_each_node_after_the_one_before_and_completes(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    a = bench.claim_node(made.execution_id, "a")

    assert not bench.alone(a, {"n": 1})  # b waits on it: the transaction enqueues b
    (published,) = bench.complete(a, {"n": 1})

    assert bench.statuses(made.execution_id) == {"a": "completed", "b": "queued"}
    assert published.job_id == bench.job(made.execution_id, "b").id
    assert bench.probe.execution(made.execution_id).remaining_nodes == 1
    b = bench.claimed(published.job_id)
    assert bench.alone(b, {"n": 2})
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.remaining_nodes, done.output, done.finished_at) == (
        ExecutionStatus.COMPLETED, 0, {"b": {"n": 2}}, bench.clock(),
    )  # fmt: skip


def test_a_fan_out_queues_every_successor_at_once(bench: Bench) -> None:
    made = bench.trigger(bench.apply(
        "fan", node("root"), node("x", "root"), node("y", "root"), node("z", "root"),
    ).name)  # fmt: skip

    published = bench.succeed(bench.claim_node(made.execution_id, "root"), {"n": 0})

    assert sorted(d.hints.node_id for d in published if d.hints) == ["x", "y", "z"]
    assert bench.statuses(made.execution_id) == {
        "root": "completed", "x": "queued", "y": "queued", "z": "queued",
    }  # fmt: skip
    assert {n: j.status for n, j in bench.jobs(made.execution_id).items()} == {
        "root": JobStatus.COMPLETED, "x": JobStatus.QUEUED, "y": JobStatus.QUEUED,
        "z": JobStatus.QUEUED,
    }  # fmt: skip


def test_a_join_runs_exactly_once_when_both_parents_finish(bench: Bench) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    bench.succeed(bench.claim_node(made.execution_id, "root"), {"n": 0})
    a, b = (bench.claim_node(made.execution_id, n) for n in ("a", "b"))

    first = bench.complete(a, {"n": 1})
    second = bench.complete(b, {"n": 2})
    again = bench.complete(b, {"n": 2})  # the same outcome recorded twice

    assert (first, again) == ([], [])
    (published,) = second
    assert [j.node_id for j in bench.probe.jobs(made.execution_id)].count("join") == 1
    assert published.job_id == bench.job(made.execution_id, "join").id
    join = bench.claimed(published.job_id)
    assert join.context["nodes"] == {"a": {"n": 1}, "b": {"n": 2}}
    assert bench.probe.nodes(made.execution_id)["join"].waiting_on == 0
    assert bench.probe.execution(made.execution_id).remaining_nodes == 1


def test_a_condition_skips_the_branch_it_did_not_take_down_to_the_join_that_merges_it(
    bench: Bench,
) -> None:
    # Given a condition whose false branch has a child, merged again after both branches
    made = bench.trigger(bench.apply(
        "branches", condition("check", if_true=["yes"], if_false=["no"]),
        node("yes", "check"), node("no", "check"), node("after_no", "no"),
        node("merge", "yes", "after_no"),
    ).name, {"go": True})  # fmt: skip

    # When the condition takes its true branch
    published = bench.succeed(
        bench.claim_node(made.execution_id, "check"), {"result": True, "branch": "if_true"}
    )

    # Then the false branch is skipped, its child too, and the merge waits on the true one
    assert [d.hints.node_id for d in published if d.hints] == ["yes"]
    assert bench.statuses(made.execution_id) == {
        "check": "completed", "yes": "queued", "no": "skipped", "after_no": "skipped",
        "merge": "pending",
    }  # fmt: skip
    assert bench.probe.nodes(made.execution_id)["check"].branch == "if_true"
    assert bench.probe.execution(made.execution_id).remaining_nodes == 2
    (merge,) = bench.succeed(bench.claimed(published[0].job_id), {"n": 1})
    bench.succeed(bench.claimed(merge.job_id), {"n": 2})
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"merge": {"n": 2}})


def test_a_node_whose_needs_were_all_skipped_is_skipped_and_may_complete_the_execution(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply(
        "skip_all", condition("check", if_true=["yes"], if_false=["no"]),
        node("yes", "check"), node("no", "check"), node("last", "no"),
    ).name)  # fmt: skip
    (yes,) = bench.succeed(bench.claim_node(made.execution_id, "check"), {"branch": "if_true"})

    bench.succeed(bench.claimed(yes.job_id), {"n": 1})

    done = bench.probe.execution(made.execution_id)
    assert bench.statuses(made.execution_id)["last"] == "skipped"
    assert (done.status, done.output) == (
        ExecutionStatus.COMPLETED, {"yes": {"n": 1}, "last": None},
    )  # fmt: skip


def test_the_output_template_renders_the_execution_output(bench: Bench) -> None:
    made = bench.trigger(bench.apply(
        "templated", *CHAIN, output={"total": "{{ nodes.a.n + nodes.b.n + input.x }}"},
    ).name, {"x": 10})  # fmt: skip
    (b,) = bench.succeed(bench.claim_node(made.execution_id, "a"), {"n": 1})

    bench.succeed(bench.claimed(b.job_id), {"n": 2})

    assert bench.probe.execution(made.execution_id).output == {"total": 13}


def test_complete_alone_records_a_join_member_that_leaves_the_join_waiting(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    bench.succeed(bench.claim_node(made.execution_id, "root"), {"n": 0})
    a = bench.claim_node(made.execution_id, "a")

    assert bench.alone(a, {"n": 1})

    nodes = bench.probe.nodes(made.execution_id)
    assert (nodes["a"].status, nodes["a"].output) == (NodeStatus.COMPLETED, {"n": 1})
    assert (nodes["join"].status, nodes["join"].waiting_on) == (NodeStatus.PENDING, 1)
    assert bench.probe.execution(made.execution_id).remaining_nodes == 2
    job = bench.job(made.execution_id, "a")
    assert job.status is JobStatus.COMPLETED
    assert [a.status for a in bench.probe.attempts(job.id)] == [AttemptStatus.SUCCEEDED]


def test_complete_alone_changes_nothing_when_a_successor_would_become_ready(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    bench.succeed(bench.claim_node(made.execution_id, "root"), {"n": 0})
    a, b = (bench.claim_node(made.execution_id, n) for n in ("a", "b"))
    assert bench.alone(a, {"n": 1})
    before = bench.rows(made.execution_id)

    assert not bench.alone(b, {"n": 2})

    assert bench.rows(made.execution_id) == before


def test_complete_alone_changes_nothing_when_the_output_needs_other_nodes_outputs(
    bench: Bench,
) -> None:
    # Two sinks: the last one's settle must read the other's output for the execution's
    made = bench.trigger(bench.apply("pair", node("a"), node("b")).name)
    a, b = (bench.claim_node(made.execution_id, n) for n in ("a", "b"))
    before = bench.rows(made.execution_id)

    assert not bench.alone(a, {"n": 1})
    assert bench.rows(made.execution_id) == before

    bench.complete(a, {"n": 1})
    bench.complete(b, {"n": 2})
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (
        ExecutionStatus.COMPLETED, {"a": {"n": 1}, "b": {"n": 2}},
    )  # fmt: skip


def test_a_success_after_the_execution_was_cancelled_keeps_its_output_as_cancelled(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))
    before = bench.rows(made.execution_id)

    assert not bench.alone(run, {"n": 1})
    assert bench.rows(made.execution_id) == before
    assert bench.complete(run, {"n": 1}) == []

    job = bench.job(made.execution_id, "a")
    assert job.status is JobStatus.CANCELLED
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.output, a.error) == (
        NodeStatus.CANCELLED, {"n": 1}, "execution cancelled while the node ran",
    )  # fmt: skip
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.CANCELLED, None)
