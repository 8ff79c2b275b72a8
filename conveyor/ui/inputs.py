"""Each node's inputs on an execution's page, as the node received (or will receive) them: its
definition's ``inputs`` rendered as a worker renders them (``Step.begin``), from the
execution's input and its needs' outputs that the page has read already, or the input the
execution's latest rerun gave it in their place (what the claim takes, ``Store.rerun_input``).

Nothing is read here: the page's own reads (the execution's view and its workflow) are enough.
Rendered inputs hold nothing the page does not show already (the input and the outputs); no
definition field marks an input secret, so none is masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conveyor.engine import node_types, planning, templates
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.states import SETTLED_NODE, NodeStatus
from conveyor.exceptions import ConveyorError
from conveyor.views import ExecutionJson

_SETTLED = frozenset(s.value for s in SETTLED_NODE)


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What a node's page section says of its inputs."""

    how: str  # where the value comes from, or why there is none
    value: Any = None
    shown: bool = False  # whether ``value`` is shown (not: not rendered yet, or a problem)
    problem: str | None = None  # why its templates do not render, as the worker would say


def node_inputs(workflow: Workflow, view: ExecutionJson) -> dict[str, Inputs]:
    """Each node's inputs, by id; a node whose type reads none, or that has none, is left out."""
    rows = {n["id"]: n for n in view["nodes"]}
    latest = view["reruns"][-1] if view["reruns"] else None
    found: dict[str, Inputs] = {}
    for node in workflow.nodes:
        given = latest["input"] if latest and latest["from_node"] == node.id else None
        if node_types.reads_inputs(node) and (node.inputs or given is not None):
            found[node.id] = _inputs(node, view, rows, given)
    return found


def _inputs(
    node: Node, view: ExecutionJson, rows: dict[str, Any], given: dict[str, Any] | None
) -> Inputs:
    if given is not None:
        return Inputs(how="given by its rerun", value=given, shown=True)
    if node.map is not None:  # each item renders them with its own ``item`` and ``index``
        return Inputs(how="templates, rendered for each item", value=node.inputs, shown=True)
    row = rows.get(node.id, {})
    if row.get("status") == NodeStatus.SKIPPED.value:
        return Inputs(how="none: the node was skipped")
    if row.get("status") == NodeStatus.CANCELLED.value and row.get("started_at") is None:
        return Inputs(how="none: the node was cancelled before it ran")
    if any(rows.get(need, {}).get("status") not in _SETTLED for need in node.needs):
        return Inputs(how="not rendered yet: its needs have not all settled")
    slot = view["scheduled_for"]
    context = planning.template_context(
        execution_id=view["id"],
        workflow_input=view["input"],
        outputs={need: rows[need]["output"] for need in node.needs},
        scheduled_for=datetime.fromisoformat(slot) if slot else None,
    )
    try:
        return Inputs(
            how="rendered", value=templates.render_value(node.inputs, context), shown=True
        )
    except ConveyorError as exc:
        return Inputs(how="not rendered", problem=str(exc))
