"""The FastAPI application: routes, the error answers, and its wiring at start-up.

Every error a caller can cause answers ``{"detail": "what is wrong and how to fix it"}``
with the status that fits; a database or broker that cannot be reached answers 503. No
input answers 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

from conveyor import metrics, runtime
from conveyor.api import dead_letters, rest, webhooks
from conveyor.config import get_settings
from conveyor.exceptions import (
    AuthError,
    ConveyorError,
    DefinitionError,
    DispatchError,
    DuplicateDelivery,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    SignatureError,
    TemplateError,
)
from conveyor.service import Conveyor

log = logging.getLogger("conveyor.api")

_STATUS: list[tuple[type[ConveyorError], int]] = [
    (AuthError, 401),
    (SignatureError, 401),
    (NotFound, 404),
    (IdempotencyConflict, 409),
    (DuplicateDelivery, 409),
    (InvalidTransition, 409),
    (DefinitionError, 422),
    (TemplateError, 422),  # a trigger's template over its budget (a root delay's seconds)
    (DispatchError, 503),
    (ConveyorError, 400),
]


def create_app(service: Conveyor | None = None) -> FastAPI:
    """The app; without ``service`` it builds the process's own at start-up (and, on the
    embedded default, migrates SQLite and runs worker threads here)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if service is None:
                stack.enter_context(_embedded_workers())
                from conveyor.tasks import service as process_service

                app.state.service = process_service()
            else:
                app.state.service = service
            runtime.load_imports()
            yield

    app = FastAPI(
        title="Conveyor",
        version="1",
        summary="Durable DAG workflows on Celery: trigger, inspect and steer them.",
        lifespan=lifespan,
    )
    app.include_router(rest.router)
    app.include_router(dead_letters.router)
    app.include_router(webhooks.router)
    app.add_exception_handler(ConveyorError, _conveyor_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(DataError, _data_error)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(IntegrityError, _conflict)  # type: ignore[arg-type]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.SnapshotCollector(lambda: _snapshot(app.state.service)))

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        """Prometheus metrics (see conveyor/metrics.py), read fresh at each scrape."""
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _snapshot(service: Conveyor) -> metrics.Snapshot:
    limiter = service.gate.limiter if service.gate is not None else None
    return metrics.take(service.db, get_settings().resolved_broker_url, limiter)


def _embedded_workers() -> AbstractContextManager[object]:
    """On the embedded default, the API migrates SQLite and runs the workers itself."""
    if not get_settings().embedded:
        return nullcontext()
    from conveyor import db
    from conveyor.embedded import embedded_workers

    db.upgrade()
    return embedded_workers()


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
