"""SQLAlchemy 2 typed models. Only the store layer (:mod:`conveyor.store`) queries them."""

from conveyor.models.base import Base
from conveyor.models.tables import (
    AlertState,
    ApiKey,
    Execution,
    Job,
    JobAttempt,
    NodeState,
    PrunedTally,
    RecoveryCount,
    Schedule,
    StreamEvent,
    StreamListener,
    Subscription,
    Tenant,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSignature,
    WorkflowVersion,
)

__all__ = [
    "AlertState",
    "ApiKey",
    "Base",
    "Execution",
    "Job",
    "JobAttempt",
    "NodeState",
    "PrunedTally",
    "RecoveryCount",
    "Schedule",
    "StreamEvent",
    "StreamListener",
    "Subscription",
    "Tenant",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookSignature",
    "WorkflowVersion",
]
