"""The dashboard's approvals: the pending ones (``/ui/approvals``) and a decision on one, made
from its execution's page.

A decision goes through the service call ``/v1/approvals`` makes, recorded with the session's
key as the API records its key (:func:`conveyor.api.approvals.decider`), under the approval's
own tenant: a tenant's session decides its own approvals only (another tenant's id is a 404,
as an unknown one), an operator's any tenant's.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from conveyor.api.approvals import decider
from conveyor.api.deps import ServiceDep
from conveyor.engine.records import TenantRef
from conveyor.exceptions import ApprovalNotFound, NotFound
from conveyor.service import Conveyor
from conveyor.ui.pages import FormDep, Pages, Who, WhoDep, back, checked, render

router = APIRouter(prefix="/ui", route_class=Pages, include_in_schema=False)
VERBS = {"approve": (True, "Approved"), "reject": (False, "Rejected")}


@router.get("/approvals")
def pending(request: Request, service: ServiceDep, who: WhoDep) -> HTMLResponse:
    """The approvals waiting for a decision, oldest first: the session's tenant's, or every
    tenant's with their tenant for an operator's."""
    rows = service.approvals_in(who.scope)
    names = {}
    if who.operator:
        with service.db.transaction() as store:
            names = {t.id: t.name for t in store.tenants()}
    return render(request, "approvals.html", who=who, rows=rows, tenants=names)


@router.post("/approvals/{approval_id}/{verb}")
def decide(
    request: Request, approval_id: uuid.UUID, verb: str, service: ServiceDep, who: WhoDep,
    form: FormDep,
) -> Response:  # fmt: skip
    checked(request, who, form)
    if verb not in VERBS:
        raise NotFound(f"An approval can be approved or rejected, not {verb!r}.")
    approved, done = VERBS[verb]
    owner = _owner(service, who, approval_id)
    comment = (form.get("comment") or [""])[0].strip() or None
    decided = service.decide(
        approval_id, approved=approved, by=decider(who.tenant), comment=comment,
        tenant=owner.name,
    )  # fmt: skip
    return back(f"/ui/executions/{decided.execution_id}", f"{done} {decided.node_id}.")


def _owner(service: Conveyor, who: Who, approval_id: uuid.UUID) -> TenantRef:
    """The tenant of an approval this session may decide (its own; any, for an operator's).
    Another tenant's is refused exactly as an unknown id, naming nothing of it."""
    with service.db.transaction() as store:
        job = store.job(approval_id)
        owner = store.execution_tenant(job.execution_id) if job is not None else None
    if owner is None or (not who.operator and owner.id != who.tenant.id):
        raise ApprovalNotFound(
            f"No approval {approval_id} waits for a decision in this tenant; the pending ones "
            f"are listed on /ui/approvals."
        )
    return owner
