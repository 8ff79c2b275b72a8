"""Test-run wiring shared by every tier.

Integration and acceptance tests use the real PostgreSQL and Redis on this machine: a database
of this run's own (``conveyor_test_<id>``, dropped at the end) and one Redis db number that the
run flushes itself (``CONVEYOR_TEST_REDIS_DB``, default 11, on ``CONVEYOR_TEST_REDIS_SERVER``,
default redis://127.0.0.1:6379; never FLUSHALL). A missing service
fails the run; nothing is skipped. The environment is set here, before any test imports
``conveyor.tasks``, because the Celery app is configured at import.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get(
    "CONVEYOR_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_DB = int(os.environ.get("CONVEYOR_TEST_REDIS_DB", "11"))
# The Redis server without a db number: another (say on 6380) lets several runs share a machine.
REDIS_SERVER = os.environ.get("CONVEYOR_TEST_REDIS_SERVER", "redis://127.0.0.1:6379")
REDIS_URL = f"{REDIS_SERVER}/{REDIS_DB}"
RUN_ID = uuid.uuid4().hex[:10]
TEST_DB = f"conveyor_test_{RUN_ID}"
TEST_DB_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + TEST_DB

os.environ["CONVEYOR_DATABASE_URL"] = TEST_DB_URL
os.environ["CONVEYOR_BROKER_URL"] = REDIS_URL
os.environ["CONVEYOR_REDIS_URL"] = REDIS_URL
os.environ["CONVEYOR_PROMOTE_INTERVAL"] = "0.05"
os.environ["CONVEYOR_IMPORTS"] = '["tests.support.nodes"]'

# What a failed test's report shows of each process log: the tail, and before it the last
# lines that say something went wrong (a stall's cause is often minutes before its end).
_TAIL_CHARS = 6000
_NOTABLE = ("[error", "[warning", "[critical", "Traceback", "Connected to", "recovery:")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries every process log it left under its tmp_path (workers,
    beat, Flower, the API): a worker's side of a failure is gone with the folder."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.rglob("*.log")):
            text = log.read_text(errors="replace")
            notable = [
                line
                for line in text.splitlines()
                if line.startswith(_NOTABLE) or any(mark in line[:60] for mark in _NOTABLE)
            ]
            name = log.relative_to(tmp_path)
            report.sections.append(
                (
                    f"process log {name}: notable lines",
                    "\n".join(dict.fromkeys(line[:300] for line in notable[-400:])).strip()[-8000:],
                )
            )
            report.sections.append((f"process log {name}: tail", text[-_TAIL_CHARS:]))
