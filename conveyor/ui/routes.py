"""``/ui``: the web dashboard, server-rendered from the same service calls and store reads as
the REST API, scoped to the signed-in key's tenant exactly as ``/v1`` is.

Every action is a form POST carrying the session's CSRF token; a page's errors are pages (an
unknown or another tenant's id: 404), never a stack trace.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from conveyor import views
from conveyor.api import stream
from conveyor.api.deps import ServiceDep
from conveyor.config import Settings, get_settings
from conveyor.engine import credentials
from conveyor.engine.definitions import Workflow
from conveyor.engine.records import TenantRef, WorkflowRecord
from conveyor.engine.states import ExecutionStatus, NodeStatus
from conveyor.engine.waits import APPROVAL_EVENT
from conveyor.engine.workflows import cached_workflow
from conveyor.exceptions import (
    AuthError,
    NotFound,
    StreamsUnavailable,
    TooManyStreams,
)
from conveyor.scheduler import schedules
from conveyor.service import Conveyor
from conveyor.store.dead_letters import DeadLetterFilter
from conveyor.store.listing import ExecutionFilter
from conveyor.ui import approvals, dag, operators
from conveyor.ui.inputs import node_inputs
from conveyor.ui.pages import (
    FormDep,
    Pages,
    Who,
    WhoDep,
    back,
    checked,
    error_page,
    filtered,
    render,
    signer,
)
from conveyor.ui.sessions import COOKIE, Signer, new_key_secret

PAGE = 50  # executions per page
SHOWN_CHARS = 2_000  # a value longer than this, as JSON, is cut with a link to all of it


router = APIRouter(prefix="/ui", route_class=Pages, include_in_schema=False)


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the dashboard on ``app`` under /ui (its scripts and styles under /ui/static)."""
    app.state.ui_signer = Signer(settings.ui_secret)
    static = Path(__file__).parent / "static"
    app.mount("/ui/static", StaticFiles(directory=static), name="ui-static")
    app.include_router(approvals.router)
    app.include_router(router)  # last: its catch-all answers every other path under /ui


# -- sign in and out ----------------------------------------------------------------------------


@router.get("/signin")
def signin_page(request: Request, next: str = "/ui") -> HTMLResponse:
    return render(request, "signin.html", who=None, next=next, problem=None)


def _cross_site(request: Request) -> bool:
    """A post another site's page made (the browser's Sec-Fetch-Site, else its Origin): the
    sign-in refuses it, or a hostile page could sign a visitor in with its own key (login
    CSRF: the visitor then acts, unaware, in the attacker's tenant)."""
    fetched_from = request.headers.get("sec-fetch-site")
    if fetched_from is not None:
        return fetched_from not in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}"


