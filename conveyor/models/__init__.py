"""SQLAlchemy 2 typed models. Only the store layer (:mod:`conveyor.store`) queries them."""

from conveyor.models.base import Base
from conveyor.models.tables import (
    Execution,
    Job,
    JobAttempt,
    NodeState,
    Schedule,
    Tenant,
    WorkflowVersion,
)

__all__ = [
    "Base",
    "Execution",
    "Job",
    "JobAttempt",
    "NodeState",
    "Schedule",
    "Tenant",
    "WorkflowVersion",
]
