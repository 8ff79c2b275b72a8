"""A map node (conveyor.engine.mapping): its own try makes a job per item, a window of them
queued and the rest held; each item that settles releases the next; the last finishes the node
with the outputs in item order and settles it once; an item's failure goes as the map's
on_item_failure says; a cancel stops the items not started."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest

from conveyor.engine import cancellation, dead_letters, mapping, outcomes, success
from conveyor.engine.claiming import NodeRun
from conveyor.engine.records import Dispatch, NewItem
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import InvalidTransition, NonRetryableError, Skip, Snooze
from conveyor.testing import JobRow
from tests.support.bench import Bench, node

NO_RETRY = {"retry": {"max_attempts": 1}}


def mapped(over: str = "{{ input.rows }}", *needs: str, **spec: Any) -> dict[str, Any]:
    return node("m", *needs, map={"over": over, **spec})


def start(
    bench: Bench, items: Any, *nodes: dict[str, Any], window: int = 1000, **spec: Any
) -> tuple[uuid.UUID, list[Dispatch]]:
    """A workflow whose root maps over its input's ``rows``, triggered and its map node's
    own try run: the execution, and the item messages it published."""
    name = bench.apply("mapping", mapped(**spec), *nodes, defaults=NO_RETRY).name
    made = bench.trigger(name, {"rows": items})
    return made.execution_id, expand(bench, made.execution_id, window)


def expand(
    bench: Bench, execution_id: uuid.UUID, window: int = 1000, node_id: str = "m"
) -> list[Dispatch]:
    run = bench.claimed(own_job(bench, execution_id, node_id).id)
    items = mapping.items_of(run)
    return bench.units.run(
        lambda s: success.expand(s, run, items, bench.clock(), 0.01, window)
    ).dispatches


def own_job(bench: Bench, execution_id: uuid.UUID, node_id: str = "m") -> JobRow:
    (found,) = [
        j for j in bench.probe.jobs(execution_id) if j.node_id == node_id and j.item_index is None
    ]
    return found


def items(bench: Bench, execution_id: uuid.UUID, node_id: str = "m") -> list[JobRow]:
    found = [
        j
        for j in bench.probe.jobs(execution_id)
        if j.node_id == node_id and j.item_index is not None
    ]
    return sorted(found, key=lambda j: j.item_index or 0)


def statuses(bench: Bench, execution_id: uuid.UUID, node_id: str = "m") -> list[str]:
    return [j.status.value for j in items(bench, execution_id, node_id)]


def item_run(bench: Bench, execution_id: uuid.UUID, index: int, node_id: str = "m") -> NodeRun:
    return bench.claimed(items(bench, execution_id, node_id)[index].id)


def test_a_map_makes_a_job_per_item_queued_up_to_its_window_and_the_rest_held(
    bench: Bench,
) -> None:
    execution_id, published = start(bench, ["a", "b", "c", "d", "e"], window=2)

    assert statuses(bench, execution_id) == ["queued", "queued", "held", "held", "held"]
    assert [j.item for j in items(bench, execution_id)] == ["a", "b", "c", "d", "e"]
    assert [d.job_id for d in published] == [j.id for j in items(bench, execution_id)[:2]]
    assert {d.node for d in published} == {"m"}
    own = own_job(bench, execution_id)
    assert own.status is JobStatus.COMPLETED
    assert [a.status for a in bench.probe.attempts(own.id)] == [AttemptStatus.SUCCEEDED]
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.items_total, m.items_left, m.items_failed) == (
        NodeStatus.RUNNING, 5, 5, 0,
    )  # fmt: skip


def test_a_long_list_is_stored_in_chunks_and_only_its_window_is_queued(bench: Bench) -> None:
    execution_id, published = start(bench, list(range(2500)), window=1200)

    found = items(bench, execution_id)
    assert [j.item_index for j in found] == list(range(2500))
    assert [j.item for j in found[1199:1201]] == [1199, 1200]
    assert [j.status for j in found].count(JobStatus.QUEUED) == len(published) == 1200
    assert {j.status for j in found[1200:]} == {JobStatus.HELD}
    assert bench.probe.nodes(execution_id)["m"].items_total == 2500


def test_a_map_s_concurrency_below_the_window_queues_that_many(bench: Bench) -> None:
    execution_id, published = start(bench, list(range(6)), window=4, concurrency=3)

    assert len(published) == 3
    assert statuses(bench, execution_id) == ["queued"] * 3 + ["held"] * 3


def test_an_item_s_try_sees_its_item_and_index_and_leaves_its_node_to_the_map(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, [{"n": 1}, {"n": 2}])

    run = item_run(bench, execution_id, 1)

    assert (run.context["item"], run.context["index"]) == ({"n": 2}, 1)
    assert (run.job.item_index, run.job.item) == (1, {"n": 2})
    assert bench.probe.nodes(execution_id)["m"].status is NodeStatus.RUNNING
    assert not bench.alone(run, {"out": 2})  # never the one-statement success


def test_an_item_claimed_by_its_hints_is_not_sent_the_input_its_templates_do_not_read(
    bench: Bench,
) -> None:
    # Given a map over its input's rows, last in its workflow, whose output reads the input
    output = {"tag": "{{ input.tag }}", "m": "{{ nodes.m }}"}
    name = bench.apply("mapping", mapped(), defaults=NO_RETRY, output=output).name
    made = bench.trigger(name, {"rows": [1, 2], "tag": "t"})
    (own,) = made.dispatches

    # When the map node's own job and then its items are claimed as their messages hint them
    expanding = bench.claimed(own.job_id, own.hints)
    published = bench.units.run(
        lambda s: success.expand(
            s, expanding, mapping.items_of(expanding), bench.clock(), 0.01, 1000
        )
    ).dispatches  # fmt: skip
    runs = [bench.claimed(d.job_id, d.hints) for d in published]

    # Then the own job read the list from the input, the items did not read the input, and the
    # last item's settle read it for the execution's output
    assert mapping.items_of(expanding) == [1, 2]
    assert [(r.execution.input, r.context["input"]) for r in runs] == [(None, None)] * 2
    for run, output in zip(runs, ["one", "two"], strict=True):
        bench.complete(run, output)
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (
        ExecutionStatus.COMPLETED, {"tag": "t", "m": ["one", "two"]},
    )  # fmt: skip


def test_a_map_failed_by_an_item_not_sent_the_input_settles_with_the_input(bench: Bench) -> None:
    # Given a fail_fast map that continues on failure, whose workflow's output reads the input
    mapping_node = {**mapped(), "continue_on_failure": True}
    output = {"tag": "{{ input.tag }}"}
    name = bench.apply("mapping", mapping_node, defaults=NO_RETRY, output=output).name
    made = bench.trigger(name, {"rows": [1, 2], "tag": "t"})
    published = expand(bench, made.execution_id)
    dead = bench.claimed(published[0].job_id, published[0].hints)
    assert dead.execution.input is None

    # When its first item dies
    bench.fail(dead, NonRetryableError("bad item"))

    # Then the node failed, and the execution went on without it to its output
    assert bench.statuses(made.execution_id) == {"m": "failed"}
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"tag": "t"})


def test_an_item_whose_templates_read_the_input_is_claimed_with_it(bench: Bench) -> None:
    name = bench.apply(
        "mapping", mapped() | {"inputs": {"v": "{{ input.tag }}-{{ item }}"}}, defaults=NO_RETRY
    ).name
    made = bench.trigger(name, {"rows": [1], "tag": "t"})
    (published,) = expand(bench, made.execution_id)

    run = bench.claimed(published.job_id, published.hints)

    assert run.context["input"] == {"rows": [1], "tag": "t"}


def test_each_settled_item_releases_the_held_item_a_window_after_it(bench: Bench) -> None:
    execution_id, _ = start(bench, list(range(5)), window=2)

    # When the second item settles first, then the first, then the one the second released
    first = bench.complete(item_run(bench, execution_id, 1), "one")
    second = bench.complete(item_run(bench, execution_id, 0), "zero")

    # Then each released the item two places after it, which its job named
    jobs = items(bench, execution_id)
    assert [d.job_id for d in first] == [jobs[3].id]
    assert [d.job_id for d in second] == [jobs[2].id]
    assert statuses(bench, execution_id) == [
        "completed", "completed", "queued", "queued", "held",
    ]  # fmt: skip
    assert bench.probe.nodes(execution_id)["m"].items_left == 3
    assert [d.job_id for d in bench.complete(item_run(bench, execution_id, 3), "three")] == []
    assert [d.job_id for d in bench.complete(item_run(bench, execution_id, 2), "two")] == [
        jobs[4].id
    ]
    assert [j.data for j in jobs] == [
        {"releases": 2}, {"releases": 3}, {"releases": 4}, {}, {},
    ]  # fmt: skip


def fast(bench: Bench, run: NodeRun, output: Any) -> list[Dispatch] | None:
    """As the service records a success first: in one step where it can."""
    return bench.units.autocommit(
        lambda s: success.complete_fast(s, run, output, bench.clock(), 0.01)
    )  # fmt: skip


def test_an_item_that_is_not_its_map_s_last_succeeds_in_one_step_releasing_the_next(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, [0, 1, 2], node("after", "m"), window=1)
    first = item_run(bench, execution_id, 0)

    released = fast(bench, first, "zero")

    jobs = items(bench, execution_id)
    assert [d.job_id for d in released or []] == [jobs[1].id]
    assert (released or [])[0].hints is not None  # published with its hints, as any job
    assert statuses(bench, execution_id) == ["completed", "queued", "held"]
    assert (jobs[0].output, bench.probe.nodes(execution_id)["m"].items_left) == ("zero", 2)
    assert [a.status for a in bench.probe.attempts(jobs[0].id)] == [AttemptStatus.SUCCEEDED]
    assert [d.job_id for d in fast(bench, item_run(bench, execution_id, 1), "one") or []] == [
        jobs[2].id
    ]
    # The last is not done in one step (nothing changed): the transaction finishes the node
    last = item_run(bench, execution_id, 2)
    assert fast(bench, last, "two") is None
    assert statuses(bench, execution_id) == ["completed", "completed", "processing"]
    (after,) = bench.complete(last, "two")
    assert after.job_id == own_job(bench, execution_id, "after").id
    assert bench.probe.nodes(execution_id)["m"].output == ["zero", "one", "two"]


def test_an_item_of_a_map_that_failed_is_not_done_in_one_step(bench: Bench) -> None:
    execution_id, _ = start(bench, [0, 1, 2])
    late = item_run(bench, execution_id, 1)
    bench.fail(item_run(bench, execution_id, 0), NonRetryableError("bad"))

    assert fast(bench, late, "late") is None
    assert statuses(bench, execution_id)[1] == "processing"


def test_the_last_item_finishes_the_node_with_the_outputs_in_item_order_and_its_successor_once(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, ["x", "y", "z"], node("after", "m"))
    runs = [item_run(bench, execution_id, i) for i in range(3)]

    # When the items finish out of order
    assert bench.complete(runs[2], {"v": "Z"}) == []
    assert bench.complete(runs[0], {"v": "X"}) == []
    (published,) = bench.complete(runs[1], {"v": "Y"})
    again = bench.complete(runs[1], {"v": "Y"})  # the same outcome recorded twice

    # Then the node's output is theirs in item order, and its successor was made ready once
    assert again == []
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.output, m.items_left) == (
        NodeStatus.COMPLETED, [{"v": "X"}, {"v": "Y"}, {"v": "Z"}], 0,
    )  # fmt: skip
    assert published.job_id == own_job(bench, execution_id, "after").id
    after = bench.claimed(published.job_id)
    assert after.context["nodes"]["m"] == [{"v": "X"}, {"v": "Y"}, {"v": "Z"}]
    assert bench.probe.execution(execution_id).remaining_nodes == 1
    bench.succeed(after, {"done": True})
    assert bench.probe.execution(execution_id).status is ExecutionStatus.COMPLETED


def test_a_map_that_is_the_last_node_completes_its_execution_with_its_output(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, [1, 2])

    bench.complete(item_run(bench, execution_id, 0), 10)
    bench.complete(item_run(bench, execution_id, 1), 20)

    done = bench.probe.execution(execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"m": [10, 20]})


def test_an_empty_list_completes_the_map_at_once_with_an_empty_output(bench: Bench) -> None:
    execution_id, published = start(bench, [], node("after", "m"))

    (after,) = published
    assert items(bench, execution_id) == []
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.output, m.items_total) == (NodeStatus.COMPLETED, [], None)
    assert after.job_id == own_job(bench, execution_id, "after").id


@pytest.mark.parametrize(
    ("given", "kind"),
    [({"a": 1}, "a dict"), ("abc", "a string"), (3, "a number"), (None, "null")],
)
def test_a_map_over_something_not_a_list_fails_its_node_naming_the_template_and_the_type(
    bench: Bench, given: Any, kind: str
) -> None:
    name = bench.apply("mapping", mapped(), defaults=NO_RETRY).name
    made = bench.trigger(name, {"rows": given})
    run = bench.claimed(own_job(bench, made.execution_id).id)

    with pytest.raises(NonRetryableError) as raised:
        mapping.items_of(run)
    failed = bench.fail(run, raised.value)

    assert str(raised.value).startswith(f"map over `{{{{ input.rows }}}}` gave {kind}, not a list")
    assert failed.outcome is JobStatus.DEAD_LETTER
    m = bench.probe.nodes(made.execution_id)["m"]
    assert m.status is NodeStatus.FAILED and "not a list" in (m.error or "")
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED


def test_a_map_over_a_dict_s_method_says_how_to_read_the_key(bench: Bench) -> None:
    name = bench.apply("mapping", mapped("{{ input.items }}"), defaults=NO_RETRY).name
    made = bench.trigger(name, {"items": [1, 2]})
    run = bench.claimed(own_job(bench, made.execution_id).id)

    with pytest.raises(NonRetryableError, match=r"write input\['items'\]"):
        mapping.items_of(run)


def test_a_list_longer_than_the_limit_fails_its_node_naming_the_template_length_and_limit(
    bench: Bench,
) -> None:
    name = bench.apply("mapping", mapped(), defaults={"retry": {"max_attempts": 3}}).name
    made = bench.trigger(name, {"rows": list(range(11))})
    run = bench.claimed(own_job(bench, made.execution_id).id)

    with pytest.raises(NonRetryableError) as raised:
        mapping.items_of(run, 10)
    failed = bench.fail(run, raised.value)

    assert str(raised.value) == (
        "map over `{{ input.rows }}` gave a list of 11 items, more than the limit of 10 "
        "(CONVEYOR_MAP_MAX_ITEMS); give fewer items (map over batches of them, or split the "
        "list between maps), or raise CONVEYOR_MAP_MAX_ITEMS"
    )
    assert failed.outcome is JobStatus.DEAD_LETTER  # not retried: it has tries left
    assert items(bench, made.execution_id) == []
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED


def test_a_map_s_max_items_lowers_the_limit_and_cannot_raise_it(bench: Bench) -> None:
    name = bench.apply("mapping", mapped(max_items=3), defaults=NO_RETRY).name
    run = bench.claimed(own_job(bench, bench.trigger(name, {"rows": [1, 2, 3, 4]}).execution_id).id)
    with pytest.raises(NonRetryableError) as raised:
        mapping.items_of(run, 10)
    assert "more than the map's max_items of 3; " in str(raised.value)
    assert str(raised.value).endswith("raise max_items (up to CONVEYOR_MAP_MAX_ITEMS, 10)")

    wide = bench.apply("wide", mapped(max_items=50), defaults=NO_RETRY).name
    run = bench.claimed(own_job(bench, bench.trigger(wide, {"rows": [0] * 11}).execution_id).id)
    with pytest.raises(NonRetryableError, match="more than the limit of 10 "):
        mapping.items_of(run, 10)


def test_a_list_of_the_default_limit_maps(bench: Bench) -> None:
    # the size: 100,000 items in one map must work
    name = bench.apply("mapping", mapped(), defaults=NO_RETRY).name
    made = bench.trigger(name, {"rows": list(range(mapping.DEFAULT_MAX_ITEMS))})
    run = bench.claimed(own_job(bench, made.execution_id).id)

    assert len(mapping.items_of(run)) == 100_000


def test_fail_fast_fails_the_node_at_the_first_dead_item_and_cancels_the_items_not_started(
    bench: Bench,
) -> None:
    # Given a map of five, two running, three held, and a node beside it still to run
    execution_id, _ = start(bench, list(range(5)), node("beside"), window=2)
    dead, running = item_run(bench, execution_id, 0), item_run(bench, execution_id, 1)

    failed = bench.fail(dead, NonRetryableError("bad item"))

    assert failed.outcome is JobStatus.DEAD_LETTER
    assert statuses(bench, execution_id) == [
        "dead_letter", "processing", "cancelled", "cancelled", "cancelled",
    ]  # fmt: skip
    m = bench.probe.nodes(execution_id)["m"]
    assert m.status is NodeStatus.FAILED
    assert m.error == "item 0 failed after 1 attempt(s): bad item"
    execution = bench.probe.execution(execution_id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.error == "node 'm' failed: item 0 failed after 1 attempt(s): bad item"
    assert bench.statuses(execution_id)["beside"] == "cancelled"
    # An item still running then ends: recorded on its job, the map left as it failed
    assert bench.complete(running, "late") == []
    assert statuses(bench, execution_id)[1] == "cancelled"
    assert bench.probe.nodes(execution_id)["m"].status is NodeStatus.FAILED


def test_an_item_claimed_after_its_execution_failed_leaves_its_failed_map_as_it_failed(
    bench: Bench,
) -> None:
    # Given a map failed fast, its execution with it, and an item queued all the same (as a
    # release racing the failure may leave it on PostgreSQL)
    execution_id, _ = start(bench, [0, 1, 2])
    bench.fail(item_run(bench, execution_id, 0), NonRetryableError("bad item"))
    late = items(bench, execution_id)[2]
    with bench.store() as store:
        assert store.transition_job(late.id, JobStatus.CANCELLED, JobStatus.QUEUED)

    # When its message is claimed
    assert bench.claim(late.id) is None

    # Then the item is cancelled, and the map keeps its failure and its error
    assert bench.probe.job(late.id).status is JobStatus.CANCELLED
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.error) == (
        NodeStatus.FAILED, "item 0 failed after 1 attempt(s): bad item",
    )  # fmt: skip


def test_a_map_failing_fast_returns_the_jobs_it_cancelled_for_the_limiter_to_forget(
    bench: Bench,
) -> None:
    # Given a map of five, three queued (the first running), two held, and a node beside it
    execution_id, _ = start(bench, list(range(5)), node("beside"), window=3)

    failed = bench.fail(item_run(bench, execution_id, 0), NonRetryableError("bad item"))

    # Then the items queued and the node beside it, which the limiter may hold in its lines
    # (the held items it never saw), are returned for the caller to forget after commit
    jobs = items(bench, execution_id)
    assert sorted(failed.forget) == sorted(
        [jobs[1].id, jobs[2].id, bench.job(execution_id, "beside").id]
    )


def test_a_run_all_map_failed_by_its_last_item_s_success_returns_the_jobs_its_stop_cancelled(
    bench: Bench,
) -> None:
    name = bench.apply(
        "mapping", mapped(on_item_failure="run_all"), node("beside"), defaults=NO_RETRY
    ).name
    made = bench.trigger(name, {"rows": [1, 2]})
    expand(bench, made.execution_id)
    bench.fail(item_run(bench, made.execution_id, 0), NonRetryableError("no"))

    last = item_run(bench, made.execution_id, 1)
    after = bench.units.run(lambda s: success.complete_node(s, last, "two", bench.clock(), 0.01))

    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.FAILED
    assert after.forget == [bench.job(made.execution_id, "beside").id]


def test_fail_fast_fails_the_node_once_when_two_items_die(bench: Bench) -> None:
    name = bench.apply(
        "mapping", {**mapped(), "continue_on_failure": True}, node("after", "m"),
        defaults=NO_RETRY,
    ).name  # fmt: skip
    made = bench.trigger(name, {"rows": [1, 2, 3]})
    expand(bench, made.execution_id)
    first, second = (item_run(bench, made.execution_id, i) for i in (0, 1))

    (after,) = bench.fail(first, NonRetryableError("one")).dispatches
    assert bench.fail(second, NonRetryableError("two")).dispatches == []

    assert after.job_id == own_job(bench, made.execution_id, "after").id
    m = bench.probe.nodes(made.execution_id)["m"]
    assert (m.status, m.error) == (NodeStatus.FAILED, "item 0 failed after 1 attempt(s): one")
    assert statuses(bench, made.execution_id) == ["dead_letter", "dead_letter", "cancelled"]
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING


def test_run_all_runs_every_item_then_fails_the_node_listing_the_failed_indices(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, list(range(4)), window=2, on_item_failure="run_all")

    bench.fail(item_run(bench, execution_id, 0), NonRetryableError("zero broke"))
    bench.complete(item_run(bench, execution_id, 1), "one")
    bench.fail(item_run(bench, execution_id, 2), NonRetryableError("two broke"))
    assert bench.probe.execution(execution_id).status is ExecutionStatus.RUNNING
    bench.complete(item_run(bench, execution_id, 3), "three")

    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.items_left, m.items_failed) == (NodeStatus.FAILED, 0, 2)
    assert m.error == (
        "2 of 4 items failed (indices 0, 2); item 0: zero broke (the error is not retryable)"
    )
    execution = bench.probe.execution(execution_id)
    assert (execution.status, execution.error) == (
        ExecutionStatus.FAILED,
        f"node 'm' failed: {m.error}",
    )


def test_continue_completes_the_node_with_each_failed_item_s_error_in_its_slot(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, ["a", "b", "c"], on_item_failure="continue")

    bench.complete(item_run(bench, execution_id, 0), "A")
    bench.fail(item_run(bench, execution_id, 1), NonRetryableError("no b"))
    bench.complete(item_run(bench, execution_id, 2), "C")

    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.items_failed) == (NodeStatus.COMPLETED, 1)
    assert m.output == ["A", {"error": "no b (the error is not retryable)"}, "C"]
    assert bench.probe.execution(execution_id).status is ExecutionStatus.COMPLETED


def test_a_map_whose_items_outputs_together_are_too_large_fails_its_node_once(
    bench: Bench,
) -> None:
    # Given a map of three items, each output 49 characters as JSON: 153 for the list
    execution_id, _ = start(bench, ["a", "b", "c"], node("after", "m"))
    big = {"v": "x" * 40}
    bench.complete(item_run(bench, execution_id, 0), big)
    bench.complete(item_run(bench, execution_id, 1), big)
    last = replace(item_run(bench, execution_id, 2), output_bytes=100)

    # When the last item settles, under an output bound of 100 bytes (twice)
    assert bench.complete(last, big) == []
    before = bench.rows(execution_id)
    assert bench.complete(last, big) == []

    # Then the node failed, naming its size and the bound, and the execution with it, once
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.output, m.items_left) == (NodeStatus.FAILED, None, 0)
    assert m.error == (
        "its output (the list of its items' outputs) is 153 bytes, over the limit of 100 "
        "bytes (CONVEYOR_MAX_OUTPUT_BYTES); make its items return less (keep large data "
        "elsewhere and return a reference to it), or raise CONVEYOR_MAX_OUTPUT_BYTES"
    )
    execution = bench.probe.execution(execution_id)
    assert (execution.status, execution.error) == (
        ExecutionStatus.FAILED,
        f"node 'm' failed: {m.error}",
    )
    assert bench.statuses(execution_id)["after"] == "cancelled"
    assert statuses(bench, execution_id) == ["completed"] * 3
    assert bench.rows(execution_id) == before


def test_items_size_is_the_length_of_the_output_the_map_makes(bench: Bench) -> None:
    execution_id, _ = start(bench, ["a", "b", "c", "d"], on_item_failure="continue")
    bench.complete(item_run(bench, execution_id, 0), {"v": 1, "w": [1.5, "a", None]})
    bench.fail(item_run(bench, execution_id, 1), NonRetryableError("no b"))
    bench.complete(item_run(bench, execution_id, 2), None)
    bench.complete(item_run(bench, execution_id, 3), "d")

    output = bench.probe.nodes(execution_id)["m"].output
    with bench.store() as store:
        size = store.items_size(execution_id, "m")
    assert output == [{"v": 1, "w": [1.5, "a", None]}, {"error": "no b (the error is not "
                      "retryable)"}, None, "d"]  # fmt: skip
    assert size == len(json.dumps(output))


def test_an_item_s_retry_waits_as_any_job_s_and_leaves_its_node_running(bench: Bench) -> None:
    name = bench.apply("mapping", mapped(), defaults={"retry": {"max_attempts": 2}}).name
    made = bench.trigger(name, {"rows": [1, 2]})
    expand(bench, made.execution_id)

    failed = bench.fail(item_run(bench, made.execution_id, 0), RuntimeError("flaky"))

    assert failed.outcome is JobStatus.RETRY_WAIT
    assert statuses(bench, made.execution_id) == ["retry_wait", "queued"]
    m = bench.probe.nodes(made.execution_id)["m"]
    assert (m.status, m.error, m.items_left) == (NodeStatus.RUNNING, None, 2)


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        (
            "a retryable failure",
            "RuntimeError: flaky (not retried: its map node 'm' failed while it ran)",
        ),
        ("a snooze", "snoozed, not run again: its map node 'm' failed while it ran"),
    ],
)
def test_an_item_of_a_map_that_failed_fast_is_not_tried_again(
    bench: Bench, outcome: str, error: str
) -> None:
    # Given a map failed fast by its first item, its execution going on (the node continues
    # on failure), and another item running with tries to spare
    name = bench.apply(
        "mapping", {**mapped(), "continue_on_failure": True}, node("after", "m"),
        defaults={"retry": {"max_attempts": 3}},
    ).name  # fmt: skip
    made = bench.trigger(name, {"rows": [1, 2, 3]})
    expand(bench, made.execution_id)
    dead, running = item_run(bench, made.execution_id, 0), item_run(bench, made.execution_id, 1)
    bench.fail(dead, NonRetryableError("bad item"))

    # When the running item fails as a retry would follow, or snoozes
    if outcome == "a snooze":
        failed = bench.units.run(
            lambda s: outcomes.snooze_node(s, running, Snooze(1), bench.clock(), 0.01)
        )
    else:
        failed = bench.fail(running, RuntimeError("flaky"))

    # Then its job ends cancelled: no try follows
    assert failed.outcome is JobStatus.CANCELLED
    assert statuses(bench, made.execution_id) == ["dead_letter", "cancelled", "cancelled"]
    assert items(bench, made.execution_id)[1].last_error == error
    assert len(bench.probe.attempts(running.job.id)) == 1
    assert bench.probe.nodes(made.execution_id)["m"].status is NodeStatus.FAILED
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING


def test_an_item_that_skips_itself_settles_with_none_in_its_slot(bench: Bench) -> None:
    execution_id, _ = start(bench, [1, 2])
    run = item_run(bench, execution_id, 0)

    skipped = bench.units.run(
        lambda s: outcomes.skip_node(s, run, Skip("nothing to do"), bench.clock(), 0.01)
    )
    bench.complete(item_run(bench, execution_id, 1), "two")

    assert skipped.skipped
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.output) == (NodeStatus.COMPLETED, [None, "two"])


def test_cancelling_the_execution_cancels_the_items_not_started(bench: Bench) -> None:
    execution_id, _ = start(bench, list(range(5)), window=3)
    running = item_run(bench, execution_id, 0)

    forget = bench.units.run(
        lambda s: cancellation.cancel_execution(s, execution_id, bench.clock())
    ).forget

    jobs = items(bench, execution_id)
    assert sorted(forget) == sorted(j.id for j in jobs[1:3])  # queued ones; the held unknown
    assert statuses(bench, execution_id) == ["processing"] + ["cancelled"] * 4
    assert bench.probe.nodes(execution_id)["m"].status is NodeStatus.CANCELLED
    # The running item ends: cancelled, its output kept; the node stays cancelled
    assert bench.complete(running, "late") == []
    assert statuses(bench, execution_id)[0] == "cancelled"
    assert bench.probe.nodes(execution_id)["m"].status is NodeStatus.CANCELLED


def test_a_map_s_own_try_ending_after_its_execution_was_cancelled_makes_no_item(
    bench: Bench,
) -> None:
    name = bench.apply("mapping", mapped(), defaults=NO_RETRY).name
    made = bench.trigger(name, {"rows": [1, 2, 3]})
    run = bench.claimed(own_job(bench, made.execution_id).id)
    bench.units.run(lambda s: cancellation.cancel_execution(s, made.execution_id, bench.clock()))

    published = bench.units.run(
        lambda s: success.expand(s, run, mapping.items_of(run), bench.clock(), 0.01, 1000)
    ).dispatches

    assert (published, items(bench, made.execution_id)) == ([], [])
    assert own_job(bench, made.execution_id).status is JobStatus.CANCELLED
    assert bench.probe.nodes(made.execution_id)["m"].status is NodeStatus.CANCELLED


def test_a_map_chained_after_a_map_maps_over_its_outputs(bench: Bench) -> None:
    name = bench.apply(
        "chained", mapped(),
        node("m2", "m", map={"over": "{{ nodes.m }}"}, inputs={"value": "{{ item.v }}"}),
        defaults=NO_RETRY,
    ).name  # fmt: skip
    made = bench.trigger(name, {"rows": [1, 2]})
    expand(bench, made.execution_id)
    bench.complete(item_run(bench, made.execution_id, 0), {"v": 10})
    (published,) = bench.complete(item_run(bench, made.execution_id, 1), {"v": 20})

    assert published.job_id == own_job(bench, made.execution_id, "m2").id
    expand_second = bench.claimed(published.job_id)
    second = bench.units.run(
        lambda s: success.expand(
            s, expand_second, mapping.items_of(expand_second), bench.clock(), 0.01, 1000
        )
    )
    assert len(second.dispatches) == 2
    run = bench.claimed(items(bench, made.execution_id, "m2")[1].id)
    # an item reads its item, not the list it came from (which its inputs do not name)
    assert (run.context["item"], run.context["nodes"]) == ({"v": 20}, {})
    bench.complete(run, "second")
    bench.complete(item_run(bench, made.execution_id, 0, "m2"), "first")
    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, {"m2": ["first", "second"]})


def test_an_item_s_dead_letter_is_not_requeued(bench: Bench) -> None:
    execution_id, _ = start(bench, [1, 2])
    bench.fail(item_run(bench, execution_id, 0), NonRetryableError("bad"))
    dead = items(bench, execution_id)[0]

    with pytest.raises(InvalidTransition, match="item 0 of map node 'm'"):
        bench.units.run(lambda s: dead_letters.requeue(s, dead.id, None, bench.clock()))

    assert bench.probe.execution(execution_id).status is ExecutionStatus.FAILED


def test_a_requeue_does_not_resume_a_map_its_execution_s_failure_stopped(bench: Bench) -> None:
    # Given a map stopped mid-way by another node's failure
    execution_id, _ = start(bench, [1, 2, 3], node("beside"), window=1)
    bench.fail(bench.claim_node(execution_id, "beside"), NonRetryableError("bad"))
    assert bench.probe.nodes(execution_id)["m"].status is NodeStatus.CANCELLED

    # Then that node's dead letter is not requeued: the map would not be resumed
    dead = own_job(bench, execution_id, "beside")
    with pytest.raises(InvalidTransition, match="stopped at map node 'm'"):
        bench.units.run(lambda s: dead_letters.requeue(s, dead.id, None, bench.clock()))
    assert bench.probe.execution(execution_id).status is ExecutionStatus.FAILED


def test_a_requeue_leaves_a_finished_map_s_dead_items_dead(bench: Bench) -> None:
    # Given a map that completed with a failed item (continue), then a node after it failed
    name = bench.apply(
        "mapping", mapped(on_item_failure="continue"), node("after", "m"), defaults=NO_RETRY,
    ).name  # fmt: skip
    made = bench.trigger(name, {"rows": [1, 2]})
    expand(bench, made.execution_id)
    bench.fail(item_run(bench, made.execution_id, 0), NonRetryableError("no"))
    (after,) = bench.complete(item_run(bench, made.execution_id, 1), "two")
    bench.fail(bench.claimed(after.job_id), NonRetryableError("after broke"))

    # When the failed node's dead letter is requeued
    dead = own_job(bench, made.execution_id, "after")
    (again,) = bench.units.run(lambda s: dead_letters.requeue(s, dead.id, None, bench.clock()))

    # Then it alone runs again: the map's dead item stays dead, its output as it was
    assert again.job_id == dead.id
    assert statuses(bench, made.execution_id) == ["dead_letter", "completed"]
    assert bench.probe.nodes(made.execution_id)["m"].status is NodeStatus.COMPLETED


# -- the port's item methods, each on its own ------------------------------------------------


def test_settle_item_counts_and_map_runs_says_so_only_while_the_map_runs(bench: Bench) -> None:
    execution_id, _ = start(bench, [1, 2, 3], window=1)
    first = items(bench, execution_id)[0].record()

    with bench.store() as store:
        counted = store.settle_item(first, "m", True, bench.clock())
        runs = store.map_runs(execution_id, "m")
    with bench.store() as store:
        closed = store.close_map(execution_id, "m", bench.clock(), "stop")
    with bench.store() as store:
        again = store.close_map(execution_id, "m", bench.clock(), "stop again")
        after = store.settle_item(first, "m", False, bench.clock())
        runs_after = store.map_runs(execution_id, "m")

    assert (runs, runs_after) == (True, False)
    assert counted is not None and (counted.left, counted.failed) == (2, 1)
    assert counted.released is not None and counted.released.item_index == 1
    assert counted.released.status is JobStatus.QUEUED and counted.released.workflow == "mapping"
    # the queued ones (the first, and the one released); the held one is not returned
    assert sorted(closed or []) == sorted(j.id for j in items(bench, execution_id)[:2])
    assert (again, after) == (None, None)
    assert statuses(bench, execution_id) == ["cancelled", "cancelled", "cancelled"]
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.error, m.items_left) == (NodeStatus.FAILED, "stop", 2)


def test_item_outputs_are_read_in_index_order_whatever_order_they_were_added_in(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, [0])
    execution = bench.units.run(lambda s: s.execution(execution_id))
    added = [NewItem(id=uuid.uuid4(), index=i, item=i, held=True) for i in (7, 3, 5)]
    with bench.store() as store:
        store.add_item_jobs(execution, "m", added, 2, bench.clock())
        store.open_map(execution_id, "m", 8)  # a list of 8 (no item past it is read)

    with bench.store() as store:
        rows = store.item_outputs(execution_id, "m")

    assert [r.index for r in rows] == [0, 3, 5, 7]
    assert [r.status for r in rows] == [JobStatus.QUEUED] + [JobStatus.HELD] * 3
    assert {j.max_retries for j in items(bench, execution_id)[1:]} == {2}


def test_complete_item_keeps_the_output_on_the_item_s_job_only_in_its_current_try(
    bench: Bench,
) -> None:
    execution_id, _ = start(bench, ["a"])
    run = item_run(bench, execution_id, 0)
    stale = run.job.__class__(**{**run.job.__dict__, "retry_count": run.job.retry_count + 1})

    with bench.store() as store:
        late = store.complete_item(stale, "no", bench.clock(), 0.1)
    with bench.store() as store:
        done = store.complete_item(run.job, {"out": 1}, bench.clock(), 0.1)

    assert (late, done) == (False, True)
    (job,) = items(bench, execution_id)
    assert (job.status, job.output) == (JobStatus.COMPLETED, {"out": 1})
    (attempt,) = bench.probe.attempts(job.id)
    assert attempt.status is AttemptStatus.SUCCEEDED
    m = bench.probe.nodes(execution_id)["m"]
    assert (m.status, m.items_left) == (NodeStatus.RUNNING, 1)  # the counter is settle_item's