@router.post("/signin")
def signin(request: Request, service: ServiceDep, form: FormDep) -> Response:
    if _cross_site(request):
        problem = "Sign in from this page: a sign-in posted by another site is refused."
        return render(request, "signin.html", 403, who=None, next="/ui", problem=problem)
    key = (form.get("key") or [""])[0].strip()
    target = (form.get("next") or ["/ui"])[0]
    if not target.startswith("/ui"):
        target = "/ui"  # never off to another site
    try:
        tenant = service.authenticate(key)
        prefix = credentials.key_prefix(key)
    except AuthError:
        problem = "That API key is unknown or revoked; make one with `conveyor keys create`."
        return render(request, "signin.html", 401, who=None, next=target, problem=problem)
    key_secret = service.db.run(lambda store: store.open_sessions(prefix, new_key_secret()))
    _, cookie = signer(request).open(tenant.id, tenant.name, prefix, key_secret)
    answer = RedirectResponse(target, status_code=303)
    answer.set_cookie(
        COOKIE, cookie, httponly=True, samesite="strict", path="/ui",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return answer


@router.post("/signout")
def signout(request: Request, service: ServiceDep, who: WhoDep, form: FormDep) -> Response:
    """Ends every session of the key, on every process: a copy of the cookie reads no more."""
    checked(request, who, form)
    service.db.run(lambda store: store.end_sessions(who.session.key_prefix))
    answer = RedirectResponse("/ui/signin", status_code=303)
    answer.delete_cookie(COOKIE, path="/ui")
    return answer


# -- overview -----------------------------------------------------------------------------------


@router.get("")
def overview(request: Request, service: ServiceDep, who: WhoDep) -> HTMLResponse:
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    with service.db.transaction() as store:
        counts = store.status_counts(who.scope, ExecutionFilter())
        recent = store.status_counts(who.scope, ExecutionFilter(created_after=hour_ago))
        dead = store.dead_letter_rows(DeadLetterFilter(tenant_id=who.scope), 1000)
    totals: dict[str, int] = {}
    for row in counts:
        totals[row.status.value] = totals.get(row.status.value, 0) + row.count
    finished = [r for r in recent if r.status.finished]
    failed = sum(r.count for r in finished if r.status is ExecutionStatus.FAILED)
    done = sum(r.count for r in finished)
    return render(
        request, "overview.html", who=who, totals=totals, total=sum(totals.values()),
        hour_finished=done, hour_failed=failed,
        error_rate=f"{100 * failed / done:.1f} %" if done else "—",
        dead_letters=len(dead), statuses=[s.value for s in ExecutionStatus],
    )  # fmt: skip


@router.get("/overview.json")
def overview_figures(service: ServiceDep, who: WhoDep) -> dict[str, Any]:
    """The operators' figures (process-wide: every tenant's), which the overview page of an
    operator's session fetches every few seconds. A tenant's session has none (404)."""
    if not who.operator:
        raise NotFound("There is no such page.")
    limiter = service.gate.limiter if service.gate is not None else None
    return operators.figures(service.db, get_settings().resolved_broker_url, limiter)


# -- executions ---------------------------------------------------------------------------------


@router.get("/executions")
def executions(
    request: Request,
    service: ServiceDep,
    who: WhoDep,
    status: str = "",
    workflow: str = "",
    since_hours: float | None = None,
    find: str = "",
    after: uuid.UUID | None = None,
    tenant: str = "",
) -> Response:
    found = _find(service, who, find.strip())
    if found is not None:
        return RedirectResponse(f"/ui/executions/{found}", status_code=303)
    created_after = (
        datetime.now(UTC) - timedelta(hours=since_hours) if since_hours is not None else None
    )
    where = ExecutionFilter(
        status=ExecutionStatus(status) if status in {s.value for s in ExecutionStatus} else None,
        workflow=workflow or None, created_after=created_after,
        idempotency_key=find.strip() or None,
    )  # fmt: skip
    with service.db.transaction() as store:
        names = {t.id: t.name for t in store.tenants()} if who.operator else {}
        scope = filtered(who, names, tenant)
        if status == "waiting":
            where = replace(where, status=ExecutionStatus.RUNNING, node_status=NodeStatus.WAITING)
        rows = store.list_executions(scope, where=where, after=after, limit=PAGE + 1)
        if not rows and where.idempotency_key:  # then it is a dedupe key, perhaps
            where = replace(where, idempotency_key=None, dedupe_key=where.idempotency_key)
            rows = store.list_executions(scope, where=where, after=after, limit=PAGE + 1)
        listed = [
            {**views.execution_summary(e, name, v), "tenant": names.get(e.tenant_id, "")}
            for e, name, v in rows[:PAGE]
        ]
    more = {"status": status, "workflow": workflow, "find": find, "tenant": tenant}
    if since_hours is not None:
        more["since_hours"] = str(since_hours)
    next_page = None
    if len(rows) > PAGE:
        next_page = "/ui/executions?" + urlencode({**more, "after": listed[-1]["id"]})
    return render(
        request, "executions.html", who=who, rows=listed, next_page=next_page,
        statuses=[*(s.value for s in ExecutionStatus), "waiting"], status=status,
        workflow=workflow, since_hours=since_hours, find=find, tenant=tenant,
        tenants=sorted(names.values()),
    )  # fmt: skip


def _find(service: Conveyor, who: Who, text: str) -> uuid.UUID | None:
    """The tenant's execution with this id (a search by id opens it), or None."""
    try:
        execution_id = uuid.UUID(text)
    except ValueError:
        return None
    try:
        _owned(service, who, execution_id)
    except NotFound:
        return None
    return execution_id


def _owned(service: Conveyor, who: Who, execution_id: uuid.UUID) -> TenantRef:
    """The tenant of an execution this session may see (its own; any, for an operator's),
    with the session's key: what an action on it records. NotFound otherwise."""
    with service.db.transaction() as store:
        owner = store.execution_tenant(execution_id)
    if owner is None or (not who.operator and owner.id != who.tenant.id):
        raise NotFound(f"No execution has id {execution_id}.")
    return replace(owner, key=who.tenant.key)


@router.get("/executions/{execution_id}")
def execution(
    request: Request, execution_id: uuid.UUID, service: ServiceDep, who: WhoDep
) -> HTMLResponse:
    owner = _owned(service, who, execution_id)
    with service.db.transaction() as store:
        view = views.execution_view(store, execution_id)
        record = store.workflow(store.execution_row(execution_id).workflow_id)
        waits = {w.node_id: w for w in store.execution_waits(execution_id)}
    drawn = dag.layout(record.definition.get("nodes", []))
    nodes = {n["id"]: n for n in view["nodes"]}
    tries = {j["node"]: j["attempts"] for j in view["jobs"] if j["node"]}
    # a wait for a person's decision shows its question and the Approve and Reject buttons
    asks = {
        n["id"]: str(n.get("config", {}).get("message") or "")
        for n in record.definition.get("nodes", [])
        if n["id"] in waits and waits[n["id"]].event == APPROVAL_EVENT
    }
    return render(
        request, "execution.html", who=who, e=view, layout=drawn, nodes=nodes, tries=tries,
        waits=waits, asks=asks, approval_nodes=_approval_nodes(record.definition),
        inputs=node_inputs(_parsed(record), view), shown=_shown,
        note=request.query_params.get("note"),
        finished=ExecutionStatus(view["status"]).finished,
        workflow_link=_workflow_link(who, owner.name, view["workflow"], view["version"]),
    )  # fmt: skip


def _parsed(record: WorkflowRecord) -> Workflow:
    """A stored version's definition, parsed (this process's engine cache has it, often)."""
    cached = cached_workflow(record.id)
    return cached[0] if cached is not None else Workflow.model_validate(record.definition)


def _approval_nodes(definition: dict[str, Any]) -> set[str]:
    return {n["id"] for n in definition.get("nodes", []) if n.get("type") == "approval"}


def _workflow_link(who: Who, tenant: str, name: str, version: int | None = None) -> str:
    """A workflow's page; an operator's names the tenant (names are each tenant's own)."""
    query: dict[str, str | int] = {"tenant": tenant} if who.operator else {}
    if version is not None:
        query["version"] = version
    return f"/ui/workflows/{quote(name, safe='')}" + (f"?{urlencode(query)}" if query else "")


def _shown(value: Any) -> tuple[str, bool]:
    """A value as JSON for a page, cut at SHOWN_CHARS; whether it was cut."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return (text[:SHOWN_CHARS], True) if len(text) > SHOWN_CHARS else (text, False)


@router.get("/executions/{execution_id}/value")
def value(
    execution_id: uuid.UUID, service: ServiceDep, who: WhoDep, node: str = "", part: str = ""
) -> Response:
    """The whole of a value a page cut: a node's output (``part=inputs``: its inputs, as the
    page shows them), or the execution's input (no node)."""
    if part not in ("", "inputs"):
        raise NotFound(f"A value has no part {part!r}: ask for part=inputs, or leave it out.")
    _owned(service, who, execution_id)
    with service.db.transaction() as store:
        view = views.execution_view(store, execution_id)
        record = store.workflow(store.execution_row(execution_id).workflow_id) if part else None
    match = [n for n in view["nodes"] if n["id"] == node]
    if node and not match:
        raise NotFound(f"Execution {execution_id} has no node {node!r}.")
    found: Any = match[0]["output"] if match else view["input"]
    if record is not None:  # part=inputs
        given = node_inputs(_parsed(record), view).get(node)
        if given is None or not given.shown:
            raise NotFound(f"Node {node!r} of execution {execution_id} has no inputs to show.")
        found = given.value
    return Response(json.dumps(found, indent=2, ensure_ascii=False, default=str),
                    media_type="application/json")  # fmt: skip


