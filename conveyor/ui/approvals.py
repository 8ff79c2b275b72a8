"""The dashboard's approvals: the pending ones (``/ui/approvals``, an operator's filtered by
``?tenant=NAME``) and a decision on one, made from that list or from its execution's page.

A decision goes through the service call ``/v1/approvals`` makes, recorded with the session's
key as the API records its key (:func:`conveyor.api.approvals.decider`), under the approval's
own tenant: a tenant's session decides its own approvals only (another tenant's id is a 404,
as an unknown one), an operator's any tenant's.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from conveyor.api.approvals import decider
from conveyor.api.deps import ServiceDep
from conveyor.engine.records import TenantRef
from conveyor.exceptions import ApprovalNotFound, NotFound
from conveyor.service import Conveyor
from conveyor.ui.pages import FormDep, Pages, Who, WhoDep, back, checked, filtered, render

router = APIRouter(prefix="/ui", route_class=Pages, include_in_schema=False)
VERBS = {"approve": (True, "Approved"), "reject": (False, "Rejected")}


@router.get("/approvals")
def pending(request: Request, service: ServiceDep, who: WhoDep, tenant: str = "") -> HTMLResponse:
    """The approvals waiting for a decision, oldest first, each with its Approve and Reject
    buttons: the session's tenant's, or for an operator's every tenant's (or the one its
    filter names) with their tenant."""
    names = {}
    if who.operator:
        with service.db.transaction() as store:
            names = {t.id: t.name for t in store.tenants()}
    rows = service.approvals_in(filtered(who, names, tenant))
    return render(
        request, "approvals.html", who=who, rows=rows, tenants=names, tenant=tenant,
        note=request.query_params.get("note"),
    )  # fmt: skip


@router.post("/approvals/{approval_id}/{verb}")
def decide(
    request: Request, approval_id: uuid.UUID, verb: str, service: ServiceDep, who: WhoDep,
    form: FormDep,
) -> Response:  # fmt: skip
    """A decision from the list (its form says ``from=list``: back to the list, its filter
    kept) or from the execution's page (back there)."""
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
    if (form.get("from") or [""])[0] == "list":
        shown = (form.get("tenant") or [""])[0] if who.operator else ""
        listed = "/ui/approvals" + (f"?{urlencode({'tenant': shown})}" if shown else "")
        return back(listed, f"{done} {decided.node_id} of execution {decided.execution_id}.")
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
