"""Pure DAG decisions: what runs first, what a settled node makes ready, what the output is.

Join rule: a node becomes ready when every need has settled (completed, failed with
``continue_on_failure``, or skipped). It is then **skipped** when a condition among its needs
gates it on the branch not taken, or when every one of its needs was skipped; otherwise it runs.
Skipped therefore propagates down a branch not taken and stops at the join that merges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from conveyor.engine import node_types, templates
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.states import NodeStatus


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


def gated_branch(need: Node, node_id: str) -> str | None:
    """The branch of ``need`` (a node whose output chooses one, a condition) that ``node_id``
    sits on, or None if it is not gated."""
    for branch in node_types.branches(need):
        if node_id in need.config.get(branch, []):
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
    UTC) of a run a schedule started, or the start time of one triggered for later, else
    None."""
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


def output_reads(workflow: Workflow, sinks: tuple[str, ...]) -> frozenset[str]:
    """The nodes whose outputs :func:`execution_output` reads: the sinks, or (an ``output``
    template may name any node) all of them."""
    if workflow.output is not None:
        return frozenset(n.id for n in workflow.nodes)
    return frozenset(sinks)


def delay_seconds(node_def: Node, context: dict[str, Any], now: datetime | None = None) -> float:
    """How long a ready node's job is held before it runs from ``now`` (default: the
    clock's): its type's wait, rendered from its config (a delay's ``seconds``, or the time
    to its ``until``); 0 for a type that does not wait."""
    kind = node_types.of(node_def)
    if kind is None or kind.wait is None:
        return 0.0
    return kind.wait(node_def, context, now or datetime.now(UTC))


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """How a failed execution goes on after its dead letter is requeued."""

    skip: list[str]  # pending nodes that settle as skipped now
    enqueue: list[str]  # pending nodes whose needs have all settled: they run now
    waiting_on: dict[str, int]  # every unsettled node: its needs not settled yet
    remaining: int  # nodes not settled (the execution's counter)


# After a requeue, a failed node is one that failed and was tolerated (continue_on_failure):
# the others were reset to run again.
_SETTLED_ON_RESUME = frozenset({NodeStatus.COMPLETED, NodeStatus.SKIPPED, NodeStatus.FAILED})


def resume(workflow: Workflow, states: Mapping[str, NeedState]) -> Resumed:
    """Recount an execution from its nodes' states, as a requeue leaves them: the counters
    kept while it ran may have drifted while it was failed (a node that finished as the
    failure committed was never counted)."""
    current = dict(states)
    skip: list[str] = []
    enqueue: list[str] = []
    changed = True
    while changed:  # a skip can make its successors ready (or skipped) in turn
        changed = False
        for node in workflow.nodes:
            if current[node.id].status is not NodeStatus.PENDING or node.id in enqueue:
                continue
            needs = {n: current[n] for n in dict.fromkeys(node.needs)}
            if not all(s.status in _SETTLED_ON_RESUME for s in needs.values()):
                continue
            if readiness(workflow, node, needs) is Readiness.SKIP:
                current[node.id] = NeedState(status=NodeStatus.SKIPPED)
                skip.append(node.id)
                changed = True
            else:
                enqueue.append(node.id)
    unsettled = [n for n in workflow.nodes if current[n.id].status not in _SETTLED_ON_RESUME]
    waiting = {
        n.id: sum(
            1 for need in dict.fromkeys(n.needs)
            if current[need].status not in _SETTLED_ON_RESUME
        )
        for n in unsettled
    }  # fmt: skip
    return Resumed(skip=skip, enqueue=enqueue, waiting_on=waiting, remaining=len(unsettled))


def downstream(shape: Plan, node_id: str) -> set[str]:
    """``node_id`` and every node that depends on it, directly or not."""
    reach, frontier = {node_id}, [node_id]
    while frontier:
        for successor in shape.successors[frontier.pop()]:
            if successor not in reach:
                reach.add(successor)
                frontier.append(successor)
    return reach


def rerun_reach(
    workflow: Workflow, shape: Plan, from_node: str, states: Mapping[str, NodeStatus]
) -> list[str]:
    """The nodes a rerun from ``from_node`` runs again, in definition order: it and every
    node downstream of it, and every other node of the finished execution that did not end
    well (cancelled, failed without ``continue_on_failure``, never started), without which
    the execution could not complete. The others keep their outcome and output."""
    reach = downstream(shape, from_node)
    return [
        n.id
        for n in workflow.nodes
        if n.id in reach or not _ended_well(n, states.get(n.id, NodeStatus.PENDING))
    ]


def _ended_well(node: Node, status: NodeStatus) -> bool:
    if status is NodeStatus.FAILED:
        return node.continue_on_failure
    return status in (NodeStatus.COMPLETED, NodeStatus.SKIPPED)
