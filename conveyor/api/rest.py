"""``/v1``: workflows, executions, application events and dead letters of the key's tenant.

Every route reads and writes only its tenant's rows: an id of another tenant's answers 404,
exactly as an id that does not exist.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from conveyor import views
from conveyor.api import stream, tenant_stream
from conveyor.api.bodies import OTHER_BODY_BYTES
from conveyor.api.deps import ServiceDep, TenantDep
from conveyor.api.schemas import (
    Applied,
    Cancelled,
    EventBody,
    EventStarted,
    Problem,
    Rerun,
    RerunBody,
    Started,
    TriggerBody,
)
from conveyor.config import get_settings
from conveyor.engine.records import TenantRef
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import (
    ExecutionNotFound,
    StreamsUnavailable,
    TenantNotFound,
    TooManyStreams,
    WorkflowNotFound,
)
from conveyor.service import Conveyor
from conveyor.store.listing import ExecutionFilter
from conveyor.wiring import http_allow, known_functions

router = APIRouter(
    prefix="/v1",
    responses={
        401: {"model": Problem, "description": "No key, or an unknown or revoked one"},
        404: {"model": Problem, "description": "Not found (or another tenant's)"},
        409: {"model": Problem, "description": "Conflicts with the current state"},
        413: {
            "model": Problem,
            "description": "The body is over its limit (CONVEYOR_MAX_DEFINITION_BYTES, "
            f"CONVEYOR_MAX_INPUT_BYTES, CONVEYOR_MAX_EVENT_BYTES; {OTHER_BODY_BYTES} bytes for "
            "other bodies); `detail` names it",
        },
        422: {
            "model": Problem,
            "description": "Invalid input, or nested past CONVEYOR_MAX_JSON_DEPTH, or past a "
            "definition's limits; `errors` lists every problem",
        },
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


ReadTenant = Annotated[
    str | None,
    Query(
        alias="tenant",
        max_length=100,
        description="An operator's key (`conveyor keys create --operator`): the name of the "
        "tenant whose executions to read; any other key reads its own only",
    ),
]


def _read_as(service: Conveyor, tenant: TenantRef, name: str | None) -> TenantRef:
    """The tenant whose executions a read shows: the key's own, or for an operator's key the
    one ``?tenant=`` names. Another key naming another tenant is told so (404, as another
    tenant's id is)."""
    if name is None or name == tenant.name:
        return tenant
    if not tenant.operator:
        raise TenantNotFound(
            f"this key reads tenant {tenant.name!r}'s executions only: reading tenant "
            f"{name!r}'s needs an operator's key (`conveyor keys create --operator`)"
        )
    with service.db.transaction() as store:
        found = store.tenant_named(name)
    if found is None:
        raise TenantNotFound(f"no tenant is named {name!r}; `conveyor tenants list` names them")
    return TenantRef(id=found, name=name, key=tenant.key)


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
    # The python nodes' inputs are checked against their functions by the service's apply,
    # whoever applies
    workflow = parse_workflow(
        definition,
        known_functions=known_functions(),
        http_allow=http_allow(),
        bounds=get_settings().bounds,
    )
    record, stored = service.apply(workflow, tenant.name)
    if not stored:
        response.status_code = status.HTTP_200_OK
    return Applied(name=record.name, version=record.version, stored=stored)


@router.get("/workflows/{name}", tags=["workflows"], response_model=dict[str, Any])
def show_workflow(name: str, service: ServiceDep, tenant: TenantDep) -> Response:
    """The latest version of a workflow, with its definition."""
    with service.db.transaction() as store:
        record = store.latest_workflow(tenant.id, name)
    if record is None:
        raise WorkflowNotFound(f"no workflow is named {name!r}")
    return _stored({**views.workflow_json(record), "definition": record.definition})


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
    made = service.submit(
        name,
        body.input,
        tenant=tenant.name,
        priority=body.priority,
        source=TriggerSource.API,
        idempotency_key=idempotency_key,
        dedupe_key=body.dedupe_key,
        run_at=body.run_at,
        delay=body.delay,
        max_attempts=body.max_attempts,
        timeout=body.timeout,
    )
    if made.replayed:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/executions/{made.execution_id}"
    return Started(id=made.execution_id, replayed=made.replayed, dedupe=made.dedupe)


# -- executions --------------------------------------------------------------------------------


class Filters:
    """The query parameters that narrow a listing and the status view (all optional)."""

    def __init__(
        self,
        status_: Annotated[ExecutionStatus | None, Query(alias="status")] = None,
        workflow: Annotated[str | None, Query(description="A workflow's name")] = None,
        node_status: Annotated[
            NodeStatus | None, Query(description="Having a node in this status")
        ] = None,
        created_after: Annotated[datetime | None, Query(description="ISO 8601")] = None,
        created_before: Annotated[datetime | None, Query(description="ISO 8601")] = None,
        dedupe_key: Annotated[str | None, Query(max_length=200)] = None,
        idempotency_key: Annotated[str | None, Query(max_length=200)] = None,
    ) -> None:
        self.value = ExecutionFilter(
            status=status_, workflow=workflow, node_status=node_status,
            created_after=_aware(created_after), created_before=_aware(created_before),
            dedupe_key=dedupe_key, idempotency_key=idempotency_key,
        )  # fmt: skip


def _aware(value: datetime | None) -> datetime | None:
    """A time without an offset is taken as UTC, as every time Conveyor shows is."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


FiltersDep = Annotated[Filters, Depends()]


@router.get("/executions", tags=["executions"])
def list_executions(
    service: ServiceDep,
    tenant: TenantDep,
    filters: FiltersDep,
    after: Annotated[
        uuid.UUID | None, Query(description="The last id of the previous page: the next page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    tenant_name: ReadTenant = None,
) -> list[views.ExecutionSummaryJson]:
    """The tenant's executions, newest first, narrowed by the filters given; page on with
    ``after`` set to the last id of a page. An operator's key lists another tenant's with
    ``tenant``."""
    scope = _read_as(service, tenant, tenant_name)
    with service.db.transaction() as store:
        rows = store.list_executions(scope.id, where=filters.value, after=after, limit=limit)
        return [views.execution_summary(e, name, version) for e, name, version in rows]


@router.get("/executions/summary", tags=["executions"])
def executions_summary(
    service: ServiceDep, tenant: TenantDep, filters: FiltersDep
) -> list[views.StatusCountJson]:
    """The status view: the tenant's executions counted by workflow and status, with the
    oldest and newest and the average tries per execution (the same filters as the list)."""
    with service.db.transaction() as store:
        return [views.status_count_json(c) for c in store.status_counts(tenant.id, filters.value)]


@router.get("/executions/{execution_id}", tags=["executions"], response_model=views.ExecutionJson)
def show_execution(
    execution_id: uuid.UUID, service: ServiceDep, tenant: TenantDep, tenant_name: ReadTenant = None
) -> Response:
    """One execution: its nodes with outputs and errors, its jobs with every attempt. An
    operator's key reads another tenant's with ``tenant`` naming it."""
    _owned(service, _read_as(service, tenant, tenant_name), execution_id)
    with service.db.transaction() as store:
        return _stored(views.execution_view(store, execution_id))


@router.get(
    "/executions/{execution_id}/nodes/{node_id}/items",
    tags=["executions"],
    response_model=list[views.ItemJson],
)
def list_items(
    execution_id: uuid.UUID,
    node_id: str,
    service: ServiceDep,
    tenant: TenantDep,
    after: Annotated[
        int | None, Query(description="The last index of the previous page: the next page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
) -> Response:
    """A page of a map node's items in index order (an execution's view sums them up):
    each with its status, item, output, last error and tries; page on with ``after`` set
    to the last index of a page."""
    _owned(service, tenant, execution_id)
    with service.db.transaction() as store:
        return _stored(
            views.items_json(store, execution_id, node_id, after=after, limit=limit, status=status_)
        )


@router.get("/executions/{execution_id}/children", tags=["executions"])
def list_children(
    execution_id: uuid.UUID,
    service: ServiceDep,
    tenant: TenantDep,
    after: Annotated[
        uuid.UUID | None, Query(description="The last id of the previous page: the next page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[views.ChildJson]:
    """The child executions the execution's workflow nodes started (every try's), newest
    first, each with the node and try that started it; page on with ``after`` set to the
    last id of a page."""
    _owned(service, tenant, execution_id)
    where = ExecutionFilter(parent=execution_id)
    with service.db.transaction() as store:
        rows = store.list_executions(tenant.id, where=where, after=after, limit=limit)
        return views.children_json(store, rows)


def _stored(view: Any) -> Response:
    """A view holding callers' values (inputs, outputs, definitions), sent as it is: the
    views are JSON already, and the response model's serializer stops at 255 levels, so a
    value stored deeper (before CONVEYOR_MAX_JSON_DEPTH bounded it) failed every read."""
    text = json.dumps(view, ensure_ascii=False, separators=(",", ":"))
    try:
        body = text.encode()
    except UnicodeEncodeError:  # a lone surrogate (SQLite keeps one): sent escaped
        body = json.dumps(view, separators=(",", ":")).encode()
    return Response(body, media_type="application/json")


@router.post("/executions/{execution_id}/cancel", tags=["executions"])
def cancel_execution(execution_id: uuid.UUID, service: ServiceDep, tenant: TenantDep) -> Cancelled:
    """Cancel a pending or running execution (409 if it has finished)."""
    _owned(service, tenant, execution_id)
    service.cancel(execution_id)
    return Cancelled(id=execution_id, status=ExecutionStatus.CANCELLED.value)


@router.post("/executions/{execution_id}/rerun", tags=["executions"])
def rerun_execution(
    execution_id: uuid.UUID, body: RerunBody, service: ServiceDep, tenant: TenantDep
) -> Rerun:
    """Run a finished (failed, cancelled or completed) execution again from a node: it and
    every node downstream of it run again (so do the nodes that did not end well), the
    others keep their outputs; `input` is given to that node in place of its rendered
    inputs. 409 while it is pending or running, or while another execution with its dedupe
    key is active; 422 for a node its workflow does not have (the answer lists them). The
    rerun is recorded with the API key's name (`reruns` in the execution's view)."""
    _owned(service, tenant, execution_id)
    done = service.rerun(
        execution_id, body.from_node, requested_by=tenant.key or f"tenant:{tenant.name}",
        input=body.input, tenant_id=tenant.id,
    )  # fmt: skip
    return Rerun(
        id=execution_id, status=ExecutionStatus.RUNNING.value, from_node=done.from_node,
        nodes=done.nodes, queued=done.queued,
    )  # fmt: skip


@router.get(
    "/executions/{execution_id}/events",
    tags=["executions"],
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}},
        429: {
            "model": Problem,
            "description": "Too many live streams open (CONVEYOR_STREAMS_PER_TENANT, "
            "CONVEYOR_STREAMS_PER_PROCESS); `Retry-After` says when to try again",
        },
    },
)
async def execution_events(
    execution_id: uuid.UUID, request: Request, service: ServiceDep, tenant: TenantDep
) -> Response:
    """Server-sent events: the execution's status now, then each change of it and of its
    nodes as it happens (PostgreSQL LISTEN/NOTIFY), until it finishes."""
    await run_in_threadpool(_owned, service, tenant, execution_id)
    streams: stream.Streams = request.app.state.streams
    try:
        return await streams.open(service, tenant, execution_id)
    except (TooManyStreams, StreamsUnavailable) as exc:
        return stream.refused(exc)


@router.get(
    "/stream",
    tags=["executions"],
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}},
        422: {"model": Problem, "description": "`Last-Event-ID` is none of this stream's ids"},
        429: {
            "model": Problem,
            "description": "Too many live streams open (CONVEYOR_STREAMS_PER_TENANT, "
            "CONVEYOR_STREAMS_PER_PROCESS); `Retry-After` says when to try again",
        },
    },
)
async def tenant_events(
    request: Request,
    service: ServiceDep,
    tenant: TenantDep,
    workflow: Annotated[
        str | None, Query(max_length=200, description="Only this workflow's executions.")
    ] = None,
    dedupe_key: Annotated[
        str | None, Query(max_length=200, description="Only executions with this dedupe key.")
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=60,
            description="Resume after this event: the events since are sent first.",
        ),
    ] = None,
) -> Response:
    """Server-sent events: each change of the status of the tenant's executions from now on
    (those triggered later included), filtered by workflow and by dedupe key; each event has
    an id, and a client that reconnects with `Last-Event-ID` gets every event since first."""
    streams: stream.Streams = request.app.state.streams
    filters = tenant_stream.Filters(tenant.id, workflow, dedupe_key)
    try:
        return await streams.open_tenant(service, tenant, filters, last_event_id)
    except (TooManyStreams, StreamsUnavailable) as exc:
        return stream.refused(exc)
    except ValueError as exc:
        return JSONResponse(Problem(detail=str(exc)).model_dump(), status_code=422)


# -- application events -------------------------------------------------------------------------


@router.post("/events", status_code=status.HTTP_202_ACCEPTED, tags=["events"])
def emit_event(body: EventBody, service: ServiceDep, tenant: TenantDep) -> EventStarted:
    """Start every workflow of the tenant that subscribes to the event's type (`events:` in
    its definition); each gets ``{"event": type, "payload": payload}`` as input. With a
    ``key``, also wake every wait node of the tenant waiting for this type and key (its
    output: the payload); the event is kept for the waits that begin later."""
    delivered = service.send_event(
        body.type, body.payload, key=body.key, tenant=tenant.name, run_at=body.run_at,
        delay=body.delay,
    )  # fmt: skip
    return EventStarted(
        executions=[t.execution_id for t in delivered.started], woke=delivered.woke_executions
    )
