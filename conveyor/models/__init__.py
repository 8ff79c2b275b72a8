"""SQLAlchemy 2 typed models. Only the store layer (:mod:`conveyor.store`) queries them."""

from conveyor.models.base import Base
from conveyor.models.tables import (
    ApiKey,
    Execution,
    Job,
    JobAttempt,
    NodeState,
    Schedule,
    Subscription,
    Tenant,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowVersion,
)

__all__ = [
    "ApiKey",
    "Base",
    "Execution",
    "Job",
    "JobAttempt",
    "NodeState",
    "Schedule",
    "Subscription",
    "Tenant",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WorkflowVersion",
]
