"""A node's successful try recorded, with the successors it makes ready."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conveyor.engine import claiming, mapping, node_types, planning
from conveyor.engine.bounds import Bounds
from conveyor.engine.claiming import NodeRun
from conveyor.engine.definitions import DedupePolicy
from conveyor.engine.ports import Store
from conveyor.engine.ready import new_jobs, node_dispatches
from conveyor.engine.records import (
    AfterCommit,
    Dispatch,
    NewJob,
    Succeeded,
)
from conveyor.engine.settling import known_finish, outcome_status, settle
from conveyor.engine.states import (
    AttemptStatus,
    JobKind,
    JobStatus,
    NodeStatus,
)
from conveyor.engine.workflows import cached_workflow, load_workflow


def complete_alone(store: Store, run: NodeRun, output: Any, now: datetime, duration: float) -> bool:
    """Record a successful try in one statement, for the caller to run alone (no
    transaction round trips), in the common cases where the database can: the node makes no
    successor ready (each still waits on another node), and, if nothing waits on it, the
    execution's output is its own output's to make should it be the last. False when the
    case is another (a successor becomes ready, an output to read, the execution or the job
    no longer running): nothing was changed, and :func:`complete_node` does it. Never for a
    map's item: its node is the map's counter (:func:`~conveyor.engine.mapping.complete_item`)."""
    if run.job.item_index is not None:
        return False
    _, shape = load_workflow(store, run.execution.workflow_id)
    successors = shape.successors[run.node.id]
    if any(shape.waiting_on[s] == 1 for s in successors):
        return False  # it settles that successor (a chain's next step): spare the statement
    finish = None
    if not successors:
        finish = known_finish(run, shape, now, {run.node.id: output})
        if finish is None:
            return False  # it may be the last: the execution's output must be read
        if run.workflow.dedupe.policy is not DedupePolicy.KEEP_FIRST:
            return False  # it may be the last: a follow-up left on it is to start
        if run.execution.parent is not None:
            return False  # it may be the last: its parent's node is to settle
    branch = node_types.branch_of(run.node, output)
    return store.complete_running(
        run.job, run.node.id, output=output, branch=branch, now=now, duration=duration,
        successors=sorted(successors), finish=finish,
    )  # fmt: skip


def complete_fast(
    store: Store, run: NodeRun, output: Any, now: datetime, duration: float
) -> list[Dispatch] | None:
    """Record a successful try without a transaction around it where the database can
    (:func:`complete_alone`; a map's item that is not its map's last,
    :func:`~conveyor.engine.mapping.complete_alone`): the messages to publish. None:
    nothing was changed, and :func:`complete_node` does it."""
    if run.job.item_index is not None:
        return mapping.complete_alone(store, run, output, now, duration)
    return [] if complete_alone(store, run, output, now, duration) else None


@dataclass(frozen=True, kw_only=True)
class Step:
    """A chain's next step, made ready by a success alone (:func:`chain_step`): its job,
    the message that publishes it, and whether its predecessor's worker asks to claim it."""

    job: NewJob
    dispatch: Dispatch
    claim: bool


def chain_step(run: NodeRun, output: Any, now: datetime, *, claim: bool) -> Step | None:
    """The step a success makes ready when it is a chain's: the node's one successor, which
    waits on it alone, runs (no branch skips it) as a plain node's job (no delay to hold it,
    no map to expand) in an execution never re-run (no held job to take). None: another
    case, for :func:`complete_node`, or a definition this process no longer holds (its claim
    parsed it). Decided from the definition alone, no store read: the store checks the rows
    (:meth:`~conveyor.engine.ports.Jobs.complete_step`)."""
    if run.job.item_index is not None or run.execution.reruns:
        return None
    cached = cached_workflow(run.execution.workflow_id)
    if cached is None:
        return None
    workflow, shape = cached
    successors = shape.successors[run.node.id]
    if len(successors) != 1 or shape.waiting_on[successors[0]] != 1:
        return None
    successor = workflow.node(successors[0])
    if node_types.waits(successor) or successor.map is not None:
        return None
    settled = planning.NeedState(
        status=NodeStatus.COMPLETED, branch=node_types.branch_of(run.node, output)
    )
    if planning.readiness(workflow, successor, {run.node.id: settled}) is planning.Readiness.SKIP:
        return None
    (job,) = new_jobs(workflow, [(successor, {})], now, limits=run.execution.limits)
    (dispatch,) = node_dispatches(run.execution, workflow.name, [job], now)
    return Step(job=job, dispatch=dispatch, claim=claim)


