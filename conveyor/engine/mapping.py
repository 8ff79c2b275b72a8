"""Run-time fan-out: a node with ``map`` runs once per item of a list read at run time.

The map node's own job becomes ready and runs as any node's does, but its try renders ``over``
(:func:`items_of`) instead of calling the function, and its success makes a job per item
(:func:`open_map`): the first of them queued, up to the map's window (its ``concurrency``, or
CONVEYOR_MAP_WINDOW if lower or unset), the rest ``held``, without a message. Each item is a
node job like any other: its own permits, claim, tries, timeout, heartbeats and dead letter.

The node's state is the map's counter. Each item that settles (completes, or dies after its
tries) counts it down under the row's lock and releases the held item a window after it (its
job names that item's index, found by the map's key however long the list), in its own
transaction (published after the commit): each place in the window runs one item after
another, so at most a window of items is queued or running. The item that counts the last
finishes the node, its output the items' outputs in index order (one ordered read), and
settles it as any node settles; so the fan-in happens once, however the last items finish.
An item that fails is handled as the map's ``on_item_failure`` says (:func:`item_dead`).

A rerun through a map (:mod:`conveyor.engine.reruns`) holds its items' jobs with the node's own
and clears its counter; when the node's own try renders the list again, each item whose index
had a job takes that job again, its tries numbered on after the earlier ones (as a node's one
job is taken again), and an earlier run's items past the new list are cancelled, out of the
node's output and counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from conveyor.engine import bounds, node_types, templates, trigger_limits
from conveyor.engine.cancellation import stop_children
from conveyor.engine.claiming import NodeRun, with_input
from conveyor.engine.definitions import ItemFailure, MapSpec, Node
from conveyor.engine.ports import Store
from conveyor.engine.ready import dispatch_of, node_dispatches
from conveyor.engine.records import AfterCommit, Dispatch, ItemRow, NewItem, NewJob
from conveyor.engine.settling import node_failed, outcome_status, settle
from conveyor.engine.states import AttemptStatus, JobStatus, NodeStatus
from conveyor.exceptions import NonRetryableError
from conveyor.ids import new_id

# Item jobs inserted a statement at a time: a list of 100,000 is never one statement's rows.
ITEM_CHUNK = 1000
# The longest list a map runs when the setting is not given (CONVEYOR_MAP_MAX_ITEMS).
DEFAULT_MAX_ITEMS = 100_000
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


def most_items(node: Node, most: int) -> int:
    """The longest list the map runs: its ``max_items``, bounded by ``most``
    (CONVEYOR_MAP_MAX_ITEMS), which bounds every map's."""
    cap = spec(node).max_items
    return most if cap is None else min(cap, most)


def items_of(run: NodeRun, most: int = DEFAULT_MAX_ITEMS) -> list[Any]:
    """The list ``over`` gives in the node's context, rendered once, by the map node's own
    try; anything else, or a list longer than :func:`most_items`, fails that try, not
    retried (it would give the same every time)."""
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
    if len(value) > most_items(run.node, most):
        raise NonRetryableError(_too_long(over, len(value), spec(run.node).max_items, most))
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(
            f"map over `{over}` gave a list whose items are not all JSON ({exc}); give "
            f"dicts, lists, strings, finite numbers, booleans or None"
        ) from exc
    return value


