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


def cancel_execution(
    store: Store, execution_id: uuid.UUID, now: datetime, *, reason: str = "cancelled by request"
) -> list[uuid.UUID]:
    """Cancel pending nodes now; running nodes see the status and are asked to stop;
    ``reason`` is the execution's error. Returns the node jobs cancelled before they ran (the
    limiter forgets them)."""
    status = store.execution(execution_id).status
    if status.finished:
        raise InvalidTransition(
            f"execution {execution_id} is already {status.value}; only pending or running "
            f"executions can be cancelled"
        )
    cancelled = store.cancel_unstarted(execution_id, now)
    if not store.finish_execution(
        execution_id, ExecutionStatus.CANCELLED, now, error=reason
    ):  # it finished meanwhile; raising rolls back the cancellations above
        raise InvalidTransition(f"execution {execution_id} finished before it could be cancelled")
    return cancelled
