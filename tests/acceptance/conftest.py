"""Acceptance tier: real ``celery worker`` subprocesses on their own database and Redis db.

Their broker db differs from the integration tier's, so the in-process worker of that tier
(alive for the whole session) never steals these messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.config import Settings
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.conftest import PG_ADMIN_URL, REDIS_DB, REDIS_SERVER, RUN_ID
from tests.support import rabbit, services

ROOT = Path(__file__).resolve().parents[2]
Shell = Callable[[str], subprocess.CompletedProcess[str]]


def examples_shell(tmp_path: Path) -> Shell:
    """A shell in a fresh directory holding the examples, with no CONVEYOR_* settings but the
    demo's nodes (the embedded default, as the examples' comments run them): it runs a
    command line and gives what it did."""
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("own-project"))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(CONVEYOR_IMPORTS="conveyor.demo",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")  # fmt: skip

    def shell(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, text=True,
                              capture_output=True, timeout=120)  # fmt: skip

    return shell


ACCEPTANCE_REDIS = f"{REDIS_SERVER}/{REDIS_DB + 1}"
ACCEPTANCE_DB = f"conveyor_accept_{RUN_ID}"
ACCEPTANCE_DB_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + ACCEPTANCE_DB
ACCEPTANCE_VHOST = f"conveyor_accept_{RUN_ID}"  # RabbitMQ's, for the tests run on it


@pytest.fixture(scope="session")
def acceptance_env() -> Iterator[dict[str, str]]:
    services.create_database(PG_ADMIN_URL, ACCEPTANCE_DB)
    services.prepare_schema(ACCEPTANCE_DB_URL)
    services.flush_redis(ACCEPTANCE_REDIS)
    env = dict(os.environ)
    env.update(
        CONVEYOR_DATABASE_URL=ACCEPTANCE_DB_URL,
        CONVEYOR_BROKER_URL=ACCEPTANCE_REDIS,
        CONVEYOR_REDIS_URL=ACCEPTANCE_REDIS,
        PYTHONPATH=str(ROOT),
    )
    yield env
    services.drop_database(PG_ADMIN_URL, ACCEPTANCE_DB)
    services.flush_redis(ACCEPTANCE_REDIS)


@pytest.fixture(scope="session")
def acceptance_amqp() -> Iterator[str]:
    """A RabbitMQ vhost of the run's own; its URL."""
    with rabbit.vhost(ACCEPTANCE_VHOST) as url:
        yield url


@pytest.fixture
def acceptance_broker(request: pytest.FixtureRequest) -> str:
    """The broker of the test's client, workers and beat: Redis, or RabbitMQ for a test
    parametrized with ``@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"],
    indirect=True)`` (the limiter stays on Redis). Its queues start empty."""
    if getattr(request, "param", "redis") == "redis":
        return ACCEPTANCE_REDIS
    url: str = request.getfixturevalue("acceptance_amqp")
    rabbit.purge(url)
    return url


@pytest.fixture
def broker_env(acceptance_env: dict[str, str], acceptance_broker: str) -> dict[str, str]:
    """The settings of the test's own ``conveyor`` processes (the CLI, ``conveyor api``): the
    acceptance tier's, with the test's broker, so that what they publish reaches its workers."""
    return {**acceptance_env, "CONVEYOR_BROKER_URL": acceptance_broker}


@pytest.fixture
def client(acceptance_env: dict[str, str], acceptance_broker: str) -> Iterator[Conveyor]:
    """A service that triggers and reads, as an application would; it runs no worker."""
    services.truncate(ACCEPTANCE_DB_URL)
    services.flush_redis(ACCEPTANCE_REDIS)  # the last test's workers are gone; so go its messages
    settings = Settings(database_url=ACCEPTANCE_DB_URL, broker_url=acceptance_broker)
    database = Database(ACCEPTANCE_DB_URL)
    yield Conveyor(database, CeleryDispatcher(create_app(settings)))
    database.dispose()


@pytest.fixture
def start_worker(
    acceptance_env: dict[str, str], acceptance_broker: str, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``celery -A conveyor.tasks worker`` processes; all are stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(
        queues: str,
        *,
        concurrency: int = 2,
        name: str = "w",
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> subprocess.Popen[str]:
        """Start one worker and await its ``ready`` line; with ``wait=False`` return at once,
        and let ``await_ready`` wait for several started side by side."""
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "conveyor.tasks",
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            "-n",
            f"{name}-{RUN_ID}@%h",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
        ]
        # stderr (the logs) apart from stdout (Celery's banner): each stderr line is a record
        log = tmp_path / f"{name}.log"
        with log.open("w") as err, (tmp_path / f"{name}.out").open("w") as out:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**acceptance_env, "CONVEYOR_BROKER_URL": acceptance_broker, **(env or {})},
                text=True,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: a test can kill it whole
            )
        started.append(process)
        _LOGS[process.pid] = (log, "ready.")
        if wait:
            await_ready(process)
        return process

    yield start
    _stop(started)


@pytest.fixture
def start_beat(
    acceptance_env: dict[str, str], acceptance_broker: str, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``celery -A conveyor.tasks beat`` processes; all are stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(
        name: str = "beat", env: dict[str, str] | None = None, wait: bool = True
    ) -> subprocess.Popen[str]:
        log = tmp_path / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "conveyor.tasks", "beat",
                 "--loglevel", "INFO"],
                cwd=ROOT, env={**acceptance_env, "CONVEYOR_BROKER_URL": acceptance_broker,
                               **(env or {})}, text=True, stdout=out,
                stderr=out, start_new_session=True,
            )  # fmt: skip
        started.append(process)
        _LOGS[process.pid] = (log, "beat: Starting...")
        if wait:
            await_ready(process)
        return process

    yield start
    _stop(started)


_LOGS: dict[int, tuple[Path, str]] = {}  # a started process's log, and the line that says ready


def await_ready(*processes: subprocess.Popen[str]) -> None:
    """Wait for processes that ``start_worker``/``start_beat`` started with ``wait=False``."""
    for process in processes:
        _wait_until_ready(process, *_LOGS[process.pid])


def _wait_until_ready(process: subprocess.Popen[str], log: Path, says: str = "ready.") -> None:
    """Until ``log`` holds ``says``. For uvicorn wait for "Uvicorn running on", which it logs
    once its socket listens: "Application startup complete" comes before the bind, and a
    request sent between the two is refused."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if says in log.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited {process.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    _stop([process], grace=0)
    raise AssertionError(f"{process.args} said no {says!r} in 30 s:\n{log.read_text()}")


def _stop(processes: list[subprocess.Popen[str]], grace: float = 20) -> None:
    """SIGTERM (a warm shutdown), then after ``grace`` seconds SIGKILL to the process group
    (the pool's children too), always reaped: a process left unreaped is a ResourceWarning,
    which fails whichever test the garbage collector meets it in."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
