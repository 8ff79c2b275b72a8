"""Conveyor: durable DAG workflows on Celery, with PostgreSQL as the source of truth."""

from conveyor.engine.definitions import Defaults, Node, RetryPolicy, Workflow
from conveyor.engine.node_types import NodeContext
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, Priority
from conveyor.enqueue import enqueue
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
]
