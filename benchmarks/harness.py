"""What every benchmark needs: its own PostgreSQL database and Redis db, and real
``celery worker`` processes started and stopped around a measurement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from alembic import command
from alembic.config import Config
from kombu import Connection
from sqlalchemy import create_engine, text

from conveyor.engine.queues import ALL_QUEUES

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "14"))
# The Redis server without a db number: another (say on 6380) keeps a run off a shared one.
REDIS_SERVER = os.environ.get("BENCH_REDIS_SERVER", "redis://127.0.0.1:6379")


@dataclass(frozen=True)
class Services:
    database_url: str
    redis_url: str  # the permits, the raw side's counters and results; the broker too, unless
    broker_url: str = ""  # another broker is named (--broker amqp://...: RabbitMQ)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env.update(
            CONVEYOR_DATABASE_URL=self.database_url,
            CONVEYOR_BROKER_URL=self.broker,
            CONVEYOR_REDIS_URL=self.redis_url,
            CONVEYOR_IMPORTS="benchmarks.nodes",
            BENCH_BROKER_URL=self.broker,
            BENCH_REDIS_URL=self.redis_url,
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def flush(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        client.flushdb()
        client.close()
        if self.broker != self.redis_url:  # RabbitMQ: its queues emptied
            with Connection(self.broker) as connection:
                for queue in (*ALL_QUEUES, "raw"):
                    channel: Any = connection.channel()
                    try:
                        channel.queue_purge(queue=queue)
                    except connection.channel_errors:  # NOT_FOUND: never declared
                        continue
                    channel.close()

    def reset_tables(self) -> None:
        engine = create_engine(self.database_url)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "TRUNCATE job_attempts, jobs, node_states, executions, workflows, tenants "
                    "RESTART IDENTITY CASCADE"
                )
            )
        engine.dispose()


@contextmanager
def services(broker_url: str = "") -> Iterator[Services]:
    """A fresh database (dropped after) and a Redis db flushed before and after; the broker
    the Redis db unless ``broker_url`` names another (its queues purged before and after)."""
    name = f"conveyor_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    command.upgrade(cfg, "head")
    found = Services(
        database_url=url, redis_url=f"{REDIS_SERVER}/{REDIS_DB}", broker_url=broker_url
    )
    found.flush()
    try:
        yield found
    finally:
        found.flush()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def workers(
    app: str,
    specs: list[tuple[str, int]],
    env: dict[str, str],
    python: Sequence[str] = (sys.executable,),
    cwd: Path = ROOT,
) -> Iterator[float]:
    """Start one worker per (queues, concurrency); yields the moment the last was ready.
    ``python`` and ``cwd``: how and where (benchmarks.ab runs an older commit's code)."""
    logs = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    env = {**env, "BENCH_READY_DIR": str(logs)}
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for i, (queues, concurrency) in enumerate(specs):
            log = logs / f"w{i}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [*python, "-m", "celery", "-A", app, "worker", "-Q", queues,
                     "-c", str(concurrency), "-n", f"bench{i}-{uuid.uuid4().hex[:6]}@%h",
                     "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
                    cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            started.append((process, log))
        for process, log in started:
            _wait_ready(process, log)
        yield time.perf_counter()
    finally:
        for process, _ in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process, _ in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_ready(process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not (log.parent / str(process.pid)).exists():
        if process.poll() is not None:
            raise RuntimeError(f"worker exited:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker not ready after 60 s:\n{log.read_text()}")
        time.sleep(0.05)
