"""Integration tier: real PostgreSQL, real Redis broker, the in-process Celery worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import runtime
from conveyor.engine.queues import ALL_QUEUES
from conveyor.service import Conveyor
from tests.conftest import PG_ADMIN_URL, REDIS_URL, TEST_DB, TEST_DB_URL
from tests.support import services


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    services.create_database(PG_ADMIN_URL, TEST_DB)
    services.prepare_schema(TEST_DB_URL)
    services.flush_redis(REDIS_URL)
    yield TEST_DB_URL
    runtime.database().dispose()
    services.drop_database(PG_ADMIN_URL, TEST_DB)
    services.flush_redis(REDIS_URL)


@pytest.fixture(scope="session")
def celery_session_app(database_url: str) -> Any:
    import conveyor.tasks

    runtime.load_imports()
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
    import conveyor.tasks

    services.truncate(database_url)
    services.clear_limits(REDIS_URL)
    yield conveyor.tasks.service()