def _too_long(over: str, length: int, cap: int | None, most: int) -> str:
    """Why a list is too long to map: past the map's own ``max_items``, or the setting."""
    fix = "give fewer items (map over batches of them, or split the list between maps)"
    if cap is not None and cap < most:
        return (
            f"map over `{over}` gave a list of {length} items, more than the map's max_items "
            f"of {cap}; {fix}, or raise max_items (up to CONVEYOR_MAP_MAX_ITEMS, {most})"
        )
    return (
        f"map over `{over}` gave a list of {length} items, more than the limit of {most} "
        f"(CONVEYOR_MAP_MAX_ITEMS); {fix}, or raise CONVEYOR_MAP_MAX_ITEMS"
    )


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
    The node stays running until its items have settled. The execution's status is read
    under its row lock first, so that a stop (a cancel, a failure elsewhere) comes wholly
    before this transaction, which then makes no item (the try ends cancelled), or after
    it, and then cancels the items made."""
    job, execution, node = run.job, run.execution, run.node
    status = store.execution_status(execution.id, lock=True)  # a stop: before or after
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
    rerun = execution.reruns > 0  # its items may have jobs of an earlier run, taken again
    queued: list[NewJob] = []
    for chunk in _chunks(items, room):
        kept = store.renew_items(execution, node.id, chunk, retries, now) if rerun else {}
        store.add_item_jobs(
            execution, node.id, [c for c in chunk if c.index not in kept], retries, now
        )
        queued += [
            NewJob(id=kept.get(c.index, c.id), node_id=node.id, max_retries=retries)
            for c in chunk
            if not c.held
        ]
    if rerun:
        retire_earlier(store, run, len(items), now)
    store.open_map(execution.id, node.id, len(items))
    return node_dispatches(execution, run.workflow.name, queued, now)


def retire_earlier(store: Store, run: NodeRun, total: int, now: datetime) -> None:
    """In a re-run execution, the items of an earlier run of the map past the ``total`` of
    its list now: cancelled, out of its output and its counts (their tries stay)."""
    if run.execution.reruns:
        error = f"not in the map's list since a rerun ({total} item(s) now)"
        store.retire_items(run.execution.id, run.node.id, total, now, error)


def _chunks(items: list[Any], room: int) -> Iterator[list[NewItem]]:
    """The items' jobs, ITEM_CHUNK at a time, those past the first ``room`` held, each naming
    the index ``room`` after it, whose held item its settle releases (by the map's key: the
    same index in a re-run map, whichever job it takes)."""
    for start in range(0, len(items), ITEM_CHUNK):
        yield [
            NewItem(
                id=new_id(), index=i, item=items[i], held=i >= room,
                releases=i + room if i + room < len(items) else None,
            )
            for i in range(start, min(start + ITEM_CHUNK, len(items)))
        ]  # fmt: skip


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
) -> AfterCommit:
    """An item's successful try: its output kept on its job, the map counted down (the held
    item it names released, and the node finished if it was the last)."""
    job = run.job
    if store.complete_item(job, output, now, duration):
        return settled(store, run, now)
    status = outcome_status(store, run.execution.id)
    if status is None or not status.finished:
        return AfterCommit()  # reclaimed meanwhile
    # it ended after its execution did: cancelled, its output kept
    if store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
        completed_at=now, last_error=None, output=output,
    ):  # fmt: skip
        store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    return AfterCommit()


def item_dead(store: Store, run: NodeRun, now: datetime, message: str) -> AfterCommit:
    """An item whose job was just dead-lettered (its tries spent): with ``fail_fast`` the
    node fails at once (once, whichever item is first), its items not started cancelled (for
    the limiter to forget; a map of children's children stopped), and the execution fails
    unless the node continues on failure; otherwise the item counts as settled, failed, and
    the map goes on."""
    node, execution_id = run.node, run.execution.id
    if spec(node).on_item_failure is not ItemFailure.FAIL_FAST:
        return settled(store, run, now, failed=True)
    error = f"item {run.job.item_index} failed after {run.job.attempt} attempt(s): {message}"
    cancelled = store.close_map(execution_id, node.id, now, error)
    if cancelled is None:
        return AfterCommit()  # it had failed already (another item first)
    if node_types.starts_child(node):  # the children its items wait for stop with the map
        why = f"map node {node.id!r} failed: {error}"
        cancelled = cancelled + stop_children(store, execution_id, now, why, node_id=node.id).forget
    return AfterCommit(forget=cancelled) + node_failed(
        store, with_input(store, run), now, f"node {node.id!r} failed: {error}"
    )


def settled(store: Store, run: NodeRun, now: datetime, *, failed: bool = False) -> AfterCommit:
    """One more item settled: the map counted down, the held item it names released, and the
    node finished by the item that counted the last (nothing, once the node has failed)."""
    counted = store.settle_item(run.job, run.node.id, failed, now)
    if counted is None:
        return AfterCommit()
    released = [dispatch_of(counted.released, run.workflow.name)] if counted.released else []
    after = AfterCommit(dispatches=released)
    if counted.left == 0:
        after += _finish(store, run, now, counted.failed)
    return after


def _finish(store: Store, run: NodeRun, now: datetime, failed: int) -> AfterCommit:
    """Every item settled: the node completes with their outputs in index order (a failed
    item's slot its error, under ``continue``), or fails naming the failed items (run_all),
    or fails because those outputs together are larger than a node's output may be (their
    size measured before any is read: a worker never holds more of them than that)."""
    run = with_input(store, run)  # its successors' and the execution's templates may read it
    execution_id, node_id = run.execution.id, run.node.id
    run_all = spec(run.node).on_item_failure is ItemFailure.RUN_ALL
    if not (failed and run_all) and (size := store.items_size(execution_id, node_id)) > (
        run.output_bytes
    ):
        return _fail(store, run, now, _too_large(size, run.output_bytes))
    rows = store.item_outputs(execution_id, node_id)
    if failed and run_all:
        return _fail(store, run, now, _failures(rows))
    output = [{"error": r.error} if r.failed else r.output for r in rows]
    store.set_node(
        execution_id, node_id, NodeStatus.COMPLETED, output=output, finished_at=now, error=None
    )
    return settle(store, run, now, output)


def _fail(store: Store, run: NodeRun, now: datetime, error: str) -> AfterCommit:
    """The map node failed once its items settled (the execution fails, or goes on without
    it when it continues on failure)."""
    execution_id, node_id = run.execution.id, run.node.id
    store.set_node(execution_id, node_id, NodeStatus.FAILED, finished_at=now, error=error)
    return node_failed(store, run, now, f"node {node_id!r} failed: {error}")


def _too_large(size: int, limit: int) -> str:
    return bounds.too_large(
        "its output (the list of its items' outputs)",
        size,
        limit,
        "CONVEYOR_MAX_OUTPUT_BYTES",
        fix="make its items return less (keep large data elsewhere and return a reference to it)",
    )


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
