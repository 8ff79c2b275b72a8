"""Planning decides what runs first, what a settled node makes ready, and the output."""

from __future__ import annotations

from typing import Any

from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.planning import (
    NeedState,
    Readiness,
    downstream,
    execution_output,
    output_reads,
    plan,
    readiness,
    rerun_reach,
    template_context,
)
from conveyor.engine.states import NodeStatus


def py(node_id: str, *needs: str, **fields: Any) -> Node:
    return Node(id=node_id, type="python", needs=list(needs), config={"function": "f"}, **fields)


def condition(node_id: str, *needs: str, if_true: list[str], if_false: list[str]) -> Node:
    config = {"expression": "input.flag", "if_true": if_true, "if_false": if_false}
    return Node(id=node_id, type="condition", needs=list(needs), config=config)


def workflow(*nodes: Node, output: dict[str, Any] | None = None) -> Workflow:
    return Workflow(name="wf", nodes=list(nodes), output=output)


def diamond() -> Workflow:
    return workflow(py("a"), py("b", "a"), py("c", "a"), py("d", "b", "c"))


def branching() -> Workflow:
    """check -> yes (if_true) / no (if_false); after_yes follows yes; join needs yes and no."""
    return workflow(
        condition("check", if_true=["yes"], if_false=["no"]),
        py("yes", "check"),
        py("no", "check"),
        py("after_yes", "yes"),
        py("join", "yes", "no"),
    )


def completed(branch: str | None = None) -> NeedState:
    return NeedState(status=NodeStatus.COMPLETED, branch=branch)


SKIPPED = NeedState(status=NodeStatus.SKIPPED)
FAILED = NeedState(status=NodeStatus.FAILED)


def decide(wf: Workflow, node_id: str, **needs: NeedState) -> Readiness:
    return readiness(wf, wf.node(node_id), needs)


# plan()


def test_plan_of_a_diamond_has_one_root_and_one_sink() -> None:
    shape = plan(diamond())

    assert shape.roots == ("a",)
    assert shape.sinks == ("d",)


def test_plan_of_a_diamond_lists_each_nodes_successors() -> None:
    shape = plan(diamond())

    assert dict(shape.successors) == {"a": ("b", "c"), "b": ("d",), "c": ("d",), "d": ()}


def test_plan_of_a_diamond_counts_the_needs_each_node_waits_on() -> None:
    shape = plan(diamond())

    assert dict(shape.waiting_on) == {"a": 0, "b": 1, "c": 1, "d": 2}


def test_plan_lists_every_independent_node_as_root_and_sink() -> None:
    shape = plan(workflow(py("a"), py("b")))

    assert shape.roots == ("a", "b")
    assert shape.sinks == ("a", "b")


def test_plan_lists_a_successor_once_per_counted_need_when_needs_repeat_a_parent() -> None:
    shape = plan(workflow(py("a"), py("b", "a", "a")))

    assert shape.successors["a"].count("b") == shape.waiting_on["b"]


# readiness()


def test_node_runs_when_all_its_needs_completed() -> None:
    assert decide(diamond(), "d", b=completed(), c=completed()) is Readiness.RUN


def test_join_runs_when_one_parent_skipped_and_other_completed() -> None:
    assert decide(diamond(), "d", b=completed(), c=SKIPPED) is Readiness.RUN


def test_node_whose_needs_are_all_skipped_is_skipped() -> None:
    assert decide(diamond(), "d", b=SKIPPED, c=SKIPPED) is Readiness.SKIP


def test_node_on_the_branch_the_condition_did_not_take_is_skipped() -> None:
    assert decide(branching(), "no", check=completed("if_true")) is Readiness.SKIP


def test_node_on_the_branch_the_condition_took_runs() -> None:
    assert decide(branching(), "yes", check=completed("if_true")) is Readiness.RUN


def test_node_on_the_false_branch_runs_when_the_condition_took_it() -> None:
    wf = branching()

    assert decide(wf, "no", check=completed("if_false")) is Readiness.RUN
    assert decide(wf, "yes", check=completed("if_false")) is Readiness.SKIP


def test_skip_propagates_down_a_branch_not_taken() -> None:
    assert decide(branching(), "after_yes", yes=SKIPPED) is Readiness.SKIP


def test_join_of_both_branches_runs_whichever_branch_was_taken() -> None:
    assert decide(branching(), "join", yes=completed(), no=SKIPPED) is Readiness.RUN


def test_failed_need_with_continue_on_failure_counts_as_settled_and_its_successor_runs() -> None:
    wf = workflow(py("a", continue_on_failure=True), py("b", "a"))

    assert decide(wf, "b", a=FAILED) is Readiness.RUN


def test_root_node_with_no_needs_runs() -> None:
    assert decide(diamond(), "a") is Readiness.RUN


# execution_output()


def _context(outputs: dict[str, Any]) -> dict[str, Any]:
    return template_context(execution_id="e-1", workflow_input={"k": 7}, outputs=outputs)


