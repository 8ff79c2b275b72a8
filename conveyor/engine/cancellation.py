"""An execution cancelled at a client's request."""

from __future__ import annotations

import uuid
from datetime import datetime

from conveyor.engine.ports import Store
from conveyor.engine.states import (
    ExecutionStatus,
)
from conveyor.exceptions import (
    InvalidTransition,
)


def cancel_execution(store: Store, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
    """Cancel pending nodes now; running nodes see the status and are asked to stop. Returns
    the node jobs cancelled before they ran (the limiter forgets them)."""
    status = store.execution(execution_id).status
    if status.finished:
        raise InvalidTransition(
            f"execution {execution_id} is already {status.value}; only pending or running "
            f"executions can be cancelled"
        )
    cancelled, finished = stop_execution(store, execution_id, now, "cancelled by request")
    if not finished:  # it finished meanwhile; raising rolls back the cancellations
        raise InvalidTransition(f"execution {execution_id} finished before it could be cancelled")
    return cancelled


def stop_execution(
    store: Store, execution_id: uuid.UUID, now: datetime, reason: str
) -> tuple[list[uuid.UUID], bool]:
    """Cancel the execution's nodes not started and the execution, with ``reason`` as its
    error. The node jobs cancelled before they ran, and whether the execution was still
    running to be cancelled (False: it finished meanwhile, and stays as it finished)."""
    cancelled = store.cancel_unstarted(execution_id, now)
    finished = store.finish_execution(execution_id, ExecutionStatus.CANCELLED, now, error=reason)
    return cancelled, finished
