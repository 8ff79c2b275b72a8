"""Conveyor: durable DAG workflows on Celery, with PostgreSQL as the source of truth.

The public names are imported on first use, not with the package: a process imports only
what it uses (``conveyor --version`` loads neither SQLAlchemy nor the engine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.engine.definitions import Defaults, Node, RetryPolicy, Workflow
    from conveyor.engine.node_types import NodeContext
    from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, Priority
    from conveyor.enqueuing import enqueue, send_event
    from conveyor.exceptions import (
        CancelExecution,
        ConveyorError,
        DefinitionError,
        NodeError,
        NonRetryableError,
        Skip,
        Snooze,
    )
    from conveyor.nodes import node

# Each public name, and the module it lives in.
_HOMES = {
    "CancelExecution": "conveyor.exceptions",
    "ConveyorError": "conveyor.exceptions",
    "Defaults": "conveyor.engine.definitions",
    "DefinitionError": "conveyor.exceptions",
    "ExecutionStatus": "conveyor.engine.states",
    "JobStatus": "conveyor.engine.states",
    "Node": "conveyor.engine.definitions",
    "NodeContext": "conveyor.engine.node_types",
    "NodeError": "conveyor.exceptions",
    "NodeStatus": "conveyor.engine.states",
    "NonRetryableError": "conveyor.exceptions",
    "Priority": "conveyor.engine.states",
    "RetryPolicy": "conveyor.engine.definitions",
    "Skip": "conveyor.exceptions",
    "Snooze": "conveyor.exceptions",
    "Workflow": "conveyor.engine.definitions",
    "enqueue": "conveyor.enqueuing",
    "node": "conveyor.nodes",
    "send_event": "conveyor.enqueuing",
}
__all__ = [
    "CancelExecution",
    "ConveyorError",
    "Defaults",
    "DefinitionError",
    "ExecutionStatus",
    "JobStatus",
    "Node",
    "NodeContext",
    "NodeError",
    "NodeStatus",
    "NonRetryableError",
    "Priority",
    "RetryPolicy",
    "Skip",
    "Snooze",
    "Workflow",
    "enqueue",
    "node",
    "send_event",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found at once from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
