"""Maps and child workflows together: a workflow node with ``map`` starts a child per item
(each item's job waits for its own child; the node, the map's counter, stays running), its
output the children's outputs in item order; a failed child fails its item as the map's
``on_item_failure`` says; a stop of the parent, or of the map, stops every child it started.
And a child that holds a map of its own."""

from __future__ import annotations

import uuid
from typing import Any

from conveyor.engine import cancellation
from conveyor.engine.records import Dispatch
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import NonRetryableError
from tests.support.bench import Bench, node
from tests.unit.transitions.test_children import child_node, start
from tests.unit.transitions.test_mapping import expand, item_run, items, own_job

NO_RETRY = {"retry": {"max_attempts": 1}}


def map_of_children(
    bench: Bench, rows: list[Any], *more: dict[str, Any], **fields: Any
) -> uuid.UUID:
    """A parent whose workflow node ``m`` maps over its input's rows, a child of ``kid`` (one
    node, ``one``) per row, then ``after``; triggered, and its map made: the parent."""
    bench.apply("kid", node("one"), defaults=NO_RETRY)
    spec = {"over": "{{ input.rows }}", **fields.pop("map", {})}
    inputs = {"n": "{{ item }}", "at": "{{ index }}"}
    bench.apply("mom", child_node("m", "kid", map=spec, inputs=inputs, **fields),
                node("after", "m"), *more, defaults=NO_RETRY)  # fmt: skip
    parent_id = bench.trigger("mom", {"rows": rows}).execution_id
    expand(bench, parent_id)
    return parent_id


def start_item(bench: Bench, parent_id: uuid.UUID, index: int) -> uuid.UUID:
    """Item ``index``'s try claimed and its child started: the child."""
    started = start(bench, item_run(bench, parent_id, index))
    assert started.waiting and started.child_id is not None
    return started.child_id


def finish(bench: Bench, child_id: uuid.UUID, output: Any) -> list[Dispatch]:
    return bench.succeed(bench.claim_node(child_id, "one"), output)


def test_a_map_of_children_starts_a_child_per_item_with_its_item_and_waits_running(
    bench: Bench,
) -> None:
    parent_id = map_of_children(bench, [10, 20, 30])

    kids = [start_item(bench, parent_id, i) for i in range(3)]

    # Then each item's job waits for its own child, started with its item and index
    assert [j.status for j in items(bench, parent_id)] == [JobStatus.WAITING_CHILD] * 3
    assert [bench.probe.execution(k).input for k in kids] == [
        {"n": 10, "at": 0}, {"n": 20, "at": 1}, {"n": 30, "at": 2},
    ]  # fmt: skip
    links = [bench.probe.execution(k).parent for k in kids]
    assert [(p.node_id, p.job_id, p.try_number) for p in links if p] == [
        ("m", j.id, 1) for j in items(bench, parent_id)
    ]
    # and the map node stays running, its counter untouched, while its children run
    m = bench.probe.nodes(parent_id)["m"]
    assert (m.status, m.items_total, m.items_left) == (NodeStatus.RUNNING, 3, 3)
    assert own_job(bench, parent_id).status is JobStatus.COMPLETED


def test_a_map_of_children_completes_with_their_outputs_in_item_order_and_goes_on_once(
    bench: Bench,
) -> None:
    parent_id = map_of_children(bench, [10, 20, 30])
    kids = [start_item(bench, parent_id, i) for i in range(3)]

    # When the children finish last first
    published = [finish(bench, kids[i], {"v": i}) for i in (2, 0, 1)]

    # Then the node completed with their outputs in item order, and "after" started once
    assert [[d.node for d in p] for p in published] == [[], [], ["after"]]
    m = bench.probe.nodes(parent_id)["m"]
    assert (m.status, m.output, m.items_left) == (
        NodeStatus.COMPLETED, [{"one": {"v": 0}}, {"one": {"v": 1}}, {"one": {"v": 2}}], 0,
    )  # fmt: skip
    for job in items(bench, parent_id):
        assert job.status is JobStatus.COMPLETED
        assert [a.status for a in bench.probe.attempts(job.id)] == [AttemptStatus.SUCCEEDED]
    bench.succeed(bench.claim_node(parent_id, "after"), {"done": True})
    assert bench.probe.execution(parent_id).status is ExecutionStatus.COMPLETED


def test_a_map_of_children_s_concurrency_starts_the_next_child_as_one_finishes(
    bench: Bench,
) -> None:
    parent_id = map_of_children(bench, [1, 2, 3], map={"concurrency": 1})
    assert [j.status.value for j in items(bench, parent_id)] == ["queued", "held", "held"]
    first = start_item(bench, parent_id, 0)

    # When the first child finishes, its transaction releases the second item
    (released,) = finish(bench, first, {"v": 1})

    assert released.job_id == items(bench, parent_id)[1].id
    assert [j.status.value for j in items(bench, parent_id)] == ["completed", "queued", "held"]


