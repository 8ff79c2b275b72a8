"""Process-wide wiring: settings -> database, Celery app, service. Built once, lazily."""

from __future__ import annotations

import importlib
import socket
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

from conveyor.config import get_settings
from conveyor.engine.addresses import AllowList
from conveyor.engine.limits import Limits
from conveyor.engine.template_budget import Budget
from conveyor.exceptions import ConfigurationError
from conveyor.limiter import RedisLimiter
from conveyor.store import Database

if TYPE_CHECKING:
    from conveyor.alerts.duty import Alerter
    from conveyor.service import Conveyor

_imported: set[str] = set()
_lock = threading.Lock()


@lru_cache(maxsize=1)
def database() -> Database:
    return Database(get_settings().resolved_database_url)


@lru_cache(maxsize=1)
def limiter() -> RedisLimiter | None:
    """The Redis limiter, or None when limits are off or the embedded default runs (one
    process whose worker threads already bound its concurrency)."""
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
    )
    return Alerter(
        service.db,
        lambda: metrics.take(service.db, settings.resolved_broker_url, limiter),
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


def load_imports(extra: list[str] | None = None) -> None:
    """Import the modules that register node functions (CONVEYOR_IMPORTS)."""
    with _lock:
        for module in [*get_settings().imports, *(extra or [])]:
            if module not in _imported:
                importlib.import_module(module)
                _imported.add(module)


def worker_name() -> str:
    return f"{socket.gethostname()}:{threading.get_native_id()}"


def http_allow() -> AllowList:
    """CONVEYOR_HTTP_ALLOW, against which definitions' literal http URLs are checked."""
    from conveyor.http_node import configured

    return configured().allow


def known_functions() -> frozenset[str] | None:
    """The registered node functions when CONVEYOR_IMPORTS names modules (definitions are
    checked against them); None, and no such check, when it names none."""
    from conveyor.nodes import registered_functions

    load_imports()
    return registered_functions() if get_settings().imports else None