def complete_step(
    store: Store,
    run: NodeRun,
    output: Any,
    now: datetime,
    duration: float,
    step: Step,
    worker: str | None = None,
    *,
    output_bytes: int = Bounds().output_bytes,
) -> tuple[AfterCommit, NodeRun | None] | None:
    """A chain's step recorded in one statement where the database can (no transaction
    round trips): the success and its successor's job, claimed for ``worker`` to run next
    when ``step.claim`` and nothing of a higher priority waits (the run it claimed), else
    queued (its message, to publish). None: the rows were not the chain's case (nothing was
    changed), and :func:`complete_node` does it. See docs/guarantees.md#continuations."""
    succeeded = Succeeded(
        job=run.job, node_id=run.node.id, output=output,
        branch=node_types.branch_of(run.node, output), now=now, duration=duration,
        execution=run.execution,
    )  # fmt: skip
    stepped = store.complete_step(succeeded, step.job, worker=worker, claim=step.claim)
    if stepped is None:
        return None
    if stepped.claimed is None:
        return AfterCommit(dispatches=[step.dispatch]), None
    taken = claiming.run_of(store, stepped.claimed, step.dispatch.hints, now, output_bytes)
    return AfterCommit(), taken


def continuation(after: AfterCommit, queue: str) -> Dispatch | None:
    """The message of a success's that its worker may take itself instead of publishing (a
    chain's next step): the only thing the success left to do is publish one node job's
    message to ``queue``, the worker's own. None: publish them all."""
    if len(after.dispatches) != 1 or after.forget:
        return None
    (only,) = after.dispatches
    if only.kind is not JobKind.NODE or only.queue != queue or only.hints is None:
        return None
    return only


def complete_node(
    store: Store,
    run: NodeRun,
    output: Any,
    now: datetime,
    duration: float,
    *,
    branch: str | None = None,
) -> AfterCommit:
    """Record a successful try and start every successor that became ready (a map's item:
    the map counted down, see :mod:`conveyor.engine.mapping`); ``branch`` given, the branch
    it took (a wait's), else its output's for a type whose output picks one. What is left
    to do after commit: the messages and, should a map's last item fail the map (run_all)
    or a child's finish fail its parent's node, the jobs that stop cancelled."""
    if run.job.item_index is not None:
        return mapping.complete_item(store, run, output, now, duration)
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    branch = branch or node_types.branch_of(run.node, output)
    if store.complete_running(
        job, node_id, output=output, branch=branch, now=now, duration=duration
    ):  # the common case, in one statement where the database can
        return settle(store, run, now, output)
    status = outcome_status(store, execution_id)
    cancelled = status is not None and status.finished
    # A node that returns after its execution was cancelled (or failed elsewhere) keeps its
    # output for inspection but is recorded as cancelled: it may have stopped on ctx.cancelled.
    job_status, node_status = (
        (JobStatus.CANCELLED, NodeStatus.CANCELLED)
        if cancelled
        else (JobStatus.COMPLETED, NodeStatus.COMPLETED)
    )
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, job_status, try_number=job.try_number, completed_at=now,
        last_error=None,
    ):  # fmt: skip
        return AfterCommit()  # reclaimed meanwhile
    store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    store.set_node(
        execution_id,
        node_id,
        node_status,
        output=output,
        branch=branch,
        finished_at=now,
        error=f"execution {status.value} while the node ran" if cancelled and status else None,
    )
    if cancelled:
        return AfterCommit()
    return settle(store, run, now, output)


def expand(
    store: Store,
    run: NodeRun,
    items: list[Any],
    now: datetime,
    duration: float,
    window: int,
) -> AfterCommit:
    """The successful try of a map node's own job, which gave ``items`` (its ``over``): an
    empty list completes the node at once with the output [] (its successors go on); else a
    job per item is made, ``window`` at most queued (see :mod:`conveyor.engine.mapping`)."""
    if not items:
        mapping.retire_earlier(store, run, 0, now)  # a re-run map's items of a longer list
        return complete_node(store, run, [], now, duration)
    return AfterCommit(dispatches=mapping.open_map(store, run, items, now, duration, window))
