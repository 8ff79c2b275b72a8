"""The FastAPI application: routes, the error answers, and its wiring at start-up.

Every error answers the ``Problem`` shape, ``{"detail": "what is wrong and how to fix it",
"errors": [...]}``, with the status that fits, and every route documents the statuses it can
answer with that shape (FastAPI's own 422 shape and its 400 for an unreadable body included);
a database that cannot be reached answers 503. No input answers 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException

from conveyor import metrics, wiring
from conveyor.api import approvals, dead_letters, health, metrics_http, rest, stream, webhooks
from conveyor.api.bodies import BodyBounds
from conveyor.api.links import add_links
from conveyor.api.schemas import Problem
from conveyor.config import Settings, get_settings
from conveyor.exceptions import (
    AlreadyDecided,
    AuthError,
    ConveyorError,
    DefinitionError,
    DuplicateDelivery,
    IdempotencyConflict,
    InvalidTransition,
    MetricsNotServed,
    NotFound,
    SignatureError,
    TemplateError,
)
from conveyor.service import Conveyor
from conveyor.ui import routes as ui

log = logging.getLogger("conveyor.api")

_STATUS: list[tuple[type[ConveyorError], int]] = [
    (AuthError, 401),
    (SignatureError, 401),
    (MetricsNotServed, 403),
    (NotFound, 404),
    (IdempotencyConflict, 409),
    (AlreadyDecided, 409),
    (DuplicateDelivery, 409),
    (InvalidTransition, 409),
    (DefinitionError, 422),
    (TemplateError, 422),  # a trigger's template over its budget (a root delay's seconds)
    (ConveyorError, 422),
]
# What every route may answer besides its own, in the Problem shape (a route's own win).
PROBLEMS: dict[int | str, dict[str, Any]] = {
    422: {"model": Problem, "description": "Invalid input; `errors` lists every problem"},
    503: {"model": Problem, "description": "The database is unreachable; try again"},
}


def create_app(service: Conveyor | None = None, settings: Settings | None = None) -> FastAPI:
    """The app; without ``service`` it builds the process's own at start-up (and, on the
    embedded default, migrates SQLite and runs worker threads here). ``settings``: the
    process's (CONVEYOR_*) unless given."""
    settings = settings or get_settings()
    registry = CollectorRegistry(auto_describe=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if service is None:
                stack.enter_context(_embedded_workers())
                app.state.service = wiring.service()
            else:
                app.state.service = service
            wiring.load_imports()
            app.state.streams = await stack.enter_async_context(
                stream.serving(app.state.service, settings)
            )
            if settings.metrics_port:
                stack.enter_context(
                    metrics_http.served_apart(
                        registry, settings.metrics_host, settings.metrics_port,
                        settings.metrics_token,
                    )
                )  # fmt: skip
            yield

    # Swagger UI and ReDoc from files in the package: /docs works without internet.
    app = FastAPIOffline(
        static_url="/docs-assets",
        title="Conveyor",
        version="1",
        summary="Durable DAG workflows on Celery: trigger, inspect and steer them.",
        lifespan=lifespan,
    )
    app.include_router(rest.router, responses=PROBLEMS)
    app.include_router(dead_letters.router, responses=PROBLEMS)
    app.include_router(approvals.router, responses=PROBLEMS)
    app.include_router(webhooks.router, responses=PROBLEMS)
    ui.install(app, settings)  # the dashboard, /ui
    app.add_middleware(BodyBounds)
    app.add_exception_handler(ConveyorError, _conveyor_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(DataError, _data_error)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(IntegrityError, _conflict)  # type: ignore[arg-type]

    registry.register(
        metrics.SnapshotCollector(
            lambda: _snapshot(app.state.service),
            workflow_label=settings.metrics_workflow_label,
        )
    )
    generated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_links(generated())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=PlainTextResponse,
        responses={
            401: _json_problem("No token, or not CONVEYOR_METRICS_TOKEN"),
            403: _json_problem("Not served here: no token is set"),
            422: _json_problem(PROBLEMS[422]["description"]),
            503: _json_problem(PROBLEMS[503]["description"]),
        },
    )
    def prometheus(
        authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    ) -> PlainTextResponse:
        """Prometheus metrics (see conveyor/metrics.py), read fresh at each scrape; they need
        `Authorization: Bearer <CONVEYOR_METRICS_TOKEN>` (docs/operations.md#metrics)."""
        metrics_http.check_scrape(authorization, settings.metrics_token)
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health", tags=["health"])
    def live() -> health.Live:
        """Liveness: the process answers. It looks at nothing else (see /ready)."""
        return health.Live(status="ok")

    @app.get(
        "/ready",
        tags=["health"],
        response_model=health.Readiness,
        responses={503: {"model": Problem, "description": "A check failed; `errors` names each"}},
    )
    def ready() -> JSONResponse:
        """Readiness: the database answers, the broker accepts a connection, and Redis
        answers when configured; 503 names each that failed."""
        found = health.readiness(settings, app.state.service.db)
        if found.status == "ready":
            return JSONResponse(found.model_dump())
        failed = {name: outcome for name, outcome in found.checks.items() if outcome != "ok"}
        body = Problem(
            detail=f"not ready: {', '.join(failed)}",
            errors=[f"{name}: {outcome}" for name, outcome in failed.items()],
        )
        return JSONResponse(body.model_dump(), status_code=503)

    return app


def _json_problem(description: str) -> dict[str, Any]:
    """A Problem answer of a route whose success is not JSON (FastAPI would document its
    errors in the success's media type)."""
    schema = {"$ref": "#/components/schemas/Problem"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _snapshot(service: Conveyor) -> metrics.Snapshot:
    limiter = service.gate.limiter if service.gate is not None else None
    return metrics.take(service.db, get_settings().resolved_broker_url, limiter)


@contextmanager
def _embedded_workers() -> Iterator[None]:
    """On the embedded default, the API migrates SQLite and runs the workers itself, and what
    celery beat sends in production (the schedules among them)."""
    if not get_settings().embedded:
        yield
        return
    from conveyor import migrations
    from conveyor.embedded import embedded_beat, embedded_workers

    wiring.load_imports()  # before the first node runs
    migrations.upgrade()
    with embedded_workers(), embedded_beat():
        yield


async def _conveyor_error(request: Request, exc: ConveyorError) -> JSONResponse:
    code = next(code for cls, code in _STATUS if isinstance(exc, cls))
    body: dict[str, object] = {"detail": str(exc)}
    if isinstance(exc, DefinitionError):
        body["errors"] = exc.errors
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
    return JSONResponse(body, status_code=code, headers=headers)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's own validation errors, in the one error shape of this API."""
    errors = [
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
        for e in exc.errors()
    ]
    return JSONResponse(
        {"detail": f"{len(errors)} invalid value(s) in the request", "errors": errors},
        status_code=422,
    )


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own errors (an unknown path, a wrong method, a too large or
    unreadable body), in the Problem shape. FastAPI answers a body it cannot read (not
    UTF-8, a broken form) with 400: it is invalid input like any other, so 422."""
    if exc.status_code == 400:
        return JSONResponse(
            {"detail": f"the request body could not be read ({exc.detail}); send UTF-8 JSON"},
            status_code=422,
        )
    return JSONResponse(
        {"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
    )


async def _data_error(request: Request, exc: DataError) -> JSONResponse:
    cause = str(exc.orig).splitlines()[0] if exc.orig else "invalid value"
    return JSONResponse(
        {"detail": f"the database refused a value of the request: {cause}"}, status_code=422
    )


async def _conflict(request: Request, exc: IntegrityError) -> JSONResponse:
    return JSONResponse(
        {"detail": "a concurrent change to the same object won; read it again and retry"},
        status_code=409,
    )


async def _unavailable(request: Request, exc: OperationalError) -> JSONResponse:
    log.error("database unavailable: %s", str(exc.orig).splitlines()[0] if exc.orig else exc)
    return JSONResponse({"detail": "the database is unavailable; try again"}, status_code=503)


app = create_app()