@router.get("/executions/{execution_id}/statuses")
def statuses(execution_id: uuid.UUID, service: ServiceDep, who: WhoDep) -> dict[str, str]:
    """Each node's status now: what the page's script asks once its stream is open (the
    stream tells only of what changes after)."""
    _owned(service, who, execution_id)
    with service.db.transaction() as store:
        return {n.node_id: n.status.value for n in store.execution_nodes(execution_id)}


@router.get("/executions/{execution_id}/events")
async def events(
    request: Request, execution_id: uuid.UUID, service: ServiceDep, who: WhoDep
) -> Response:
    """The execution's live stream (as ``/v1``'s), for the page's script."""
    await run_in_threadpool(_owned, service, who, execution_id)
    streams: stream.Streams = request.app.state.streams
    try:  # counted against the session's own tenant: an operator's pages take no tenant's share
        return await streams.open(service, who.tenant, execution_id)
    except (TooManyStreams, StreamsUnavailable) as exc:
        return stream.refused(exc)


def _acting_on(
    request: Request,
    service: Conveyor,
    who: Who,
    form: dict[str, list[str]],
    execution_id: uuid.UUID,
) -> TenantRef:
    """A form acting on an execution: its CSRF token first, then the tenant's ownership; the
    execution's own tenant, which the action records."""
    checked(request, who, form)
    return _owned(service, who, execution_id)


