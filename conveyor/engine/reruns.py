"""An operator's rerun of a finished execution (failed, cancelled or completed) from one of
its nodes, in one transaction; the caller publishes the returned dispatches after commit.

The node and every node downstream of it run again, and so does every other node that did not
end well (cancelled, or failed without ``continue_on_failure``), without which the execution
could not complete; every other node keeps its outcome and output, which the nodes that run
again read as before. The execution runs again (its output, error and end cleared), the nodes
that run again wait for their needs as at the start, and its counters are recounted from its
nodes' states; skips downstream are decided anew as their needs settle.

The history stays: a node keeps its one job (the key of ``jobs`` is one a node), which the
rerun holds (``held``) with a fresh set of tries numbered on after the ones it made, so every
earlier try keeps its row; once the node's needs have settled the held job is queued (or
scheduled, for a delay) as a new job would be, with its permits, priority, limits and trace.
A map node's items are held with it and its counter cleared: its own try renders the list
again, and each item takes its index's job again (see :mod:`conveyor.engine.mapping`). A rerun
waits until every item of such a map has settled.

``input`` is given to the node in place of its rendered inputs (not to a map node: each of
its items renders its own). It is stored once, on the rerun's record (``execution_reruns``,
with who asked and when): the claim of the node reads the execution's latest rerun and takes
its input when that rerun was from this node (only in an execution that was re-run: no other
claim reads it). One row holds the input, whatever job or try runs the node (a retry, a
requeue of its dead letter), and nothing else needs to change when the node has no job yet; a
later rerun from another node ends it.

An execution with a deduplication key is active again: while it runs, a trigger with its key
finds it, as it finds any active execution with the key (its workflow's dedupe policy decides).
If another execution with the key is active already (a follow-up, or a trigger since), the
rerun is refused, naming it: one active execution a key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conveyor.engine import node_types, planning
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.ports import Store
from conveyor.engine.ready import enqueue_ready
from conveyor.engine.records import Dispatch, ExecutionRecord
from conveyor.engine.states import FINISHED_EXECUTION, NodeStatus
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    DuplicateExecution,
    ExecutionNotFound,
    InvalidTransition,
    RerunError,
)

# A node of a finished execution in one of these has a try in flight (it began before the
# execution ended and has not reported yet, or a workflow node's waits for its child): a
# rerun waits for it.
_IN_FLIGHT = frozenset({NodeStatus.QUEUED, NodeStatus.RUNNING, NodeStatus.WAITING})


@dataclass(frozen=True, kw_only=True)
class Rerun:
    """What a rerun did: the nodes that run again (in definition order), those of them
    queued now, and the messages to publish after commit."""

    execution_id: uuid.UUID
    from_node: str
    nodes: list[str]
    queued: list[str]
    dispatches: list[Dispatch]


def rerun(
    store: Store,
    execution_id: uuid.UUID,
    from_node: str,
    *,
    requested_by: str,
    now: datetime,
    input: dict[str, Any] | None = None,
    tenant_id: uuid.UUID | None = None,
) -> Rerun:
    """Run the finished execution again from ``from_node`` (see the module's docstring);
    with ``tenant_id``, only an execution of that tenant (another's is not found)."""
    status = store.execution_status(execution_id, lock=True)  # first: the row's lock
    execution = _owned(store, execution_id, tenant_id, status is not None)
    if (parent := execution.parent) is not None:
        raise InvalidTransition(
            f"execution {execution_id} is a child of execution {parent.execution_id}, whose "
            f"node {parent.node_id!r} went on when it ended; rerun the parent from that node "
            f"instead, which starts a new child"
        )
    workflow, shape = load_workflow(store, execution.workflow_id)
    node = _node(workflow, from_node, input)
    if execution.status not in FINISHED_EXECUTION:
        raise InvalidTransition(
            f"execution {execution_id} is {execution.status.value}: only a finished one "
            f"(failed, cancelled or completed) runs again; cancel it first, or wait for it"
        )
    states = _states(store, execution_id, workflow)
    _refuse_holder(store, execution_id)
    nodes = planning.rerun_reach(workflow, shape, node.id, states)
    _refuse_items_in_flight(store, execution_id, workflow, nodes)
    _reopen(store, execution_id)
    store.add_rerun(execution_id, node.id, input, requested_by, now)
    store.hold_jobs(execution_id, nodes)
    store.reset_nodes(execution_id, nodes)
    queued, dispatches = _go_on(store, execution_id, workflow, node, now)
    return Rerun(
        execution_id=execution_id, from_node=node.id, nodes=nodes, queued=queued,
        dispatches=dispatches,
    )  # fmt: skip


def _go_on(
    store: Store, execution_id: uuid.UUID, workflow: Workflow, node: Node, now: datetime
) -> tuple[list[str], list[Dispatch]]:
    """Its counters recounted from its nodes' states as the rerun left them, the skips
    decided, the ready nodes enqueued: those, and their messages."""
    rows = store.node_rows(execution_id, [n.id for n in workflow.nodes], outputs=False)
    resumed = planning.resume(
        workflow, {i: planning.NeedState(status=r.status, branch=r.branch) for i, r in rows.items()}
    )
    if node.id in resumed.skip:
        raise InvalidTransition(
            f"node {node.id!r} would be skipped again (it sits on a branch its condition did "
            f"not take, or all its needs were skipped); rerun from a node upstream of it"
        )
    for skipped in resumed.skip:
        store.set_node(execution_id, skipped, NodeStatus.SKIPPED, finished_at=now)
    store.recount(execution_id, resumed.waiting_on, resumed.remaining)
    execution = store.execution(execution_id)  # running, counting this rerun
    started = [enqueue_ready(store, execution, workflow, workflow.node(n), now)
               for n in resumed.enqueue]  # fmt: skip
    return resumed.enqueue, [d for d in started if d is not None]


def _owned(
    store: Store, execution_id: uuid.UUID, tenant_id: uuid.UUID | None, exists: bool
) -> ExecutionRecord:
    missing = ExecutionNotFound(
        f"no execution has id {execution_id}; list them with `conveyor executions list`"
    )
    if not exists:
        raise missing
    execution = store.execution(execution_id)
    if tenant_id is not None and execution.tenant_id != tenant_id:
        raise missing  # another tenant's: as one that does not exist
    return execution


def _node(workflow: Workflow, node_id: str, input: dict[str, Any] | None) -> Node:
    """The node to rerun from, and its input checked."""
    try:
        node = workflow.node(node_id)
    except KeyError:
        names = ", ".join(n.id for n in workflow.nodes)
        raise RerunError(
            f"workflow {workflow.name!r} has no node {node_id!r}; rerun from one of its "
            f"nodes: {names}"
        ) from None
    if input is None:
        return node
    if not isinstance(input, dict):
        raise RerunError(
            f"the input for node {node.id!r} must be a JSON object (its inputs by name), "
            f"not {type(input).__name__}"
        )
    if not node_types.reads_inputs(node):
        raise RerunError(
            f"node {node.id!r} is a {node.type} node, which reads no inputs (its templates "
            f"are in its config); rerun it without an input"
        )
    if node.map is not None:
        raise RerunError(
            f"node {node.id!r} maps over a list, and each item's inputs are rendered from its "
            f"item: one input cannot stand in for them all; rerun it without an input (its "
            f"list is rendered again), or with one from the node whose output it maps over"
        )
    return node


def _refuse_items_in_flight(
    store: Store, execution_id: uuid.UUID, workflow: Workflow, nodes: list[str]
) -> None:
    """A map node whose items have not all settled (a try begun before the execution ended,
    or a retry still to come) cannot have its items reset under them."""
    mapped = [n for n in nodes if workflow.node(n).map is not None]
    if busy := store.items_in_flight(execution_id, mapped) if mapped else []:
        raise InvalidTransition(
            f"execution {execution_id} still has items of map node(s) {', '.join(busy)} in "
            f"flight (begun before it ended); rerun once they have stopped"
        )


def _states(store: Store, execution_id: uuid.UUID, workflow: Workflow) -> dict[str, NodeStatus]:
    rows = store.node_rows(execution_id, [n.id for n in workflow.nodes], outputs=False)
    if not rows:
        raise InvalidTransition(
            f"execution {execution_id} ended before its nodes were planned, so no node of it "
            f"ran; trigger a new execution instead"
        )
    if busy := sorted(n for n, row in rows.items() if row.status in _IN_FLIGHT):
        raise InvalidTransition(
            f"execution {execution_id} still has a try in flight on node(s) "
            f"{', '.join(busy)} (begun before it ended); rerun once they have stopped"
        )
    return {n: row.status for n, row in rows.items()}


def _refuse_holder(store: Store, execution_id: uuid.UUID) -> None:
    holder = store.dedupe_holder(execution_id)
    if holder is not None:
        raise InvalidTransition(
            f"execution {execution_id} cannot run again while execution {holder}, which has "
            f"its deduplication key, is active (one active execution a key); wait for it to "
            f"finish, or cancel it"
        )


def _reopen(store: Store, execution_id: uuid.UUID) -> None:
    try:
        store.revive_execution(execution_id, FINISHED_EXECUTION)
    except DuplicateExecution as exc:  # a trigger with its key came in just now
        raise InvalidTransition(
            f"execution {execution_id} cannot run again: another execution with its "
            f"deduplication key became active meanwhile; wait for it to finish, or cancel it"
        ) from exc