def test_a_failed_child_fails_its_item_and_fail_fast_stops_the_map_s_other_children(
    bench: Bench,
) -> None:
    # Given a map of children that continues on failure, beside another workflow node
    bench.apply("other_kid", node("two"))
    parent_id = map_of_children(bench, [1, 2, 3], child_node("side", "other_kid"),
                                continue_on_failure=True)  # fmt: skip
    kids = [start_item(bench, parent_id, i) for i in range(2)]  # item 2 not started yet
    start(bench, bench.claim_node(parent_id, "side"))
    (side,) = bench.units.run(lambda s: s.active_children(parent_id, "side"))

    # When the first child's node dies
    bench.fail(bench.claim_node(kids[0], "one"), NonRetryableError("no"))

    # Then its item is dead, the map failed, its other items cancelled and their child
    # stopped; the parent goes on (its node continues on failure), its other child too
    assert [j.status for j in items(bench, parent_id)] == [
        JobStatus.DEAD_LETTER, JobStatus.CANCELLED, JobStatus.CANCELLED,
    ]  # fmt: skip
    m = bench.probe.nodes(parent_id)["m"]
    assert m.status is NodeStatus.FAILED
    assert m.error == (
        f"item 0 failed after 1 attempt(s): child execution {kids[0]} failed at node 'one' "
        f"(dead letter {bench.job(kids[0], 'one').id}): node 'one' failed after 1 attempt(s): no"
    )
    stopped = bench.probe.execution(kids[1])
    assert stopped.status is ExecutionStatus.CANCELLED
    assert stopped.error == (
        f"its parent execution {parent_id} stopped: map node 'm' failed: {m.error}"
    )
    assert bench.probe.execution(parent_id).status is ExecutionStatus.RUNNING
    assert bench.probe.execution(side).status is ExecutionStatus.RUNNING
    assert bench.statuses(parent_id)["after"] == "queued"


def test_under_continue_a_failed_child_s_error_takes_its_item_s_slot(bench: Bench) -> None:
    parent_id = map_of_children(bench, [1, 2], map={"on_item_failure": "continue"})
    kids = [start_item(bench, parent_id, i) for i in range(2)]

    bench.fail(bench.claim_node(kids[1], "one"), NonRetryableError("bad row"))
    finish(bench, kids[0], {"v": 1})

    output = bench.probe.nodes(parent_id)["m"].output
    assert output[0] == {"one": {"v": 1}}
    assert output[1]["error"].startswith(f"child execution {kids[1]} failed at node 'one'")


def test_cancelling_the_parent_cancels_every_running_child_of_its_map(bench: Bench) -> None:
    parent_id = map_of_children(bench, [1, 2, 3], map={"concurrency": 2})
    kids = [start_item(bench, parent_id, i) for i in range(2)]
    running = bench.claim_node(kids[0], "one")  # a child's node mid-try

    stopped = bench.units.run(lambda s: cancellation.cancel_execution(s, parent_id, bench.clock()))

    assert stopped.finished and stopped.dispatches == []
    assert [bench.probe.execution(k).status for k in kids] == [ExecutionStatus.CANCELLED] * 2
    assert [j.status for j in items(bench, parent_id)] == [JobStatus.CANCELLED] * 3
    assert bench.statuses(parent_id) == {"m": "cancelled", "after": "cancelled"}
    # the child's node, returning now, settles nothing of its parent's
    assert bench.complete(running, {"late": True}) == []
    assert bench.probe.nodes(parent_id)["m"].status is NodeStatus.CANCELLED


def test_a_child_that_holds_a_map_completes_its_parent_s_node_with_the_map_s_output(
    bench: Bench,
) -> None:
    # Given a child whose one node maps over its input, and a parent that starts it
    bench.apply("kid", node("m", map={"over": "{{ input.rows }}"}), defaults=NO_RETRY)
    bench.apply("mom", child_node("call", "kid", inputs={"rows": "{{ input.rows }}"}),
                node("after", "call"))  # fmt: skip
    parent_id = bench.trigger("mom", {"rows": ["a", "b"]}).execution_id
    started = start(bench, bench.claim_node(parent_id, "call"))
    assert started.child_id is not None
    kid = started.child_id
    expand(bench, kid)

    # When the child's items finish
    bench.complete(item_run(bench, kid, 1), "B")
    published = bench.complete(item_run(bench, kid, 0), "A")

    # Then the child completed with its map's output, and the parent's node with it
    assert bench.probe.execution(kid).output == {"m": ["A", "B"]}
    assert bench.probe.nodes(parent_id)["call"].output == {"m": ["A", "B"]}
    assert [d.node for d in published] == ["after"]


def test_an_empty_map_of_children_starts_none_and_completes_at_once(bench: Bench) -> None:
    parent_id = map_of_children(bench, [])

    assert bench.probe.nodes(parent_id)["m"].output == []
    assert items(bench, parent_id) == []
    assert bench.units.run(lambda s: s.active_children(parent_id)) == []


def test_a_map_chained_after_a_map_of_children_maps_over_the_children_s_outputs(
    bench: Bench,
) -> None:
    # Given a second map over the first map's outputs, each a child's
    parent_id = map_of_children(
        bench, [1, 2], node("m2", "m", map={"over": "{{ nodes.m }}"},
                            inputs={"v": "{{ item.one.v }}"}),
    )  # fmt: skip
    kids = [start_item(bench, parent_id, i) for i in range(2)]
    finish(bench, kids[0], {"v": 10})
    (published,) = [d for d in finish(bench, kids[1], {"v": 20}) if d.node == "m2"]

    # When its own try makes its items from the children's outputs
    assert published.job_id == own_job(bench, parent_id, "m2").id
    expand(bench, parent_id, node_id="m2")
    runs = [item_run(bench, parent_id, i, "m2") for i in range(2)]

    # Then each item reads its child's output, and the second map completes in order
    assert [r.context["item"] for r in runs] == [{"one": {"v": 10}}, {"one": {"v": 20}}]
    bench.complete(runs[1], "b")
    bench.complete(runs[0], "a")
    assert bench.probe.nodes(parent_id)["m2"].output == ["a", "b"]
