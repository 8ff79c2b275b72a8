"""A node's inputs on an execution's page (conveyor.ui.inputs), decided from the page's reads
alone: rendered once its needs settled, a rerun's given input in their place, a template
that does not render shown as its error."""

from __future__ import annotations

from typing import Any, cast

from conveyor.engine.definitions import Workflow
from conveyor.ui.inputs import Inputs, node_inputs
from conveyor.views import ExecutionJson

FLOW = Workflow.model_validate({
    "name": "fed",
    "nodes": [
        {"id": "a", "type": "python", "config": {"function": "f"}},
        {"id": "b", "type": "python", "needs": ["a"], "config": {"function": "f"},
         "inputs": {"n": "{{ nodes.a.n + input.k }}", "when": "{{ execution.scheduled_for }}"}},
        {"id": "c", "type": "python", "needs": ["a"], "config": {"function": "f"},
         "inputs": {"n": "{{ nodes.a.n.nope.deeper }}"}},
        {"id": "d", "type": "python", "needs": ["b"], "config": {"function": "f"},
         "inputs": {"n": "{{ nodes.b }}"}},
        {"id": "w", "type": "delay", "config": {"seconds": 1}},
    ],
})  # fmt: skip
SLOT = "2026-11-26T10:00:00+00:00"


def _view(statuses: dict[str, str], reruns: list[dict[str, Any]] | None = None) -> ExecutionJson:
    nodes = [{"id": n, "status": s, "output": {"n": 1} if n == "a" else None,
              "started_at": None} for n, s in statuses.items()]  # fmt: skip
    return cast(ExecutionJson, {"id": "e1", "input": {"k": 2}, "scheduled_for": SLOT,
                                "nodes": nodes, "reruns": reruns or []})  # fmt: skip


def test_inputs_render_as_the_worker_would_once_the_needs_settled_and_wait_until_then() -> None:
    shown = node_inputs(FLOW, _view({"a": "completed", "b": "running", "c": "failed",
                                     "d": "pending", "w": "completed"}))  # fmt: skip

    assert shown["b"] == Inputs(how="rendered", value={"n": 3, "when": SLOT}, shown=True)
    assert shown["c"].how == "not rendered" and not shown["c"].shown
    assert "nope" in (shown["c"].problem or "")  # the template's error, not a traceback
    assert shown["d"] == Inputs(how="not rendered yet: its needs have not all settled")
    assert "a" not in shown and "w" not in shown  # no inputs; a type that reads none


def test_a_reruns_given_input_stands_in_for_the_rendered_inputs_of_its_node_only() -> None:
    given = {"n": 99}
    reruns = [{"from_node": "d", "input": {"n": 0}}, {"from_node": "b", "input": given}]

    shown = node_inputs(FLOW, _view({"a": "completed", "b": "completed", "c": "completed",
                                     "d": "completed", "w": "completed"}, reruns))  # fmt: skip

    assert shown["b"] == Inputs(how="given by its rerun", value=given, shown=True)
    assert shown["d"].how == "rendered"  # an older rerun's input no longer holds
