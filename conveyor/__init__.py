"""Conveyor: durable DAG workflows on Celery, with PostgreSQL as the source of truth.

The public names are imported on first use, not with the package: a process imports only
what it uses (``conveyor --version`` loads neither SQLAlchemy nor the engine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.celery_nodes import celery_task
    from conveyor.client import AsyncClient, Client
    from conveyor.engine.definitions import (
        Defaults,
        ItemFailure,
        Node,
        RetryPolicy,
        ScheduleSpec,
        Workflow,
    )
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
    from conveyor.flows import Flow, Map, item_of
    from conveyor.nodes import node

# Each public name, and the module it lives in.
_HOMES = {
    "AsyncClient": "conveyor.client",
    "Client": "conveyor.client",
    "Flow": "conveyor.flows",
    "ItemFailure": "conveyor.engine.definitions",
    "ScheduleSpec": "conveyor.engine.definitions",
    "Map": "conveyor.flows",
    "celery_task": "conveyor.celery_nodes",
    "item_of": "conveyor.flows",
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
    "AsyncClient",
    "CancelExecution",
    "Client",
    "ConveyorError",
    "Defaults",
    "DefinitionError",
    "ExecutionStatus",
    "Flow",
    "ItemFailure",
    "JobStatus",
    "Map",
    "Node",
    "NodeContext",
    "NodeError",
    "NodeStatus",
    "NonRetryableError",
    "Priority",
    "RetryPolicy",
    "ScheduleSpec",
    "Skip",
    "Snooze",
    "Workflow",
    "celery_task",
    "enqueue",
    "item_of",
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
