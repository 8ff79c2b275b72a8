"""Pure DAG decisions: what runs first, what a settled node makes ready, what the output is.

Join rule: a node becomes ready when every need has settled (completed, failed with
``continue_on_failure``, or skipped). It is then **skipped** when a condition among its needs
gates it on the branch not taken, or when every one of its needs was skipped; otherwise it runs.
Skipped therefore propagates down a branch not taken and stops at the join that merges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from conveyor.engine import templates
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.states import NodeStatus
from conveyor.exceptions import NonRetryableError


class Readiness(StrEnum):
    RUN = "run"  # enqueue a job for the node
    SKIP = "skip"  # settle the node as skipped without running it


@dataclass(frozen=True, kw_only=True)
class NeedState:
    """What a successor needs to know about one settled predecessor."""

    status: NodeStatus
    branch: str | None = None  # for condition nodes: "if_true" or "if_false"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The shape of a workflow, computed once per definition."""

    roots: tuple[str, ...]
    successors: Mapping[str, tuple[str, ...]]
    waiting_on: Mapping[str, int]
    sinks: tuple[str, ...]


def plan(workflow: Workflow) -> Plan:
    successors: dict[str, list[str]] = {n.id: [] for n in workflow.nodes}
    for node in workflow.nodes:
        for need in dict.fromkeys(node.needs):  # a repeated need counts once
            successors[need].append(node.id)
    return Plan(
        roots=tuple(n.id for n in workflow.nodes if not n.needs),
        successors={k: tuple(v) for k, v in successors.items()},
        waiting_on={n.id: len(set(n.needs)) for n in workflow.nodes},
        sinks=tuple(n.id for n in workflow.nodes if not successors[n.id]),
    )


def readiness(workflow: Workflow, node: Node, needs: Mapping[str, NeedState]) -> Readiness:
    """Decide whether a node whose needs have all settled runs or is skipped."""
    for need_id, state in needs.items():
        gate = gated_branch(workflow.node(need_id), node.id)
        if gate is not None and state.branch != gate:
            return Readiness.SKIP
    if needs and all(s.status is NodeStatus.SKIPPED for s in needs.values()):
        return Readiness.SKIP
    return Readiness.RUN


def gated_branch(condition: Node, node_id: str) -> str | None:
    """The branch of ``condition`` that ``node_id`` sits on, or None if it is not gated."""
    if condition.type != "condition":
        return None
    for branch in ("if_true", "if_false"):
        if node_id in condition.config.get(branch, []):
            return branch
    return None


def template_context(
    *,
    execution_id: str,
    workflow_input: Any,
    outputs: Mapping[str, Any],
    scheduled_for: datetime | None = None,
) -> dict[str, Any]:
    """The names node templates can use; ``execution.scheduled_for`` is the slot (ISO 8601,
    UTC) of a run a schedule started, else None."""
    slot = scheduled_for.isoformat() if scheduled_for is not None else None
    return {
        "input": workflow_input,
        "nodes": dict(outputs),
        "execution": {"id": execution_id, "scheduled_for": slot},
    }


def execution_output(
    workflow: Workflow, sinks: tuple[str, ...], outputs: Mapping[str, Any], context: dict[str, Any]
) -> Any:
    """The workflow's ``output`` template rendered, or the outputs of its sink nodes."""
    if workflow.output is not None:
        return templates.render_value(workflow.output, context)
    return {node_id: outputs.get(node_id) for node_id in sinks}


def delay_seconds(node_def: Node, context: dict[str, Any]) -> float:
    """How long a delay node waits, rendered from its config."""
    value = templates.render_value(node_def.config["seconds"], context)
    try:
        seconds = float(value)
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(f"delay seconds {value!r} is not a number") from exc
    if seconds < 0:
        raise NonRetryableError(f"delay seconds {seconds} is negative")
    return seconds