@router.post("/executions/{execution_id}/cancel")
def cancel(
    request: Request, execution_id: uuid.UUID, service: ServiceDep, who: WhoDep, form: FormDep
) -> Response:
    _acting_on(request, service, who, form, execution_id)
    service.cancel(execution_id)
    return back(f"/ui/executions/{execution_id}", "Cancelled.")


@router.post("/executions/{execution_id}/rerun")
def rerun(
    request: Request, execution_id: uuid.UUID, service: ServiceDep, who: WhoDep, form: FormDep
) -> Response:
    owner = _acting_on(request, service, who, form, execution_id)
    node = (form.get("from_node") or [""])[0]
    done = service.rerun(
        execution_id, node, requested_by=who.tenant.key or f"tenant:{who.tenant.name}",
        tenant_id=owner.id,
    )  # fmt: skip
    return back(f"/ui/executions/{execution_id}", f"Running again from {done.from_node}.")


# -- dead letters -------------------------------------------------------------------------------


@router.get("/dead-letters")
def dead_letters(
    request: Request, service: ServiceDep, who: WhoDep, workflow: str = "", error: str = "",
    archived: bool = False,
) -> HTMLResponse:  # fmt: skip
    where = DeadLetterFilter(
        tenant_id=who.scope, workflow=workflow or None, error=error or None,
        discarded=archived,
    )  # fmt: skip
    with service.db.transaction() as store:
        rows = [views.dead_letter_json(*r) for r in store.dead_letter_rows(where, 200)]
    groups: dict[tuple[str, str], list[views.DeadLetterJson]] = {}
    for row in rows:
        groups.setdefault((row["workflow"], (row["error"] or "")[:120]), []).append(row)
    return render(
        request, "dead_letters.html", who=who, groups=groups, workflow=workflow, error=error,
        archived=archived, note=request.query_params.get("note"),
    )  # fmt: skip


def _job_ids(form: dict[str, list[str]]) -> list[uuid.UUID]:
    ids = []
    for text in form.get("job_id", []):
        try:
            ids.append(uuid.UUID(text))
        except ValueError:
            raise NotFound(f"No dead letter has id {text!r}.") from None
    return ids


def _outcome(verb: str, results: dict[uuid.UUID, str | None]) -> str:
    done = sum(1 for refused in results.values() if refused is None)
    refused = [f"{job_id}: {why}" for job_id, why in results.items() if why]
    return f"{verb} {done}." + (f" Refused: {'; '.join(refused)}" if refused else "")


