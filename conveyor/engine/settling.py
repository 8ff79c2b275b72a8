"""A settled node (completed, skipped, or failed and tolerated) propagated to its successors:
joins counted down, the ready enqueued, the skipped settled, the execution finished when
none is left."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from conveyor.engine import node_types, parents, planning
from conveyor.engine.cancellation import stop_children
from conveyor.engine.claiming import NodeRun
from conveyor.engine.definitions import Node
from conveyor.engine.ports import Store
from conveyor.engine.ready import context_of, enqueue_nodes
from conveyor.engine.records import (
    AfterCommit,
    Dispatch,
    Finish,
)
from conveyor.engine.states import (
    ExecutionStatus,
    NodeStatus,
)
from conveyor.engine.triggering import follow_up
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    ConveyorError,
)


def outcome_status(store: Store, execution_id: uuid.UUID) -> ExecutionStatus | None:
    """The execution's status for a node's outcome: a finished one is read again under its
    row lock, so that an operator's requeue resuming it is seen, not raced."""
    status = store.execution_status(execution_id)
    if status is not None and status.finished:
        status = store.execution_status(execution_id, lock=True)
    return status


def settle(store: Store, run: NodeRun, now: datetime, output: Any = None) -> AfterCommit:
    """Propagate a settled node to its successors; finish the execution when all settled.
    The caller has read the execution's status: it is not finished."""
    execution, workflow = run.execution, run.workflow
    _, shape = load_workflow(store, execution.workflow_id)
    dispatches: list[Dispatch] = []
    settled = 1
    frontier = [run.node.id]
    while frontier:
        done = frontier.pop()
        successors = sorted(shape.successors[done])  # sorted: one lock order
        if not successors:
            continue
        left = store.decrement_waiting(execution.id, successors)
        ready = [workflow.node(s) for s in successors if left[s] == 0]
        if not ready:
            continue
        # Their needs' rows, all at once. A ready node never needs another ready one: that
        # one has not settled, so the first would still be waiting on it. Outputs only for a
        # delay node (its delay may be a template): a node's claim reads its needs' outputs.
        delays = any(node_types.waits(n) for n in ready)
        needs_of_ready = {need for n in ready for need in n.needs}
        rows = store.node_rows(execution.id, needs_of_ready, outputs=delays)
        runnable: list[tuple[Node, dict[str, Any]]] = []
        for successor in ready:
            needs = {
                need: planning.NeedState(status=rows[need].status, branch=rows[need].branch)
                for need in successor.needs
            }
            if planning.readiness(workflow, successor, needs) is planning.Readiness.SKIP:
                store.set_node(execution.id, successor.id, NodeStatus.SKIPPED, finished_at=now)
                settled += 1
                frontier.append(successor.id)
                continue
            outputs = {need: rows[need].output for need in successor.needs} if delays else {}
            runnable.append((successor, context_of(execution, outputs)))
        dispatches += enqueue_nodes(store, execution, workflow, runnable, now)
    known = {} if output is None else {run.node.id: output}
    finish = known_finish(run, shape, now, known)
    remaining = store.settle_nodes(execution.id, settled, finish)  # last: it locks the row
    if remaining == 0 and finish is None:
        _finish(store, run, shape, now, known)
    if remaining == 0:  # it finished: a follow-up left on it starts, a parent's node settles
        dispatches += follow_up(store, execution.id, workflow, now)
        return AfterCommit(dispatches=dispatches) + parents.child_finished(store, execution, now)
    return AfterCommit(dispatches=dispatches)


def node_failed(store: Store, run: NodeRun, now: datetime, error: str) -> AfterCommit:
    """A node recorded failed after its tries: its successors go on without it when it
    continues on failure; else the execution fails with ``error``, its nodes not started
    cancelled, its children stopped, a follow-up left on it starts (its messages) and, if it
    is a child, its parent's node settles. The jobs cancelled, its children's too, are for
    the limiter to forget."""
    if run.node.continue_on_failure:
        return settle(store, run, now)
    execution_id = run.execution.id
    cancelled = store.cancel_unstarted(execution_id, now)
    finished = store.finish_execution(execution_id, ExecutionStatus.FAILED, now, error=error)
    after = AfterCommit(
        dispatches=follow_up(store, execution_id, run.workflow, now), forget=cancelled
    )
    if finished:  # its children stop; if it is one, its parent's node settles
        # the rest of its children, past this transaction's share: stop_orphans
        after += AfterCommit(forget=stop_children(store, execution_id, now, error).forget)
        after += parents.child_finished(store, run.execution, now)
    return after


def known_finish(
    run: NodeRun, shape: planning.Plan, now: datetime, known: dict[str, Any]
) -> Finish | None:
    """How the execution completes if this settle proves its last, when the outputs in
    hand are all its output reads (the usual case of a sink): the settle completes it in
    the same statement. None: the outputs must be read (or the output fails to render)."""
    if not planning.output_reads(run.workflow, shape.sinks) <= known.keys():
        return None
    try:
        output = planning.execution_output(
            run.workflow, shape.sinks, known, context_of(run.execution, known)
        )
    except ConveyorError:
        return None  # _finish fails the execution with the error
    return Finish(output=output, now=now)


def _finish(
    store: Store,
    run: NodeRun,
    shape: planning.Plan,
    now: datetime,
    known: dict[str, Any],
) -> None:
    """Complete the execution with its output (or fail it, if the output cannot be made);
    ``known``: outputs already in hand, not read again."""
    execution = run.execution
    rows = store.node_rows(execution.id, [n.id for n in run.workflow.nodes if n.id not in known])
    outputs = {**{node_id: row.output for node_id, row in rows.items()}, **known}
    context = context_of(execution, outputs)
    try:
        output = planning.execution_output(run.workflow, shape.sinks, outputs, context)
    except ConveyorError as exc:
        store.finish_execution(
            execution.id, ExecutionStatus.FAILED, now, error=f"workflow output failed: {exc}"
        )
        return
    store.finish_execution(execution.id, ExecutionStatus.COMPLETED, now, output=output)
