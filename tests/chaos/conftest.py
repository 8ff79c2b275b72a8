"""Chaos tier: real `celery worker` and `celery beat` processes on a database and Redis db of
their own, killed, flushed and flooded while executions run.

The broker is that Redis db, or, for a test parametrized with
``@pytest.mark.parametrize("chaos_broker", ["redis", "amqp"], indirect=True)``, a RabbitMQ
vhost of the run's own (the limiter stays on Redis), as in the acceptance tier.

The recovery settings are shortened so that a scenario recovers in seconds: heartbeats every
0.3 s, a job reclaimed 3 s after its last one, a queued job's message re-sent after 2 s, a
recovery sweep every second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from conveyor.config import Settings
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.conftest import PG_ADMIN_URL, REDIS_DB, REDIS_SERVER, RUN_ID
from tests.support import rabbit, services

ROOT = Path(__file__).resolve().parents[2]
CHAOS_REDIS = f"{REDIS_SERVER}/{REDIS_DB + 2}"
CHAOS_DB = f"conveyor_chaos_{RUN_ID}"
CHAOS_DB_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + CHAOS_DB
CHAOS_VHOST = f"conveyor_chaos_{RUN_ID}"  # RabbitMQ's, for the scenarios run on it
FAST_RECOVERY = {
    "CONVEYOR_HEARTBEAT_INTERVAL": "0.3",
    "CONVEYOR_HEARTBEAT_TIMEOUT": "3",
    "CONVEYOR_LOST_AFTER": "2",
    "CONVEYOR_RECOVER_INTERVAL": "1",
    "CONVEYOR_PERMIT_LEASE": "3",
    "CONVEYOR_LIMITS_SWEEP_INTERVAL": "0.5",
    "CONVEYOR_PROMOTE_INTERVAL": "0.1",
    "CONVEYOR_LOG_FORMAT": "console",
    "CONVEYOR_LIMIT_TENANT": "50",
    "CONVEYOR_LIMIT_WORKFLOW": "50",
}
EFFECTS_DDL = """
CREATE TABLE chaos_effects (
    key TEXT PRIMARY KEY,
    runs INTEGER NOT NULL DEFAULT 1
)
"""


@pytest.fixture(scope="session")
def chaos_env() -> Iterator[dict[str, str]]:
    services.create_database(PG_ADMIN_URL, CHAOS_DB)
    services.prepare_schema(CHAOS_DB_URL)
    engine = create_engine(CHAOS_DB_URL)
    with engine.begin() as conn:
        conn.execute(text(EFFECTS_DDL))
    engine.dispose()
    services.flush_redis(CHAOS_REDIS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(
        CONVEYOR_DATABASE_URL=CHAOS_DB_URL,
        CONVEYOR_BROKER_URL=CHAOS_REDIS,
        CONVEYOR_REDIS_URL=CHAOS_REDIS,
        CONVEYOR_IMPORTS="tests.support.nodes",
        PYTHONPATH=str(ROOT),
        **FAST_RECOVERY,
    )
    yield env
    services.drop_database(PG_ADMIN_URL, CHAOS_DB)
    services.flush_redis(CHAOS_REDIS)


@pytest.fixture(scope="session")
def chaos_amqp() -> Iterator[str]:
    """A RabbitMQ vhost of the run's own; its URL."""
    with rabbit.vhost(CHAOS_VHOST) as url:
        yield url


@pytest.fixture
def chaos_broker(request: pytest.FixtureRequest) -> str:
    """The broker of the scenario's client, workers and beat: the chaos Redis db, or RabbitMQ
    for a test parametrized with ``"amqp"``. Its queues start empty."""
    if getattr(request, "param", "redis") == "redis":
        return CHAOS_REDIS
    url: str = request.getfixturevalue("chaos_amqp")
    rabbit.purge(url)  # the last scenario's killed workers left messages behind
    return url


@pytest.fixture
def chaos_client(chaos_env: dict[str, str], chaos_broker: str) -> Iterator[Conveyor]:
    services.truncate(CHAOS_DB_URL)
    engine = create_engine(CHAOS_DB_URL)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE chaos_effects"))
    engine.dispose()
    services.flush_redis(CHAOS_REDIS)
    settings = Settings(database_url=CHAOS_DB_URL, broker_url=chaos_broker)
    database = Database(CHAOS_DB_URL)
    yield Conveyor(database, CeleryDispatcher(create_app(settings)))
    database.dispose()


class Spawn:
    """A starter of `celery -A conveyor.tasks worker|beat ARGS...` processes on ``env``, each
    logging to a file of its own under ``logs``. Called, it starts one and awaits its ``ready``
    line; ``launch`` starts one without waiting, so that several start side by side and
    ``await_ready`` then waits for them all (a cluster is up in the time of its slowest)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[subprocess.Popen[str]] = []
        self._says: dict[int, tuple[Path, str]] = {}
        self._count = iter(range(1000))

    def __call__(self, *args: str, ready: str = "ready.") -> subprocess.Popen[str]:
        process = self.launch(*args, ready=ready)
        self.await_ready(process)
        return process

    def launch(self, *args: str, ready: str = "ready.") -> subprocess.Popen[str]:
        log = self.logs / f"{args[0]}-{next(self._count)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "conveyor.tasks", *args],
                cwd=ROOT, env=self.env, text=True, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip
        self.started.append(process)
        self._says[process.pid] = (log, ready)
        return process

    def log_of(self, process: subprocess.Popen[str]) -> Path:
        """The file the process logs to."""
        return self._says[process.pid][0]

    def await_ready(self, *processes: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 30
        for process in processes:
            log, ready = self._says[process.pid]
            while ready not in log.read_text():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def processes(env: dict[str, str], logs: Path) -> Iterator[Spawn]:
    """A ``Spawn`` on ``env`` and ``logs``; every process it started is killed on the way out."""
    spawn = Spawn(env, logs)
    try:
        yield spawn
    finally:
        spawn.kill_all()


@pytest.fixture
def spawn(chaos_env: dict[str, str], chaos_broker: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start `celery -A conveyor.tasks worker|beat ARGS...` on the scenario's broker; all are
    killed after the test."""
    with processes({**chaos_env, "CONVEYOR_BROKER_URL": chaos_broker}, tmp_path) as start:
        yield start