@router.post("/dead-letters/requeue")
def requeue(request: Request, service: ServiceDep, who: WhoDep, form: FormDep) -> Response:
    checked(request, who, form)
    results = service.requeue_dead_letters(_job_ids(form), who.scope)
    return back("/ui/dead-letters", _outcome("Requeued", results))


@router.post("/dead-letters/discard")
def discard(request: Request, service: ServiceDep, who: WhoDep, form: FormDep) -> Response:
    checked(request, who, form)
    results = service.discard_dead_letters(_job_ids(form), who.scope)
    return back("/ui/dead-letters", _outcome("Discarded", results))


# -- workflows and schedules ----------------------------------------------------------------------


@router.get("/workflows")
def workflows(request: Request, service: ServiceDep, who: WhoDep, tenant: str = "") -> HTMLResponse:
    with service.db.transaction() as store:
        names = {t.id: t.name for t in store.tenants()} if who.operator else {}
        scope = filtered(who, names, tenant)
        rows = [
            {**views.workflow_json(r), "tenant": names.get(r.tenant_id, ""),
             "link": _workflow_link(who, names.get(r.tenant_id, ""), r.name)}
            for r in store.list_workflows(scope)
        ]  # fmt: skip
        planned = store.schedules(scope)
    return render(
        request, "workflows.html", who=who, rows=rows, schedules=planned, tenant=tenant,
        tenants=sorted(names.values()), names=names, note=request.query_params.get("note"),
    )  # fmt: skip


def _tenant_named(service: Conveyor, who: Who, tenant: str) -> TenantRef:
    """The tenant whose workflow or schedule a page shows or acts on: the session's own, or
    for an operator's the one named (its own when none is)."""
    if not who.operator or not tenant or tenant == who.tenant.name:
        return who.tenant
    with service.db.transaction() as store:
        found = store.tenant_named(tenant)
    if found is None:
        raise NotFound(f"No tenant is named {tenant!r}; the workflows page lists every one.")
    return TenantRef(id=found, name=tenant, key=who.tenant.key)


@router.get("/workflows/{name}")
def workflow(
    request: Request, name: str, service: ServiceDep, who: WhoDep, version: int | None = None,
    tenant: str = "",
) -> HTMLResponse:  # fmt: skip
    owner = _tenant_named(service, who, tenant)
    with service.db.transaction() as store:
        latest = store.latest_workflow(owner.id, name)
        if latest is None:
            raise NotFound(f"No workflow is named {name!r}.")
        shown = latest
        if version is not None:
            shown = store.workflow_version(owner.id, name, version) or latest
        planned = store.schedules(owner.id, workflow=name)
        recent = store.list_executions(owner.id, where=ExecutionFilter(workflow=name), limit=10)
        runs = [views.execution_summary(e, n, v) for e, n, v in recent]
    return render(
        request, "workflow.html", who=who, w=shown, latest=latest.version, schedules=planned,
        runs=runs, layout=dag.layout(shown.definition.get("nodes", [])), nodes={}, tries={},
        note=request.query_params.get("note"), owner=owner.name,
        names={owner.id: owner.name}, link=lambda v: _workflow_link(who, owner.name, name, v),
    )  # fmt: skip


@router.post("/schedules/{name}/{verb}")
def schedule_action(
    request: Request, name: str, verb: str, service: ServiceDep, who: WhoDep, form: FormDep
) -> Response:
    checked(request, who, form)
    change = {"pause": schedules.pause, "resume": schedules.resume}.get(verb)
    if change is None:
        raise NotFound(f"A schedule can be paused or resumed, not {verb!r}.")
    owner = _tenant_named(service, who, (form.get("tenant") or [""])[0])
    now = datetime.now(UTC)
    record = service.db.run(lambda s: change(s, owner.name, name, now))
    done = "Paused" if verb == "pause" else "Resumed"
    target = _workflow_link(who, owner.name, record.workflow_name)
    return back(target, f"{done} schedule {name}.")


@router.get("/{rest:path}")
def unknown(request: Request, rest: str) -> HTMLResponse:
    return error_page(request, 404, "There is no such page.")
