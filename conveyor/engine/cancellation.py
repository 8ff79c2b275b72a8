"""An execution cancelled at a client's request, and the stop of an execution's work (a
cancel, a node's cancel of its execution, a failure): its nodes not started cancelled, and its
children and theirs, breadth first, a bounded share of them a transaction (the rest in
transactions of their own: :func:`stop_orphans`)."""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from conveyor.engine import parents
from conveyor.engine.ports import Store
from conveyor.engine.records import Dispatch
from conveyor.engine.states import (
    ExecutionStatus,
)
from conveyor.exceptions import (
    InvalidTransition,
)

# Child executions one transaction stops, at most: each costs a few statements (its jobs and
# node states one UPDATE each), so a stop of a tree of thousands holds its locks for a share
# of it; the rest are stopped by :func:`stop_orphans`, a transaction a share.
STOPS_A_TRANSACTION = 100


@dataclass(frozen=True, kw_only=True)
class Stopped:
    """What a stop did: the node jobs it cancelled before they ran, its children's too, and
    its parent's when the parent's node failing at this child's cancel stopped the parent
    (the limiter forgets them); whether the execution was still running to be cancelled (False:
    it finished meanwhile, and stays as it finished); for a child, the messages of what its
    parent's node settling made ready, to publish after commit; and whether children were
    left running past the transaction's share (``more``: :func:`stop_orphans` stops them),
    and how many children it stopped."""

    forget: list[uuid.UUID]
    finished: bool
    dispatches: list[Dispatch]
    more: bool = False
    children: int = 0


def cancel_execution(
    store: Store, execution_id: uuid.UUID, now: datetime, most: int | None = None
) -> Stopped:
    """Cancel pending nodes now, and the execution's children (``most`` of them in this
    transaction, STOPS_A_TRANSACTION by default); running nodes see the status and are
    asked to stop."""
    status = store.execution(execution_id).status
    if status.finished:
        raise InvalidTransition(
            f"execution {execution_id} is already {status.value}; only pending or running "
            f"executions can be cancelled"
        )
    stopped = stop_execution(store, execution_id, now, "cancelled by request", most)
    if not stopped.finished:  # it finished meanwhile; raising rolls back the cancellations
        raise InvalidTransition(f"execution {execution_id} finished before it could be cancelled")
    return stopped


def stop_execution(
    store: Store, execution_id: uuid.UUID, now: datetime, reason: str, most: int | None = None
) -> Stopped:
    """Cancel the execution's nodes not started, the execution (``reason`` its error) and
    its children still running (:func:`stop_children`, ``most`` of them); a child's parent
    node settles."""
    stopped = _stop(store, execution_id, now, reason)
    if not stopped.finished:
        return stopped
    tree = stop_children(store, execution_id, now, reason, most)
    return Stopped(
        forget=stopped.forget + tree.forget, finished=True, dispatches=stopped.dispatches,
        more=tree.more, children=tree.children,
    )  # fmt: skip


def stop_children(
    store: Store,
    execution_id: uuid.UUID,
    now: datetime,
    reason: str,
    most: int | None = None,
    node_id: str | None = None,
) -> Stopped:
    """In the transaction that finishes an execution otherwise than by completing it (or,
    with ``node_id``, that failed a map of children fast): its children (that node's) still
    pending or running cancelled, and theirs, breadth first, at most ``most``
    (STOPS_A_TRANSACTION by default). The jobs waiting for them were cancelled first
    (:meth:`~conveyor.engine.ports.Executions.cancel_unstarted`,
    :meth:`~conveyor.engine.ports.MapItems.close_map`), so their finish settles nothing, and
    those left running are orphans :func:`stop_orphans` finds. The node jobs they cancelled
    before these ran, whether some were left, and how many stopped."""
    limit = STOPS_A_TRANSACTION if most is None else most
    return _stop_below(store, deque([(execution_id, reason)]), now, max(0, limit), node_id)


def stop_orphans(store: Store, now: datetime, most: int | None = None) -> Stopped:
    """Children still pending or running that their parent's node no longer waits for (a
    stop left them past its transaction's share, or its process ended first) cancelled,
    with their own children, at most ``most`` executions (STOPS_A_TRANSACTION by default).
    ``more``: some may be left, for the next call."""
    limit = STOPS_A_TRANSACTION if most is None else most
    found = store.orphaned_children(limit)
    below: deque[tuple[uuid.UUID, str]] = deque()
    forget: list[uuid.UUID] = []
    dispatches: list[Dispatch] = []
    for child_id, parent_id in found:
        parent = store.execution_outcome(parent_id)
        why = f"its parent execution {parent_id} no longer waits for it"
        if parent is not None and parent.status.finished:
            why = f"its parent execution {parent_id} {parent.status.value}: {parent.error}"
        stopped = _stop(store, child_id, now, why)
        forget += stopped.forget
        dispatches += stopped.dispatches
        if stopped.finished:
            below.append((child_id, why))
    tree = _stop_below(store, below, now, max(0, limit - len(found)))
    return Stopped(
        forget=forget + tree.forget, finished=True, dispatches=dispatches,
        more=tree.more or len(found) == limit, children=len(found) + tree.children,
    )  # fmt: skip


def _stop(store: Store, execution_id: uuid.UUID, now: datetime, reason: str) -> Stopped:
    """One execution stopped, not its children: its nodes not started cancelled, its status
    cancelled, and (a child) its parent's node settled."""
    cancelled = store.cancel_unstarted(execution_id, now)
    finished = store.finish_execution(execution_id, ExecutionStatus.CANCELLED, now, error=reason)
    if not finished:
        return Stopped(forget=cancelled, finished=False, dispatches=[])
    settled = parents.child_finished(store, store.execution(execution_id), now)
    return Stopped(forget=cancelled + settled.forget, finished=True, dispatches=settled.dispatches)


def _stop_below(
    store: Store,
    stopped: deque[tuple[uuid.UUID, str]],
    now: datetime,
    most: int,
    node_id: str | None = None,
) -> Stopped:
    """The children of the executions in ``stopped`` (each with why it stopped; of the
    first, only those its node ``node_id`` started, when given) still pending or running
    cancelled, and theirs, breadth first, at most ``most``: the node jobs they cancelled,
    whether some were left, and how many."""
    forget: list[uuid.UUID] = []
    count = 0
    while stopped:
        parent_id, reason = stopped.popleft()
        children, node_id = store.active_children(parent_id, node_id), None
        for child_id in children:
            if count == most:
                return Stopped(forget=forget, finished=True, dispatches=[], more=True,
                               children=count)  # fmt: skip
            why = f"its parent execution {parent_id} stopped: {reason}"
            child = _stop(store, child_id, now, why)
            count += 1
            forget += child.forget
            if child.finished:
                stopped.append((child_id, why))
    return Stopped(forget=forget, finished=True, dispatches=[], children=count)
