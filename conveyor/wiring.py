"""The composition root: settings -> database, limiter, Celery app and THE service of this
process, each built once, lazily. The CLI, the API and the Celery tasks all take their wiring
from here.

Building the service imports no Celery: its dispatcher builds the Celery app at its first
publish, so a process that only reads or migrates (``conveyor workflow validate``,
``conveyor executions list``, the API answering reads) never loads it. Nor does asking for
the database import the service, the limiter, metrics or tracing (Redis's client, which
imports OpenTelemetry's SDK): a command that only reads imports what reading needs.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
from collections.abc import Sequence
from contextlib import suppress
from datetime import timedelta
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from conveyor.config import get_settings
from conveyor.engine import template_budget as budgets
from conveyor.engine.addresses import AllowList
from conveyor.engine.limits import Limits
from conveyor.engine.parameters import FunctionParameters
from conveyor.engine.ports import Dispatcher
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import Dispatch
from conveyor.engine.template_budget import Budget
from conveyor.exceptions import ConfigurationError
from conveyor.store import Database

if TYPE_CHECKING:
    from celery import Celery

    from conveyor.alerts.duty import Alerter
    from conveyor.engine.definitions import Workflow
    from conveyor.limiter import RedisLimiter
    from conveyor.service import Conveyor

_imported: set[str] = set()
_lock = threading.Lock()
_app_lock = threading.Lock()
_celery_app: Celery | None = None


@lru_cache(maxsize=1)
def service() -> Conveyor:
    """The service of this process: the one the tasks, the API and the CLI call."""
    from conveyor import metrics, tracing
    from conveyor.service import Conveyor

    settings = get_settings()
    budgets.configure(template_budget())  # every process that renders builds this
    tracing.configure(settings.tracing)  # every process that triggers or runs nodes builds this
    made = Conveyor(
        database(),
        dispatcher(),
        worker=worker_name(),
        limiter=limiter(),
        limits=default_limits(),
        lease=settings.permit_lease,
        age_low_after=settings.age_low_after,
        resend_after=settings.lost_after,
        broker_holds=lambda: metrics.broker_holds(
            settings.resolved_broker_url, {NODE_QUEUE: settings.batch_most}
        ),
        # a slot checked by the next regular check is never a misfire
        misfire_grace=max(settings.schedule_misfire_grace, settings.schedule_check_interval + 5),
        replay_window=timedelta(days=settings.webhook_replay_window_days),
        map_window=settings.map_window,
        continue_steps=settings.continue_steps,
        max_child_depth=settings.max_child_depth,
        bounds=settings.bounds,
        event_retention=timedelta(seconds=settings.event_retention_seconds),
    )
    made.heartbeat_interval = settings.heartbeat_interval
    return made


def celery_app() -> Celery:
    """The Celery app of this process, built at the first call: the one the worker serves
    (``conveyor.tasks`` registers its tasks on it) and the dispatcher publishes with."""
    global _celery_app
    # Imported before the lock: importing conveyor.tasks (the package runs first) calls this
    # function again on this thread, to register the tasks on the app.
    from conveyor.tasks.app import create_app

    with _app_lock:  # two threads' first publishes must not build two apps
        if _celery_app is None:
            _celery_app = create_app(get_settings())
        return _celery_app


class LazyDispatcher:
    """The Celery dispatcher, made at the first publish: a process that never publishes does
    not import Celery."""

    def __init__(self) -> None:
        self._made: Dispatcher | None = None

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        if self._made is None:
            from conveyor.tasks.dispatch import CeleryDispatcher

            self._made = CeleryDispatcher(celery_app())
        self._made.publish(dispatches, batch=batch)


@lru_cache(maxsize=1)
def dispatcher() -> Dispatcher:
    """The dispatcher of this process (the service's; :func:`conveyor.enqueue` sends with it
    too)."""
    return LazyDispatcher()


@lru_cache(maxsize=1)
def database() -> Database:
    return Database(get_settings().resolved_database_url)


@lru_cache(maxsize=1)
def limiter() -> RedisLimiter | None:
    """The Redis limiter, or None when limits are off or the embedded default runs (one
    process whose worker threads already bound its concurrency)."""
    from conveyor.limiter import RedisLimiter

    settings = get_settings()
    if not settings.limits_enabled or settings.embedded:
        return None
    url = settings.resolved_redis_url
    if url is None:
        raise ConfigurationError(
            "concurrency limits need Redis: set CONVEYOR_REDIS_URL (the broker is not Redis), "
            "or turn limits off with CONVEYOR_LIMITS_ENABLED=false"
        )
    return RedisLimiter.from_url(url, lease=settings.permit_lease)


def default_limits() -> Limits:
    settings = get_settings()
    return Limits(
        global_=settings.limit_global,
        tenant=settings.limit_tenant,
        workflow=settings.limit_workflow,
    )


def alerter(service: Conveyor) -> Alerter:
    """The alert duty, with the thresholds and webhook of the settings."""
    from conveyor import metrics
    from conveyor.alerts.duty import Alerter
    from conveyor.alerts.rules import Thresholds

    settings = get_settings()
    limiter = service.gate.limiter if service.gate is not None else None
    thresholds = Thresholds(
        queue_depth=settings.alert_queue_depth,
        wait_p95=settings.alert_wait_p95,
        error_rate=settings.alert_error_rate,
        dead_letter_growth=settings.alert_dead_letter_growth,
        schedule_lag=settings.alert_schedule_lag,
        wait_age=settings.alert_wait_age,
    )
    return Alerter(
        service.db,
        lambda: metrics.take(service.db, settings.resolved_broker_url, limiter, labelled=False),
        thresholds,
        interval=settings.alert_interval,
        webhook_url=settings.alert_webhook_url,
    )


def template_budget() -> Budget:
    """The template budget of the settings (CONVEYOR_TEMPLATE_*)."""
    settings = get_settings()
    return Budget(
        seconds=settings.template_timeout,
        operations=settings.template_max_operations,
        size=settings.template_max_size,
    )


def load_imports() -> None:
    """Import the modules that register node functions (CONVEYOR_IMPORTS). The current
    directory is searched first, as ``python -m`` and ``celery -A`` do, so that a project's
    own module imports without PYTHONPATH; ConfigurationError names a module that will not
    import and what to do."""
    with _lock:
        pending = [m for m in get_settings().imports if m not in _imported]
        if pending:
            _search_current_directory()
        for module in pending:
            _import(module)
            _imported.add(module)


def _search_current_directory() -> None:
    with suppress(FileNotFoundError):  # a directory removed under us has nothing to import
        here = os.getcwd()
        if here not in sys.path:
            sys.path.insert(0, here)


def flow_definitions(modules: Sequence[str], named_by: str) -> list[Workflow]:
    """The definitions of the flows (:class:`conveyor.Flow`) the modules declare at their top
    level, each once, validated as a definition file is; ``named_by`` (a setting, an option)
    is what named the modules, for the errors. CONVEYOR_IMPORTS is imported first, as a worker
    would, then the modules (which register their flows' functions)."""
    from conveyor.flows import Flow, flows_in

    load_imports()
    _search_current_directory()
    found: dict[str, Flow[Any, Any]] = {}
    for module in modules:
        flows = flows_in(_import(module, named_by))
        if not flows:
            raise ConfigurationError(
                f"{named_by} names the module {module!r}, which declares no conveyor.Flow at "
                f"its top level; declare the flows there, or name the module that does"
            )
        found |= {flow.name: flow for flow in flows}
    known, allow, bounds = known_functions(), http_allow(), get_settings().bounds
    return [
        flow.definition(known_functions=known, http_allow=allow, bounds=bounds)
        for flow in found.values()
    ]


def apply_modules() -> list[str]:
    """Store the flows of the modules CONVEYOR_APPLY_MODULES names (a worker at its start),
    for the default tenant; the names of those stored as a new version."""
    modules = get_settings().apply_modules
    definitions = flow_definitions(modules, "CONVEYOR_APPLY_MODULES") if modules else []
    return [w.name for w in definitions if service().apply(w)[1]]


def _import(module: str, named_by: str = "CONVEYOR_IMPORTS") -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module == missing or module.startswith(missing + "."):
            raise ConfigurationError(
                f"{named_by} names the module {module!r}, which is not found (searched "
                f"the current directory {os.getcwd()} and sys.path); run from the directory "
                f"that holds it, add that directory to PYTHONPATH, or install its package"
            ) from exc
        raise ConfigurationError(
            f"the module {module!r} of {named_by} imports {missing!r}, which is not "
            f"installed; install it where this process runs (pip install ...)"
        ) from exc
    except (ImportError, SyntaxError) as exc:
        raise ConfigurationError(
            f"the module {module!r} of {named_by} does not import: "
            f"{type(exc).__name__}: {exc}; fix it, or remove it from {named_by}"
        ) from exc


def worker_name() -> str:
    return f"{socket.gethostname()}:{threading.get_native_id()}"


def http_allow() -> AllowList:
    """CONVEYOR_HTTP_ALLOW, against which definitions' literal http URLs are checked."""
    from conveyor.http_node import configured

    return configured().allow


def function_parameters() -> FunctionParameters:
    """What the node functions registered in this process take (CONVEYOR_IMPORTS imported
    first), for validation to check python nodes' inputs against; a function registered
    elsewhere only is not checked."""
    from conveyor.nodes import function_parameters

    load_imports()
    return function_parameters


def known_functions() -> frozenset[str] | None:
    """The registered node functions when CONVEYOR_IMPORTS names modules (definitions are
    checked against them); None, and no such check, when it names none."""
    from conveyor.nodes import registered_functions

    load_imports()
    return registered_functions() if get_settings().imports else None
