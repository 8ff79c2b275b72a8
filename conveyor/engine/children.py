"""Child workflows: a workflow node's try starts an execution of another workflow (its child)
and waits for it, holding no worker slot and no permit; the child's finish settles the node.

The try's claim is the claim of any node. Then one transaction (:func:`start_child`) puts
the job in ``waiting_child`` and its node in ``waiting`` and creates the child as a trigger
does (planned at once when small, its first jobs published after commit): the worker lets go
of the job, and the gate gives back its permits, as after any try. A child is one per (job,
try): the start is guarded by the job's current try, and the child's key by the same pair.
A workflow node with ``map`` starts a child per item the same way, each item's job waiting
for its own child (its input rendered with the item's ``item`` and ``index``); the node
stays ``running``, the map's counter, until its items have settled.

The transaction that finishes the child, whichever way it finishes, settles the node
(:func:`settle_parent`, reached through :mod:`conveyor.engine.parents`): the waiting try
goes back to ``processing`` and ends as a node's try ends, completed with the child's output
(:func:`~conveyor.engine.success.complete_node`) or failed
(:func:`~conveyor.engine.failure.fail_node`: a retry, whose claim starts a new child, or a
dead letter). Should a wait be left unsettled all the same, the recovery sweep settles it
(:func:`settle_waiting`).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conveyor.engine import templates, triggering
from conveyor.engine.claiming import NodeRun
from conveyor.engine.failure import Failed, fail_node
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    AfterCommit,
    Dispatch,
    ExecutionOutcome,
    ExecutionRecord,
    ParentLink,
    WorkflowRecord,
)
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.success import complete_node
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    ChildDepthExceeded,
    ChildFailed,
    ConveyorError,
    NodeCancelled,
    NodeError,
    NonRetryableError,
    TooManyChildren,
)

# How deep children may nest when the setting is not given (CONVEYOR_MAX_CHILD_DEPTH).
DEFAULT_MAX_DEPTH = 8
# How many children one execution may start when the setting is not given
# (CONVEYOR_MAX_CHILDREN).
DEFAULT_MAX_CHILDREN = 1_000


@dataclass(frozen=True, kw_only=True)
class Started:
    """What a workflow node's try came to: its job waits for a child (``waiting``; the child
    it started, ``child_id``, and its first jobs' messages to publish), or the try failed
    before it could start one (``failed``, with the ``error``: its input, its depth or its
    workflow). Neither: the try was reclaimed meanwhile, and nothing was done."""

    dispatches: list[Dispatch]
    waiting: bool = False
    child_id: uuid.UUID | None = None  # None: none started now (this try's exists already)
    failed: Failed | None = None
    error: ConveyorError | None = None


def start_child(
    store: Store,
    run: NodeRun,
    now: datetime,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_children: int = DEFAULT_MAX_CHILDREN,
    rng: random.Random | None = None,
) -> Started:
    """The claimed try of a workflow node, in one transaction: its job ``waiting_child`` and
    its node ``waiting`` while try ``run.job.try_number`` is current, and the child made. A
    child past ``max_depth``, one more than ``max_children`` of its execution (counted under
    the execution's row lock, so two nodes starting children at once take turns), a
    workflow (or version) the tenant has not applied, or inputs that do not render fail the
    try, not retried. An execution that finished (a cancel, a failure elsewhere) before
    this transaction took its row lock starts no child: the try ends cancelled, as any try
    of a stopped execution does."""
    status = store.execution_status(run.execution.id, lock=True)  # a stop: before or after
    if status is None or status.finished:
        ended = status.value if status is not None else "deleted"
        stopped = NodeCancelled(f"its execution was {ended} before the child started")
        failed = fail_node(store, run, stopped, now, 0.0, rng)
        return Started(dispatches=failed.dispatches, failed=failed, error=stopped)
    try:
        _check_breadth(store, run, max_children)
        version, input = _child_of(store, run, max_depth)
    except ConveyorError as exc:
        failed = fail_node(store, run, exc, now, 0.0, rng)
        return Started(dispatches=failed.dispatches, failed=failed, error=exc)
    job = run.job
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.WAITING_CHILD, try_number=job.try_number
    ):
        return Started(dispatches=[])  # reclaimed meanwhile: its next try starts the child
    if job.item_index is None:  # (an item's node is its map's counter: it stays running)
        store.set_node(run.execution.id, run.node.id, NodeStatus.WAITING)
    link = ParentLink(
        execution_id=run.execution.id, node_id=run.node.id, job_id=job.id,
        try_number=job.try_number,
    )  # fmt: skip
    made = triggering.start_child(
        store, version=version, input=input, parent=run.execution, link=link, now=now
    )
    if made.replayed:  # this try's child exists already: the node waits for that one
        return Started(dispatches=[], waiting=True)
    return Started(dispatches=made.dispatches, waiting=True, child_id=made.execution_id)


def _check_breadth(store: Store, run: NodeRun, max_children: int) -> None:
    """:class:`TooManyChildren` when the execution has started ``max_children`` already."""
    if store.children_started(run.execution.id, max_children) < max_children:
        return
    raise TooManyChildren(
        f"node {run.node.id!r} would start child number {max_children + 1} of execution "
        f"{run.execution.id}, past the limit of {max_children} (CONVEYOR_MAX_CHILDREN): "
        f"each try of a workflow node starts one; start fewer (fewer workflow nodes, or "
        f"fewer tries of them), or raise CONVEYOR_MAX_CHILDREN"
    )


def _child_of(store: Store, run: NodeRun, max_depth: int) -> tuple[WorkflowRecord, Any]:
    """The version the node starts (its pinned one, else the latest now) and its input."""
    depth = run.execution.depth + 1
    if depth > max_depth:
        raise ChildDepthExceeded(
            f"node {run.node.id!r} would start a child at depth {depth}, past the limit of "
            f"{max_depth} (CONVEYOR_MAX_CHILD_DEPTH): its workflows start each other in a "
            f"circle, or nest deeper than that; break the circle, or raise the setting"
        )
    name, version = run.node.config["workflow"], run.node.config.get("version")
    if version is None:
        found = store.latest_workflow(run.execution.tenant_id, name)
    else:
        found = store.workflow_version(run.execution.tenant_id, name, version)
    if found is None:
        which = f"workflow {name!r}" + (f" version {version}" if version is not None else "")
        raise NonRetryableError(
            f"node {run.node.id!r} starts {which}, which this tenant has not applied; apply "
            f"it first (conveyor workflow apply FILE)"
        )
    if run.inputs is not None:  # a rerun gave the node its input
        return found, run.inputs
    return found, templates.render_value(run.node.inputs, run.context)


def settle_parent(store: Store, child: ExecutionRecord, now: datetime) -> AfterCommit:
    """In the transaction that finished ``child``: the parent's node waiting on it settled,
    its try completed with the child's output, or failed (an error naming the child, its
    failed node and its dead letter) by the node's retry policy; a cancelled child fails it
    without a retry. Nothing when the node does not wait on it (settled already, or stopped
    with its execution). What is left to do after commit."""
    link = child.parent
    outcome = store.execution_outcome(child.id)
    if link is None or outcome is None or not outcome.status.finished:
        return AfterCommit()
    job = store.resume_waiting(link.job_id, link.try_number)
    if job is None:
        return AfterCommit()
    parent = store.execution(link.execution_id)
    workflow, _ = load_workflow(store, parent.workflow_id)
    run = NodeRun(
        job=job, execution=parent, workflow=workflow, node=workflow.node(link.node_id),
        context={},
    )  # fmt: skip
    duration = max(0.0, (now - outcome.created_at).total_seconds())
    if outcome.status is ExecutionStatus.COMPLETED:
        return complete_node(store, run, outcome.output, now, duration)
    return fail_node(store, run, child_error(child.id, outcome), now, duration).after


def child_error(child_id: uuid.UUID, outcome: ExecutionOutcome) -> NodeError:
    """Why a workflow node failed: its child failed (retried as the node's policy says) or
    was cancelled (not retried: a cancel is deliberate)."""
    if outcome.status is ExecutionStatus.CANCELLED:
        return NonRetryableError(f"child execution {child_id} was cancelled: {outcome.error}")
    where = ""
    if outcome.dead_letter is not None:
        job_id, node_id = outcome.dead_letter
        where = f" at node {node_id!r} (dead letter {job_id})"
    return ChildFailed(f"child execution {child_id} failed{where}: {outcome.error}")


def settle_waiting(store: Store, now: datetime, limit: int) -> tuple[int, AfterCommit]:
    """The recovery sweep's belt and braces: up to ``limit`` waits of parents' nodes whose
    child has finished, settled (none should be left: a child's finish settles its parent's
    node in the same transaction). How many, and what is left to do after commit."""
    found = store.children_to_settle(limit)
    after = AfterCommit()
    for child_id in found:
        after += settle_parent(store, store.execution(child_id), now)
    return len(found), after
