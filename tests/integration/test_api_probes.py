"""The API's probes and its documentation pages (issue 26), over real HTTP with real
PostgreSQL and Redis: /health is liveness and looks at nothing, /ready checks the database, the
broker and Redis and names what failed, and /docs and /redoc load their assets from the API
itself, never a CDN."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import httpx
import pytest

from conveyor.api import create_app
from conveyor.api.health import readiness
from conveyor.config import Settings
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app as create_celery_app
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.integration.conftest import served


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def services_down(conveyor_service: Conveyor) -> Iterator[str]:
    """The API over the real database, with the broker and Redis at a port nothing listens
    on; its URL."""
    closed = f"redis://127.0.0.1:{closed_port()}/0"
    settings = Settings(broker_url=closed, redis_url=closed)
    service = Conveyor(conveyor_service.db, CeleryDispatcher(create_celery_app(settings)))
    with served(create_app(service, settings)) as url:
        yield url


def test_health_and_ready_answer_ok_when_every_service_answers(api_url: str) -> None:
    live = httpx.get(f"{api_url}/health")
    ready = httpx.get(f"{api_url}/ready")

    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": "ok", "broker": "ok", "redis": "ok"},
    }


def test_ready_answers_503_naming_the_broker_and_redis_when_they_do_not_answer(
    services_down: str,
) -> None:
    live = httpx.get(f"{services_down}/health")
    ready = httpx.get(f"{services_down}/ready", timeout=30)

    # Then the process is alive (no restart), but not ready, and says why
    assert live.status_code == 200
    assert ready.status_code == 503, ready.text
    assert ready.json() == {
        "detail": "not ready: broker, redis",
        "errors": ["broker: failed: OperationalError", "redis: failed: ConnectionError"],
    }


def test_ready_answers_503_naming_the_database_when_it_does_not_answer() -> None:
    # Given an API whose PostgreSQL is at a port nothing listens on
    settings = Settings()
    database = Database(f"postgresql+psycopg://conveyor@127.0.0.1:{closed_port()}/conveyor")
    service = Conveyor(database, CeleryDispatcher(create_celery_app(settings)))
    try:
        with served(create_app(service, settings)) as url:
            live = httpx.get(f"{url}/health")
            ready = httpx.get(f"{url}/ready", timeout=30)
    finally:
        database.dispose()

    assert live.status_code == 200  # liveness looks at nothing
    assert ready.status_code == 503, ready.text
    assert ready.json() == {
        "detail": "not ready: database",
        "errors": ["database: failed: OperationalError"],
    }


def test_readiness_fails_a_database_that_accepts_but_never_answers_in_time() -> None:
    # Given a PostgreSQL port that accepts connections and never says a word (a server that
    # hangs): the check must not hold the probe until the connection gives up
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        database = Database(f"postgresql+psycopg://conveyor@127.0.0.1:{port}/conveyor")
        found = readiness(Settings(), database)

    assert found.status == "not ready"
    assert found.checks == {"database": "failed: TimeoutError", "broker": "ok", "redis": "ok"}
    database.dispose()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_documentation_pages_load_every_asset_from_the_api_itself(
    api_url: str, page: str
) -> None:
    html = httpx.get(f"{api_url}{page}")
    assert html.status_code == 200

    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
    assets = [u for u in urls if not u.endswith("openapi.json")]

    # Then nothing is fetched from elsewhere: the page works without internet
    assert assets, html.text
    assert [u for u in urls if not u.startswith("/")] == []
    for url in assets:
        answer = httpx.get(f"{api_url}{url}")
        assert answer.status_code == 200, url
        assert len(answer.content) > 1000, url  # the asset itself, not an error page
