"""An execution cancelled at a client's request, and the stop of an execution's work (a
cancel, a node's cancel of its execution, a failure): its nodes not started cancelled, and its
children, recursively."""

from __future__ import annotations

import uuid
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


@dataclass(frozen=True, kw_only=True)
class Stopped:
    """What a stop did: the node jobs it cancelled before they ran, its children's too, and
    its parent's when the parent's node failing at this child's cancel stopped the parent
    (the limiter forgets them); whether the execution was still running to be cancelled
    (False: it finished meanwhile, and stays as it finished); and, for a child, the messages
    of what its parent's node settling made ready, to publish after commit."""

    forget: list[uuid.UUID]
    finished: bool
    dispatches: list[Dispatch]


def cancel_execution(store: Store, execution_id: uuid.UUID, now: datetime) -> Stopped:
    """Cancel pending nodes now, and the execution's children; running nodes see the status
    and are asked to stop."""
    status = store.execution(execution_id).status
    if status.finished:
        raise InvalidTransition(
            f"execution {execution_id} is already {status.value}; only pending or running "
            f"executions can be cancelled"
        )
    stopped = stop_execution(store, execution_id, now, "cancelled by request")
    if not stopped.finished:  # it finished meanwhile; raising rolls back the cancellations
        raise InvalidTransition(f"execution {execution_id} finished before it could be cancelled")
    return stopped


def stop_execution(store: Store, execution_id: uuid.UUID, now: datetime, reason: str) -> Stopped:
    """Cancel the execution's nodes not started, the execution (``reason`` its error) and
    its children still running (:func:`stop_children`); a child's parent node settles."""
    cancelled = store.cancel_unstarted(execution_id, now)
    finished = store.finish_execution(execution_id, ExecutionStatus.CANCELLED, now, error=reason)
    if not finished:
        return Stopped(forget=cancelled, finished=False, dispatches=[])
    cancelled += stop_children(store, execution_id, now, reason)
    settled = parents.child_finished(store, store.execution(execution_id), now)
    return Stopped(forget=cancelled + settled.forget, finished=True, dispatches=settled.dispatches)


def stop_children(
    store: Store, execution_id: uuid.UUID, now: datetime, reason: str, node_id: str | None = None
) -> list[uuid.UUID]:
    """In the transaction that finishes an execution otherwise than by completing it (or,
    with ``node_id``, that failed a map of children fast): its children (that node's) still
    pending or running cancelled, and theirs. The jobs waiting for them were cancelled first
    (:meth:`~conveyor.engine.ports.Executions.cancel_unstarted`,
    :meth:`~conveyor.engine.ports.MapItems.close_map`), so their finish settles nothing. The
    node jobs they cancelled before these ran."""
    forget: list[uuid.UUID] = []
    for child_id in store.active_children(execution_id, node_id):
        why = f"its parent execution {execution_id} stopped: {reason}"
        forget += stop_execution(store, child_id, now, why).forget
    return forget
