"""A node job's claim: queued -> processing, its try started, and what the node reads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from conveyor.engine import trigger_limits
from conveyor.engine.bounds import Bounds
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.ports import Store
from conveyor.engine.ready import context_of
from conveyor.engine.records import (
    Dispatch,
    ExecutionRecord,
    JobRecord,
    NodeHints,
)
from conveyor.engine.states import (
    JobStatus,
    NodeStatus,
)
from conveyor.engine.workflows import cached_workflow, load_workflow


@dataclass(frozen=True, kw_only=True)
class NodeRun:
    """A claimed node job with everything needed to run it outside any transaction."""

    job: JobRecord
    execution: ExecutionRecord
    workflow: Workflow
    node: Node
    context: dict[str, Any]
    # The input a rerun gave the node, taken in place of its rendered inputs (None: theirs).
    inputs: dict[str, Any] | None = None
    # The largest output its node may record, as JSON (CONVEYOR_MAX_OUTPUT_BYTES): a map's
    # items' outputs, put together by the item that settles last, are held to it.
    output_bytes: int = Bounds().output_bytes
    # Whether the claim read the execution's input: a map's item whose templates do not read
    # it leaves it out (execution.input None); what settles its map reads it (with_input).
    input_read: bool = True

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def timeout(self) -> float | None:
        return trigger_limits.timeout(self.workflow, self.node, self.execution.limits)


def claim_node(
    store: Store,
    job_id: uuid.UUID,
    now: datetime,
    worker: str | None = None,
    hints: NodeHints | None = None,
    *,
    output_bytes: int = Bounds().output_bytes,
) -> NodeRun | None:
    """queued -> processing, a new attempt row, and the inputs the node will read (read by
    the claim itself when the message's hints name the node); ``output_bytes`` bounds what
    its outcome may record (:attr:`NodeRun.output_bytes`)."""
    hinted = _hinted(hints)
    # with its attempt and node started, and the outputs of the hinted needs
    claimed = store.claim_node_job(
        job_id, now, worker, needs=hinted.needs if hinted else (),
        input=hinted.input if hinted else True,
    )  # fmt: skip
    return _run_of(store, claimed, hinted, now, output_bytes)


def claim_continuation(
    store: Store,
    dispatch: Dispatch,
    now: datetime,
    worker: str | None = None,
    *,
    output_bytes: int = Bounds().output_bytes,
) -> NodeRun | None:
    """The claim of the one node a success made ready, in that success's transaction, by
    the worker that runs it next instead of publishing ``dispatch`` (a chain's next step):
    None, nothing claimed, while a job of a higher priority waits in its queue (then the
    message is published as any other). See docs/guarantees.md#continuations."""
    hinted = _hinted(dispatch.hints)
    claimed = store.claim_continuation(
        dispatch.job_id, now, worker, queue=dispatch.queue, priority=dispatch.priority,
        needs=hinted.needs if hinted else (), input=hinted.input if hinted else True,
    )  # fmt: skip
    return _run_of(store, claimed, hinted, now, output_bytes)


def run_of(
    store: Store,
    claimed: tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None,
    hints: NodeHints | None,
    now: datetime,
    output_bytes: int = Bounds().output_bytes,
) -> NodeRun | None:
    """The run of a job a store's transition claimed (a chain's step,
    :func:`~conveyor.engine.success.complete_step`), its message's ``hints`` saying what the
    claim read."""
    return _run_of(store, claimed, _hinted(hints), now, output_bytes)


def _run_of(
    store: Store,
    claimed: tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None,
    hinted: _Hinted | None,
    now: datetime,
    output_bytes: int,
) -> NodeRun | None:
    """The run a claim took, with what its node reads (None: nothing to run)."""
    if claimed is None:
        return None
    job, execution, outputs = claimed
    assert job.node_id is not None
    if execution.status.finished:  # the claim started nothing: cancel the job
        store.transition_job(job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, completed_at=now)
        if job.item_index is None:  # (an item's node is its map's, which ended as it ended)
            store.set_node(execution.id, job.node_id, NodeStatus.CANCELLED, finished_at=now)
        return None
    workflow, _ = load_workflow(store, execution.workflow_id)
    node = workflow.node(job.node_id)
    item = job.item_index is not None
    # A map node's own job reads every need (its ``over``); the hint named its items' reads.
    makes_items = node.map is not None and not item
    if outputs is None or hinted is None or hinted.node_id != job.node_id or makes_items:
        rows = store.node_rows(execution.id, node.item_reads if item else node.needs)
        outputs = {need: row.output for need, row in rows.items()}
    input_read = hinted is None or hinted.input
    if not input_read and (not item or hinted is None or hinted.node_id != job.node_id):
        execution, input_read = store.execution(execution.id), True
    context = context_of(execution, outputs)
    if item:
        context |= {"item": job.item, "index": job.item_index}
    # Only an execution that was re-run may have one: no other claim pays for the read.
    inputs = store.rerun_input(execution.id, node.id) if execution.reruns else None
    return NodeRun(
        job=job, execution=execution, workflow=workflow, node=node, context=context,
        inputs=inputs, output_bytes=output_bytes, input_read=input_read,
    )  # fmt: skip


def with_input(store: Store, run: NodeRun) -> NodeRun:
    """``run`` with its execution's input, for what settles a map (its successors' and the
    execution's output templates may read it) after an item's claim left it out."""
    if run.input_read:
        return run
    return replace(run, execution=store.execution(run.execution.id), input_read=True)


@dataclass(frozen=True)
class _Hinted:
    """What the claim reads for the node a message's hints name."""

    node_id: str
    needs: list[str]  # the needs whose outputs it reads
    input: bool  # whether it reads the execution's input


def _hinted(hints: NodeHints | None) -> _Hinted | None:
    """The hinted node and what its claim reads, when its definition is in this process's
    cache: for a map, what its items read (a chained map's items never read the list they came
    from, nor the input unless their templates name it; the map node's own job reads the
    rest)."""
    if hints is None or hints.node_id is None:
        return None
    cached = cached_workflow(hints.workflow_id)
    if cached is None:
        return None
    try:
        node = cached[0].node(hints.node_id)
    except KeyError:  # a hint naming no node of that version: the claim reads the job's
        return None
    if node.map is None:
        return _Hinted(node.id, sorted(set(node.needs)), input=True)
    return _Hinted(node.id, sorted(set(node.item_reads)), input=node.item_reads_input)
