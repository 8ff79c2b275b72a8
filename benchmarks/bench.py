"""What the comparison benchmarks share (:mod:`benchmarks.compare`, :mod:`benchmarks.maps`
and the commands built on them): the services, a client of Conveyor, and the worker settings
both sides run with."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import select, text

from benchmarks import harness
from conveyor.config import Settings
from conveyor.engine.states import ExecutionStatus
from conveyor.models import Execution
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher

NOOP = {"function": "bench.noop"}
# How often each side looks for the fan-out's end (raw: a Redis GET; Conveyor: a SELECT).
END_POLL = 0.005
# The tables every node writes (and leaves dead row versions in).
HOT_TABLES = ("executions", "node_states", "jobs", "job_attempts")
LIMITS = {
    "CONVEYOR_LIMIT_GLOBAL": "100000",
    "CONVEYOR_LIMIT_TENANT": "100000",
    "CONVEYOR_LIMIT_WORKFLOW": "100000",
}


class Bench:
    """The services, a client of Conveyor, and the worker settings both sides share."""

    def __init__(self, svc: harness.Services, concurrency: int) -> None:
        self.svc = svc
        self.concurrency = concurrency
        self.database = Database(svc.database_url)
        app = create_app(Settings(database_url=svc.database_url, broker_url=svc.broker))
        self.client = Conveyor(self.database, CeleryDispatcher(app))
        self.redis = redis.Redis.from_url(svc.redis_url)
        self.env = svc.env(**LIMITS)

    @contextmanager
    def conveyor_workers(
        self,
        env: dict[str, str] | None = None,
        python: Sequence[str] = (sys.executable,),
        cwd: Path = harness.ROOT,
    ) -> Iterator[float]:
        specs = [("workflow-execution", 1), ("workflow-node", self.concurrency)]
        with harness.workers("conveyor.tasks", specs, env or self.env, python, cwd) as ready:
            yield ready

    @contextmanager
    def raw_workers(self) -> Iterator[float]:
        with harness.workers("benchmarks.nodes:raw", [("raw", self.concurrency)], self.env) as r:
            yield r

    def raw_app(self) -> Any:
        from benchmarks.nodes import raw

        raw.conf.update(broker_url=self.svc.broker, result_backend=self.svc.redis_url)
        return raw

    def at_rest(self) -> None:
        """Bring the tables to the state a server at rest keeps them in, before a figure:
        vacuumed and analyzed, as autovacuum leaves them (this machine's server runs without
        it), and the pages that wrote checkpointed. So no figure depends on the dead rows the
        figures before it left (pgbench vacuums before each run for the same reason); the
        rows a figure's own rounds leave are its own cost.

        A table nothing has written yet is left alone: there is nothing to vacuum, and an
        ANALYZE would record it empty. Autovacuum replaces that record after its first fifty
        rows (and the plans made on it with it); this server would keep it, and the plans a
        worker makes on a table it believes empty read the whole table on every node."""
        with self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            written = [
                name for name in HOT_TABLES
                if c.execute(text("SELECT pg_relation_size(:t)"), {"t": name}).scalar_one()
            ]  # fmt: skip
            if written:
                c.execute(text(f"VACUUM ANALYZE {', '.join(written)}"))
            c.execute(text("CHECKPOINT"))

    def finished_at(self, execution_id: uuid.UUID, timeout: float, poll: float = 0.002) -> datetime:
        """Wait for an execution to complete; when it finished (the worker's clock)."""
        deadline = time.monotonic() + timeout
        query = select(Execution.status, Execution.finished_at, Execution.error).where(
            Execution.id == execution_id
        )
        with self.database.engine.connect() as conn:
            while True:
                status, finished, error = conn.execute(query).one()
                if status is ExecutionStatus.COMPLETED and finished is not None:
                    return finished
                if status.finished:
                    raise RuntimeError(f"execution {execution_id} ended {status.value}: {error}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"execution {execution_id} not completed in {timeout} s")
                conn.rollback()
                time.sleep(poll)

    def raw_finished_at(self, key: str, timeout: float) -> float:
        """Wait for a raw chord's callback to record its end under ``key``; when it ran."""
        deadline = time.monotonic() + timeout
        while (done := self.redis.get(key)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the chord's callback did not run")
            time.sleep(END_POLL)
        return float(done)
