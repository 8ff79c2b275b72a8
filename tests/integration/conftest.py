"""Integration tier: real PostgreSQL, real Redis broker, the in-process Celery worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from conveyor import wiring
from conveyor.config import Settings
from conveyor.engine.credentials import new_api_key
from conveyor.engine.queues import ALL_QUEUES
from conveyor.service import Conveyor
from tests.conftest import PG_ADMIN_URL, REDIS_URL, TEST_DB, TEST_DB_URL
from tests.support import services

METRICS_TOKEN = "integration-metrics-token"  # the API of api_url serves /metrics to it
SCRAPER = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    services.create_database(PG_ADMIN_URL, TEST_DB)
    services.prepare_schema(TEST_DB_URL)
    services.flush_redis(REDIS_URL)
    yield TEST_DB_URL
    wiring.database().dispose()
    services.drop_database(PG_ADMIN_URL, TEST_DB)
    services.flush_redis(REDIS_URL)


@pytest.fixture(scope="session")
def celery_session_app(database_url: str) -> Any:
    import conveyor.tasks

    wiring.load_imports()
    return conveyor.tasks.app


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {"perform_ping_check": False, "concurrency": 6, "queues": list(ALL_QUEUES)}


@pytest.fixture
def conveyor_service(celery_session_worker: Any, database_url: str) -> Iterator[Conveyor]:
    """The service the worker uses, on a clean database."""
    services.truncate(database_url)
    services.clear_limits(REDIS_URL)
    yield wiring.service()


@contextmanager
def served(app: Any) -> Iterator[str]:
    """An ASGI app served over real HTTP (uvicorn on a free port, its lifespan run); its URL."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def api_url(celery_session_worker: Any, database_url: str) -> Iterator[str]:
    """The API served over real HTTP (uvicorn on a free port) by the service the in-process
    worker uses."""
    from conveyor.api import create_app

    with served(create_app(wiring.service(), Settings(metrics_token=METRICS_TOKEN))) as url:
        yield url


@pytest.fixture
def make_key(conveyor_service: Conveyor) -> Callable[[str], str]:
    """Create a tenant (if need be) and an API key for it; the key."""

    def make(tenant: str) -> str:
        made = new_api_key()
        with conveyor_service.db.transaction() as store:
            tenant_id = store.create_tenant(tenant)
            store.add_api_key(tenant_id, "test", made.prefix, made.digest, datetime.now(UTC))
        return made.key

    return make


@pytest.fixture
def operator_key(conveyor_service: Conveyor) -> str:
    """An operator's key, of the tenant ``ops`` (its name ``operator``): its
    dashboard session sees every tenant."""
    made = new_api_key()
    with conveyor_service.db.transaction() as store:
        tenant_id = store.create_tenant("ops")
        store.add_api_key(
            tenant_id, "operator", made.prefix, made.digest, datetime.now(UTC), operator=True
        )
    return made.key
