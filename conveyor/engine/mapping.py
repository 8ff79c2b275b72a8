"""Run-time fan-out: a node with ``map`` runs once per item of a list read at run time.

The map node's own job becomes ready and runs as any node's does, but its try renders ``over``
(:func:`items_of`) instead of calling the function, and its success makes a job per item
(:func:`open_map`): the first of them queued, up to the map's window (its ``concurrency``, or
CONVEYOR_MAP_WINDOW if lower or unset), the rest ``held``, without a message. Each item is a
node job like any other: its own permits, claim, tries, timeout, heartbeats and dead letter.

The node's state is the map's counter. Each item that settles (completes, or dies after its
tries) counts it down under the row's lock and releases the held item a window after it (its
job names that item's, found by key however long the list), in its own transaction
(published after the commit): each place in the window runs one item after another, so at
most a window of items is queued or running. The item that counts the last finishes the
node, its output the items' outputs in index order (one ordered read), and settles it as any
node settles; so the fan-in happens once, however the last items finish. An item that fails
is handled as the map's ``on_item_failure`` says (:func:`item_dead`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from conveyor.engine import bounds, templates, trigger_limits
from conveyor.engine.claiming import NodeRun, with_input
from conveyor.engine.definitions import ItemFailure, MapSpec, Node
from conveyor.engine.ports import Store
from conveyor.engine.ready import dispatch_of, node_dispatches
from conveyor.engine.records import Dispatch, ItemRow, NewItem, NewJob
from conveyor.engine.settling import node_failed, outcome_status, settle
from conveyor.engine.states import AttemptStatus, JobStatus, NodeStatus
from conveyor.exceptions import NonRetryableError
from conveyor.ids import new_id

# Item jobs inserted a statement at a time: a list of 100,000 is never one statement's rows.
ITEM_CHUNK = 1000
# Failed items a run_all failure names (the count says how many more).
SHOWN_FAILURES = 20


def spec(node: Node) -> MapSpec:
    assert node.map is not None, f"node {node.id!r} does not map"
    return node.map


def makes_items(run: NodeRun) -> bool:
    """Whether this try is a map node's own job, which makes the items (not an item)."""
    return run.node.map is not None and run.job.item_index is None


def window(node: Node, most: int) -> int:
    """How many of the map's items may be queued or running at once: its ``concurrency``,
    bounded by ``most`` (CONVEYOR_MAP_WINDOW), which bounds every map's messages."""
    cap = spec(node).concurrency
    return most if cap is None else min(cap, most)


def items_of(run: NodeRun) -> list[Any]:
    """The list ``over`` gives in the node's context, rendered once, by the map node's own
    try; anything else fails that try, not retried (it would give the same every time)."""
    over = spec(run.node).over
    value = templates.render_value(over, run.context)
    if callable(value):  # ``x.items`` is the dict's method, not its key "items"
        raise NonRetryableError(
            f"map over `{over}` gave a function, not a list: a dict's own method (items, keys, "
            f"values, ...) hides a key of the same name; write {_subscript(over)} instead"
        )
    if not isinstance(value, list):
        raise NonRetryableError(
            f"map over `{over}` gave {_kind(value)}, not a list: {bounds.shown(value)}; make "
            f"it give a list (of the items to run the node once each for)"
        )
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(
            f"map over `{over}` gave a list whose items are not all JSON ({exc}); give "
            f"dicts, lists, strings, finite numbers, booleans or None"
        ) from exc
    return value


def _subscript(over: str) -> str:
    """``{{ a.b.items }}`` as ``a.b['items']``: the last name read as a key."""
    inner = over.strip().removeprefix("{{").removesuffix("}}").strip()
    head, _, last = inner.rpartition(".")
    return f"{head}['{last}']" if head and last.isidentifier() else "x['name']"