def test_execution_output_without_template_is_the_sink_outputs() -> None:
    wf = diamond()
    outputs = {"a": 1, "b": 2, "c": 3, "d": {"total": 5}}

    result = execution_output(wf, plan(wf).sinks, outputs, _context(outputs))

    assert result == {"d": {"total": 5}}


def test_execution_output_without_template_reports_a_skipped_sink_as_none() -> None:
    wf = workflow(py("a"), py("b"))
    outputs = {"a": {"x": 1}}

    assert execution_output(wf, plan(wf).sinks, outputs, _context(outputs)) == {
        "a": {"x": 1},
        "b": None,
    }


def test_output_without_template_reads_only_the_sinks() -> None:
    assert output_reads(diamond(), plan(diamond()).sinks) == {"d"}


def test_output_template_may_read_any_node() -> None:
    templated = workflow(py("a"), py("b", "a"), output={"x": "{{ nodes.a }}"})
    assert output_reads(templated, plan(templated).sinks) == {"a", "b"}


def test_execution_output_with_template_renders_it_from_nodes_input_and_execution() -> None:
    wf = workflow(
        py("a"),
        py("b", "a"),
        output={
            "first": "{{ nodes.a.value }}",
            "sum": "{{ nodes.a.value + nodes.b.value }}",
            "label": "run {{ execution.id }} for {{ input.k }}",
        },
    )
    outputs = {"a": {"value": 2}, "b": {"value": 3}}

    result = execution_output(wf, plan(wf).sinks, outputs, _context(outputs))

    assert result == {"first": 2, "sum": 5, "label": "run e-1 for 7"}


# -- resuming a failed execution after a requeue -----------------------------------------------


def resume_of(definition: dict, statuses: dict[str, str]) -> Any:
    from conveyor.engine.planning import NeedState, resume
    from conveyor.engine.states import NodeStatus
    from conveyor.engine.validation import parse_workflow

    workflow = parse_workflow(definition)
    return resume(workflow, {n: NeedState(status=NodeStatus(s)) for n, s in statuses.items()})


def node_(node_id: str, *needs: str, **extra: Any) -> dict:
    return {"id": node_id, "type": "python", "config": {"function": "f"}, "needs": list(needs),
            **extra}  # fmt: skip


def test_resume_recounts_a_join_whose_finished_branch_was_never_counted() -> None:
    # a -> (x, y) -> z: x is the requeued dead letter (queued again); y completed as the
    # failure committed, so its completion never reached z's counter
    flow = {"name": "d", "nodes": [node_("a"), node_("x", "a"), node_("y", "a"),
                                   node_("z", "x", "y")]}  # fmt: skip

    resumed = resume_of(flow, {"a": "completed", "x": "queued", "y": "completed",
                               "z": "pending"})  # fmt: skip

    assert resumed.waiting_on == {"x": 0, "z": 1}  # z waits for x only
    assert resumed.remaining == 2 and resumed.enqueue == [] and resumed.skip == []


def test_resume_enqueues_a_node_left_pending_whose_needs_all_settled() -> None:
    # a tolerated failure (continue_on_failure) and a completion: the join can run now
    nodes = [node_("a"), node_("n", "a", continue_on_failure=True), node_("c", "a"),
             node_("j", "n", "c"), node_("k", "a")]  # fmt: skip
    flow = {"name": "d", "nodes": nodes}

    resumed = resume_of(flow, {"a": "completed", "n": "failed", "c": "completed",
                               "j": "pending", "k": "queued"})  # fmt: skip

    assert resumed.enqueue == ["j"] and resumed.remaining == 2
    assert resumed.waiting_on == {"j": 0, "k": 0}


def test_downstream_is_the_node_and_everything_that_depends_on_it() -> None:
    shape = plan(diamond())

    assert downstream(shape, "b") == {"b", "d"}
    assert downstream(shape, "a") == {"a", "b", "c", "d"}
    assert downstream(shape, "d") == {"d"}


def test_a_rerun_reaches_downstream_and_the_nodes_that_did_not_end_well_in_order() -> None:
    # Given b ran again from, c cancelled by a failure, e failed but tolerated, f skipped
    flow = workflow(
        py("a"), py("b", "a"), py("c", "a"), py("d", "b", "c"),
        py("e", continue_on_failure=True), py("f"), py("g"),
    )  # fmt: skip
    states = {
        "a": NodeStatus.COMPLETED, "b": NodeStatus.FAILED, "c": NodeStatus.CANCELLED,
        "d": NodeStatus.CANCELLED, "e": NodeStatus.FAILED, "f": NodeStatus.SKIPPED,
        "g": NodeStatus.COMPLETED,
    }  # fmt: skip

    assert rerun_reach(flow, plan(flow), "b", states) == ["b", "c", "d"]
    assert rerun_reach(flow, plan(flow), "g", states) == ["b", "c", "d", "g"]
    assert rerun_reach(flow, plan(flow), "e", states) == ["b", "c", "d", "e"]
