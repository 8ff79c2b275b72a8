"""``/v1``: workflows, executions, application events and dead letters of the key's tenant.

Every route reads and writes only its tenant's rows: an id of another tenant's answers 404,
exactly as an id that does not exist.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Response, status
from fastapi.responses import StreamingResponse

from conveyor import views
from conveyor.api import stream
from conveyor.api.deps import ServiceDep, TenantDep
from conveyor.api.schemas import (
    Applied,
    Cancelled,
    EventBody,
    EventStarted,
    Problem,
    Started,
    TriggerBody,
)
from conveyor.engine.records import TenantRef
from conveyor.engine.states import ExecutionStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import ExecutionNotFound, WorkflowNotFound
from conveyor.runtime import known_functions
from conveyor.service import Conveyor

router = APIRouter(
    prefix="/v1",
    responses={
        401: {"model": Problem, "description": "No key, or an unknown or revoked one"},
        404: {"model": Problem, "description": "Not found (or another tenant's)"},
        409: {"model": Problem, "description": "Conflicts with the current state"},
        422: {"model": Problem, "description": "Invalid input; `errors` lists every problem"},
        503: {"model": Problem, "description": "The database is unreachable; try again"},
    },
)
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Retrying a trigger with the same key returns the execution it made.",
    ),
]


def _owned(service: Conveyor, tenant: TenantRef, execution_id: uuid.UUID) -> None:
    with service.db.transaction() as store:
        if not store.owns_execution(tenant.id, execution_id):
            raise ExecutionNotFound(f"no execution has id {execution_id}")


# -- workflows ---------------------------------------------------------------------------------


@router.get("/workflows", tags=["workflows"])
def list_workflows(service: ServiceDep, tenant: TenantDep) -> list[views.WorkflowJson]:
    """The latest version of each of the tenant's workflows."""
    with service.db.transaction() as store:
        return [views.workflow_json(r) for r in store.list_workflows(tenant.id)]


@router.post(
    "/workflows",
    status_code=status.HTTP_201_CREATED,
    tags=["workflows"],
    responses={200: {"model": Applied, "description": "Unchanged: no new version"}},
)
def apply_workflow(
    service: ServiceDep,
    tenant: TenantDep,
    response: Response,
    definition: Annotated[dict[str, Any], Body(description="A workflow definition.")],
) -> Applied:
    """Validate a definition and store it as a new version if it changed (200 if not)."""
    workflow = parse_workflow(definition, known_functions=known_functions())
    record, stored = service.apply(workflow, tenant.name)
    if not stored:
        response.status_code = status.HTTP_200_OK
    return Applied(name=record.name, version=record.version, stored=stored)


@router.get("/workflows/{name}", tags=["workflows"])
def show_workflow(name: str, service: ServiceDep, tenant: TenantDep) -> dict[str, Any]:
    """The latest version of a workflow, with its definition."""
    with service.db.transaction() as store:
        record = store.latest_workflow(tenant.id, name)
    if record is None:
        raise WorkflowNotFound(f"no workflow is named {name!r}")
    return {**views.workflow_json(record), "definition": record.definition}


@router.post(
    "/workflows/{name}/executions",
    status_code=status.HTTP_201_CREATED,
    tags=["executions"],
    responses={200: {"model": Started, "description": "Replayed: the key's execution"}},
)
def trigger(
    name: str,
    service: ServiceDep,
    tenant: TenantDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    body: TriggerBody | None = None,
) -> Started:
    """Start an execution (201); a retry with the same Idempotency-Key returns it (200)."""
    body = body or TriggerBody()
    execution_id, replayed = service.start(
        name,
        body.input,
        tenant=tenant.name,
        priority=body.priority,
        source=TriggerSource.API,
        idempotency_key=idempotency_key,
        dedupe_key=body.dedupe_key,
    )
    if replayed:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/executions/{execution_id}"
    return Started(id=execution_id, replayed=replayed)


# -- executions --------------------------------------------------------------------------------


@router.get("/executions", tags=["executions"])
def list_executions(
    service: ServiceDep,
    tenant: TenantDep,
    status_: Annotated[ExecutionStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[views.ExecutionSummaryJson]:
    """The tenant's most recent executions, newest first."""
    with service.db.transaction() as store:
        rows = store.list_executions(tenant.id, status=status_, limit=limit)
        return [views.execution_summary(e, name, version) for e, name, version in rows]


@router.get("/executions/{execution_id}", tags=["executions"])
def show_execution(
    execution_id: uuid.UUID, service: ServiceDep, tenant: TenantDep
) -> views.ExecutionJson:
    """One execution: its nodes with outputs and errors, its jobs with every attempt."""
    _owned(service, tenant, execution_id)
    with service.db.transaction() as store:
        return views.execution_view(store, execution_id)


@router.post("/executions/{execution_id}/cancel", tags=["executions"])
def cancel_execution(execution_id: uuid.UUID, service: ServiceDep, tenant: TenantDep) -> Cancelled:
    """Cancel a pending or running execution (409 if it has finished)."""
    _owned(service, tenant, execution_id)
    service.cancel(execution_id)
    return Cancelled(id=execution_id, status=ExecutionStatus.CANCELLED.value)


@router.get(
    "/executions/{execution_id}/events",
    tags=["executions"],
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
def execution_events(
    execution_id: uuid.UUID, service: ServiceDep, tenant: TenantDep
) -> StreamingResponse:
    """Server-sent events: the execution's status now, then each change of it and of its
    nodes as it happens (PostgreSQL LISTEN/NOTIFY), until it finishes."""
    _owned(service, tenant, execution_id)
    return StreamingResponse(
        stream.execution_events(service, execution_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


# -- application events -------------------------------------------------------------------------


@router.post("/events", status_code=status.HTTP_202_ACCEPTED, tags=["events"])
def emit_event(body: EventBody, service: ServiceDep, tenant: TenantDep) -> EventStarted:
    """Start every workflow of the tenant that subscribes to the event's type (`events:` in
    its definition); each gets ``{"event": type, "payload": payload}`` as input."""
    return EventStarted(executions=service.emit(tenant.name, body.type, body.payload))