def _kind(value: Any) -> str:
    """What a value is, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a dict"
    return f"a {type(value).__name__}"


def open_map(
    store: Store, run: NodeRun, items: list[Any], now: datetime, duration: float, most: int
) -> list[Dispatch]:
    """The map node's own try succeeded with a non-empty list: the try recorded, a job per
    item (those past the window held), the node's counter set; the queued items' messages.
    The node stays running until its items have settled."""
    job, execution, node = run.job, run.execution, run.node
    status = outcome_status(store, execution.id)
    if status is None or status.finished:  # as a try that ends after its execution did
        if store.transition_job(
            job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
            completed_at=now,
        ):  # fmt: skip
            store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
            store.set_node(execution.id, node.id, NodeStatus.CANCELLED, finished_at=now)
        return []
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.COMPLETED, try_number=job.try_number,
        completed_at=now, last_error=None,
    ):  # fmt: skip
        return []  # reclaimed meanwhile
    store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    room = window(node, most)
    retries = trigger_limits.retry_policy(run.workflow, node, execution.limits).max_attempts - 1
    queued: list[NewJob] = []
    for chunk in _chunks(items, room):
        store.add_item_jobs(execution, node.id, chunk, retries, now)
        queued += [
            NewJob(id=c.id, node_id=node.id, max_retries=retries) for c in chunk if not c.held
        ]
    store.open_map(execution.id, node.id, len(items))
    return node_dispatches(execution, run.workflow.name, queued, now)


def _chunks(items: list[Any], room: int) -> Iterator[list[NewItem]]:
    """The items' jobs, ITEM_CHUNK at a time, those past the first ``room`` held, each naming
    the item ``room`` after it, which its settle releases. Ids are made ahead only as far as
    the chunk's last item names: a chunk and a window of them, not the whole list's."""
    ids: dict[int, uuid.UUID] = {}

    def id_of(index: int) -> uuid.UUID:
        if index not in ids:
            ids[index] = new_id()
        return ids[index]

    for start in range(0, len(items), ITEM_CHUNK):
        indices = range(start, min(start + ITEM_CHUNK, len(items)))
        chunk = [
            NewItem(
                id=id_of(i), index=i, item=items[i], held=i >= room,
                releases=id_of(i + room) if i + room < len(items) else None,
            )
            for i in indices
        ]  # fmt: skip
        for i in indices:
            del ids[i]
        yield chunk


def complete_alone(
    store: Store, run: NodeRun, output: Any, now: datetime, duration: float
) -> list[Dispatch] | None:
    """An item's success in one statement, for the caller to run alone, when it is not its
    map's last: the held item it released, to publish. None: nothing changed (it may be the
    last, or it no longer runs): :func:`complete_item` does it in a transaction."""
    counted = store.complete_item_alone(run.job, run.node.id, output, now, duration)
    if counted is None:
        return None
    return [dispatch_of(counted.released, run.workflow.name)] if counted.released else []


def complete_item(
    store: Store, run: NodeRun, output: Any, now: datetime, duration: float
) -> list[Dispatch]:
    """An item's successful try: its output kept on its job, the map counted down (the held
    item it names released, and the node finished if it was the last)."""
    job = run.job
    if store.complete_item(job, output, now, duration):
        return settled(store, run, now)
    status = outcome_status(store, run.execution.id)
    if status is None or not status.finished:
        return []  # reclaimed meanwhile
    # it ended after its execution did: cancelled, its output kept
    if store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
        completed_at=now, last_error=None, output=output,
    ):  # fmt: skip
        store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    return []


def item_dead(store: Store, run: NodeRun, now: datetime, message: str) -> list[Dispatch]:
    """An item whose job was just dead-lettered (its tries spent): with ``fail_fast`` the
    node fails at once (once, whichever item is first), its items not started cancelled, and
    the execution fails unless the node continues on failure; otherwise the item counts as
    settled, failed, and the map goes on."""
    node, execution_id = run.node, run.execution.id
    if spec(node).on_item_failure is not ItemFailure.FAIL_FAST:
        return settled(store, run, now, failed=True)
    error = f"item {run.job.item_index} failed after {run.job.attempt} attempt(s): {message}"
    if store.close_map(execution_id, node.id, now, error) is None:
        return []  # it had failed already (another item first)
    return node_failed(store, with_input(store, run), now, f"node {node.id!r} failed: {error}")


def settled(store: Store, run: NodeRun, now: datetime, *, failed: bool = False) -> list[Dispatch]:
    """One more item settled: the map counted down, the held item it names released, and the
    node finished by the item that counted the last (nothing, once the node has failed)."""
    counted = store.settle_item(run.job, run.node.id, failed, now)
    if counted is None:
        return []
    dispatches = [dispatch_of(counted.released, run.workflow.name)] if counted.released else []
    if counted.left == 0:
        dispatches += _finish(store, run, now, counted.failed)
    return dispatches


def _finish(store: Store, run: NodeRun, now: datetime, failed: int) -> list[Dispatch]:
    """Every item settled: the node completes with their outputs in index order (a failed
    item's slot its error, under ``continue``), or fails naming the failed items (run_all)."""
    run = with_input(store, run)  # its successors' and the execution's templates may read it
    execution_id, node_id = run.execution.id, run.node.id
    rows = store.item_outputs(execution_id, node_id)
    if failed and spec(run.node).on_item_failure is ItemFailure.RUN_ALL:
        error = _failures(rows)
        store.set_node(execution_id, node_id, NodeStatus.FAILED, finished_at=now, error=error)
        return node_failed(store, run, now, f"node {node_id!r} failed: {error}")
    output = [{"error": r.error} if r.failed else r.output for r in rows]
    store.set_node(
        execution_id, node_id, NodeStatus.COMPLETED, output=output, finished_at=now, error=None
    )
    return settle(store, run, now, output)


def _failures(rows: list[ItemRow]) -> str:
    failed = [r for r in rows if r.failed]
    shown = ", ".join(str(r.index) for r in failed[:SHOWN_FAILURES])
    if len(failed) > SHOWN_FAILURES:
        shown += f" and {len(failed) - SHOWN_FAILURES} more"
    first = failed[0]
    return (
        f"{len(failed)} of {len(rows)} items failed (indices {shown}); item {first.index}: "
        f"{first.error}"
    )
