"""The embedded default as a newcomer meets it (issue 26): the real `conveyor` command in a
fresh directory with no CONVEYOR_* settings, so SQLite, the in-process broker and worker
threads. A command that publishes work must see it finish, and schedules must fire while a
long-running embedded process (`conveyor worker`, `conveyor api`) runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.config import Settings
from conveyor.engine.states import ExecutionStatus
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app as create_celery_app
from conveyor.tasks.dispatch import CeleryDispatcher

CONVEYOR = str(Path(sys.executable).parent / "conveyor")  # the installed console script

NODES = '''
from pathlib import Path

import conveyor


@conveyor.node("flip.check")
def check() -> dict[str, str]:
    """Fails while a file named `broken` is in the working directory."""
    if Path("broken").exists():
        raise RuntimeError("broken is there")
    return {"ok": "yes"}
'''
FLOW = """
name: flow
nodes:
  - {id: check, type: python, config: {function: flip.check}, retry: {max_attempts: 1}}
"""


class Home:
    """A directory the embedded default keeps its SQLite database in, with a node module."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        self.env.update(PYTHONPATH=str(path), CONVEYOR_IMPORTS="flip")
        self.db = Database(f"sqlite:///{path / '.conveyor' / 'conveyor.db'}")

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CONVEYOR, *args], env={**self.env, **env}, cwd=self.path, text=True,
            capture_output=True, timeout=90,
        )  # fmt: skip

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        with (self.path / f"{args[0]}.log").open("w") as log:
            return subprocess.Popen(
                [CONVEYOR, *args], env={**self.env, **env}, cwd=self.path, text=True,
                stdout=log, stderr=log,
            )  # fmt: skip

    def executions(self) -> list[Any]:
        with self.db.transaction() as store:
            return [e for e, _, _ in store.list_executions(None, limit=100)]

    def status(self, execution_id: uuid.UUID) -> ExecutionStatus:
        with self.db.transaction() as store:
            return store.execution(execution_id).status

    def scheduled_done(self) -> set[uuid.UUID]:
        """The executions a schedule started that completed."""
        return {e.id for e in self.executions()
                if e.trigger == "schedule" and e.status is ExecutionStatus.COMPLETED}  # fmt: skip

    def make_due(self, schedule: str) -> None:
        """Move the schedule's next run into the past: cron's finest slot is a minute."""
        now = datetime.now(UTC)

        def due(store: Any) -> None:
            found = store.schedule(store.tenant_id("default"), schedule)
            store.update_schedule(found.id, now, next_run_at=now - timedelta(seconds=5))

        self.db.run(due)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    path = tmp_path_factory.mktemp("embedded")
    (path / "flip.py").write_text(NODES)
    (path / "flow.yaml").write_text(FLOW)
    made = Home(path)
    applied = made.run("workflow", "apply", "flow.yaml")
    assert applied.returncode == 0, applied.stderr
    yield made
    made.db.dispose()


def stop(process: subprocess.Popen[str], how: signal.Signals) -> int:
    process.send_signal(how)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def wait_until(found: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.2)
    return value


def test_dlq_requeue_runs_the_resumed_execution_to_its_end_on_the_embedded_default(
    home: Home,
) -> None:
    # Given an execution whose only node dead-lettered on its one try
    (home.path / "broken").touch()
    failed = home.run("run", "flow", "--json")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    execution_id = json.loads(failed.stdout)["execution_id"]
    [letter] = json.loads(home.run("dlq", "list", "--json").stdout)

    # When the cause is mended and the dead letter requeued from the command line
    (home.path / "broken").unlink()
    requeued = home.run("dlq", "requeue", letter["job_id"])

    # Then the command ran the resumed execution here, to its end, before it exited
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    assert f"{letter['job_id']}: requeued" in requeued.stdout
    assert "completed" in requeued.stdout
    assert home.status(uuid.UUID(execution_id)) is ExecutionStatus.COMPLETED


def test_conveyor_worker_fires_a_due_schedule_resumes_work_left_behind_and_stops_on_sigint(
    home: Home,
) -> None:
    # Given a schedule added from the command line, which says what will fire it
    added = home.run("schedules", "add", "flow", "--cron", "* * * * *", "--name", "by-worker")
    assert added.returncode == 0, added.stderr
    assert "`conveyor api` or `conveyor worker`" in added.stdout
    home.make_due("by-worker")
    # and an execution whose start message went to the in-process broker of a process that
    # is gone (this one's, which no worker serves): stored, never sent to a worker
    gone = Conveyor(home.db, CeleryDispatcher(create_celery_app(Settings(broker_url="memory://"))))
    left = gone.trigger("flow")

    # When `conveyor worker` runs
    worker = home.start("worker", CONVEYOR_SCHEDULE_CHECK_INTERVAL="1",
                        CONVEYOR_RECOVER_INTERVAL="1", CONVEYOR_LOST_AFTER="1")  # fmt: skip
    try:
        # Then the schedule's run is started and completed by its worker threads
        wait_until(home.scheduled_done, "completed scheduled execution")
        # and its recovery sweep sent the execution left behind, which completed
        wait_until(lambda: home.status(left) is ExecutionStatus.COMPLETED, "resumed execution")
    finally:
        code = stop(worker, signal.SIGINT)
    assert code == 0, (home.path / "worker.log").read_text()


def test_conveyor_api_on_the_embedded_default_fires_schedules_and_answers_its_probes(
    home: Home,
) -> None:
    # Given a due schedule
    added = home.run("schedules", "add", "flow", "--cron", "* * * * *", "--name", "by-api")
    assert added.returncode == 0, added.stderr
    home.make_due("by-api")
    before = {e.id for e in home.executions()}
    port = free_port()

    # When `conveyor api` runs on the embedded default
    api = home.start("api", "--port", str(port), CONVEYOR_SCHEDULE_CHECK_INTERVAL="1")
    url = f"http://127.0.0.1:{port}"
    try:
        ready = wait_until(lambda: _get(f"{url}/ready"), "answer from the API")

        # Then it is ready (SQLite and the in-process broker; no Redis to check)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}

        # And the schedule's run is started and completed by its worker threads
        wait_until(lambda: home.scheduled_done() - before, "completed scheduled execution")
    finally:
        stop(api, signal.SIGINT)  # uvicorn raises the signal again once it has shut down
    assert "Application shutdown complete" in (home.path / "api.log").read_text()


def test_applying_a_definition_with_schedules_on_the_embedded_default_says_what_starts_them(
    tmp_path: Path,
) -> None:
    # Given a fresh embedded home and a definition that declares a schedule
    fresh = Home(tmp_path)
    (tmp_path / "flip.py").write_text(NODES)
    (tmp_path / "nightly.yaml").write_text(FLOW.replace("name: flow", "name: nightly")
                                           + "schedules: [{cron: '0 3 * * *'}]\n")  # fmt: skip

    applied = fresh.run("workflow", "apply", "nightly.yaml")

    # Then it says what the embedded default needs running for them, as `schedules add` does
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        "nightly: stored version 1",
        "the schedules of nightly: their runs start while `conveyor api` or `conveyor worker` "
        "runs (the embedded default has no beat): keep one of them running",
    ]
    fresh.db.dispose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None  # not listening yet
