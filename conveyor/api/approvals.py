"""``/v1/approvals``: the tenant's approvals that wait for a decision, and the decisions.

A decision is recorded with the name of the API key that made it; an approval of another
tenant answers 404, exactly as one that does not exist.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from conveyor.api.deps import ServiceDep, TenantDep
from conveyor.api.rest import router as rest_router
from conveyor.engine.approvals import MAX_COMMENT
from conveyor.engine.records import TenantRef
from conveyor.service import Conveyor

router = APIRouter(prefix="/v1/approvals", tags=["approvals"], responses=rest_router.responses)


class PendingApproval(BaseModel):
    id: uuid.UUID = Field(description="The approval's id: approve or reject it by this.")
    execution_id: uuid.UUID
    workflow: str
    node_id: str
    message: str | None = Field(description="What the approver is asked (config.message).")
    since: datetime
    timeout_at: datetime | None = Field(description="When it stops waiting; null: never.")


class DecisionBody(BaseModel):
    comment: str | None = Field(default=None, max_length=MAX_COMMENT)


class DecisionMade(BaseModel):
    """The decision, as the approval node's output."""

    execution_id: uuid.UUID
    node_id: str
    decision: str = Field(description="approved or rejected")
    by: str = Field(description="The name of the API key that decided.")
    at: datetime
    comment: str | None


@router.get("")
def list_approvals(service: ServiceDep, tenant: TenantDep) -> list[PendingApproval]:
    """The tenant's approvals that wait for a decision, oldest first."""
    return [PendingApproval(**vars(p)) for p in service.approvals(tenant.name)]


@router.post("/{approval_id}/approve")
def approve(
    approval_id: uuid.UUID, service: ServiceDep, tenant: TenantDep, body: DecisionBody | None = None
) -> DecisionMade:
    """Approve: the approval node completes with the decision as its output and its
    `on_approve` branch runs. 409 when it was decided already."""
    return _decide(service, tenant, approval_id, True, body)


@router.post("/{approval_id}/reject")
def reject(
    approval_id: uuid.UUID, service: ServiceDep, tenant: TenantDep, body: DecisionBody | None = None
) -> DecisionMade:
    """Reject: the node's `on_reject` branch runs (the node fails when it names none). 409
    when it was decided already."""
    return _decide(service, tenant, approval_id, False, body)


def _decide(
    service: Conveyor,
    tenant: TenantRef,
    approval_id: uuid.UUID,
    approved: bool,
    body: DecisionBody | None,
) -> DecisionMade:
    decided = service.decide(
        approval_id, approved=approved, by=decider(tenant), comment=body.comment if body else None,
        tenant=tenant.name,
    )  # fmt: skip
    made = {"execution_id": decided.execution_id, "node_id": decided.node_id, **decided.output}
    return DecisionMade.model_validate(made)


def decider(signed_in: TenantRef) -> str:
    """Who a decision records as its maker: the name of the API key that made it (the
    dashboard records its session's key the same way, an operator's included)."""
    return f"key:{signed_in.key}" if signed_in.key else f"tenant:{signed_in.name}"
