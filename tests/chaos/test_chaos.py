"""Nothing lost, nothing run twice, while workers are killed, the broker is flushed and
messages are duplicated or malformed. Each scenario runs 200 executions of a fan-out workflow
(a root, four parallel nodes, a join) whose nodes write an idempotency-keyed effect, and then
checks that every execution completed, every node's effect exists exactly once, and no
concurrency permit is left held.

The scenarios where the broker matters run on RabbitMQ too (``chaos_broker``), on fewer
executions (the Redis run keeps the volume; CI time is what the second broker costs). The
flushed broker's RabbitMQ twin is the purged queue of tests/acceptance/test_rabbitmq_faults.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from subprocess import Popen
from typing import cast

import pytest
import redis
from kombu import Connection, Producer
from sqlalchemy import create_engine, text

from conveyor.engine.ready import dispatch_of
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.limiter import RedisLimiter
from conveyor.service import Conveyor
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.chaos.conftest import CHAOS_DB_URL, CHAOS_REDIS, Spawn
from tests.conftest import RUN_ID

# Slow by nature (each scenario drains 1,200 node runs on a small machine): minutes, not 2 s.
pytestmark = pytest.mark.timeout(420)

EXECUTIONS = 200
AMQP_EXECUTIONS = 40
AMQP_KILLS = 2  # the Redis runs kill 4 (SIGKILL) and 3 (SIGTERM) workers
# How long a SIGTERM'd node worker may take to be gone: twice its documented grace (its
# longest node, a continuation streak of 50-ms nodes here, plus 30 s: docs/operations.md),
# for a loaded machine; past it, the worker is stuck.
WARM_STOP_WAIT = 60
BOTH_BROKERS = pytest.mark.parametrize("chaos_broker", ["redis", "amqp"], indirect=True)
FANOUT = 4
NODES = FANOUT + 2
NODE_SECONDS = 0.05


def fanout() -> dict:
    def effect(node_id: str, needs: list[str]) -> dict:
        return {"id": node_id, "type": "python", "needs": needs,
                "config": {"function": "test.chaos_effect"},
                "inputs": {"seconds": NODE_SECONDS}}  # fmt: skip

    middle = [effect(f"part{i}", ["root"]) for i in range(FANOUT)]
    return {
        "name": "fanout",
        "concurrency": 50,
        "defaults": {"retry": {"max_attempts": 10, "backoff": 0.2, "jitter": 0.1}},
        "nodes": [effect("root", []), *middle, effect("join", [n["id"] for n in middle])],
    }


class Cluster:
    """Beat, a planning worker and two node workers, with a way to replace node workers."""

    def __init__(self, spawn: Spawn) -> None:
        self.spawn = spawn
        self.serial = 0
        beat = spawn.launch("beat", "--loglevel", "INFO", ready="beat: Starting...")
        self.planner = self._worker(
            "workflow-execution,workflow-scheduled,workflow-webhook", "plan"
        )
        self.nodes = [self._worker("workflow-node", "node") for _ in range(2)]
        spawn.await_ready(beat, self.planner, *self.nodes)

    def _worker(self, queues: str, name: str) -> Popen[str]:
        self.serial += 1
        return self.spawn.launch(
            "worker", "-Q", queues, "-c", "4", "-n", f"{name}{self.serial}-{RUN_ID}@%h",
            "--loglevel", "INFO", "--without-mingle", "--without-gossip",
        )  # fmt: skip

    def add_node_worker(self) -> Popen[str]:
        worker = self._worker("workflow-node", "node")
        self.spawn.await_ready(worker)
        return worker

    def replace(self, old: Popen[str], how: signal.Signals) -> None:
        """Stop a node worker and start another. SIGKILL goes to its process group, the pool
        dying with its parent as in a crash; SIGTERM to the worker's main process only, as
        Kubernetes and Docker send it to a container's first process (the `celery worker`
        of our manifests)."""
        if how is signal.SIGTERM:
            self._stop_warmly(old)
        else:
            os.killpg(old.pid, how)
            old.wait(timeout=60)
        self.nodes[self.nodes.index(old)] = self.add_node_worker()

    def _stop_warmly(self, worker: Popen[str]) -> None:
        # Not to the group: the pool's children, whose SIGTERM Celery resets to the default,
        # would die outright (no warm shutdown at all), and one killed while writing its
        # result leaves the main process blocked for good on the rest of it in the pipe
        # (celery/concurrency/asynpool.py, _flush_outqueue).
        worker.send_signal(signal.SIGTERM)
        log = self.spawn.log_of(worker)
        try:
            code = worker.wait(timeout=WARM_STOP_WAIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a SIGTERM'd node worker was not gone in {WARM_STOP_WAIT} s:\n"
                        f"{log.read_text()[-4000:]}")  # fmt: skip
        said = log.read_text()
        # its running nodes finished in its pool: none was lost with a killed pool process
        assert code == 0 and "exited prematurely" not in said, said[-4000:]


@pytest.fixture
def executions(chaos_broker: str) -> int:
    """How many executions the scenario runs on its broker."""
    return EXECUTIONS if chaos_broker == CHAOS_REDIS else AMQP_EXECUTIONS


def start_all(client: Conveyor, executions: int = EXECUTIONS) -> list[uuid.UUID]:
    client.apply(parse_workflow(fanout()))
    return [client.trigger("fanout", {"n": i}) for i in range(executions)]


def assert_nothing_lost_nothing_twice(client: Conveyor, ids: list[uuid.UUID]) -> None:
    deadline = time.monotonic() + 180
    while (unfinished := _unfinished(client, ids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not unfinished, f"{len(unfinished)} executions unfinished, e.g. {unfinished[:3]}"
    with client.db.transaction() as store:
        statuses = {store.execution(i).status for i in ids}
    assert statuses == {ExecutionStatus.COMPLETED}
    engine = create_engine(CHAOS_DB_URL)
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT key FROM chaos_effects")).scalars().all()
    engine.dispose()
    expected = {f"{i}:{node}" for i in ids
                for node in ["root", "join", *(f"part{p}" for p in range(FANOUT))]}  # fmt: skip
    assert set(keys) == expected and len(keys) == len(ids) * NODES
    _assert_no_permit_held()


def _unfinished(client: Conveyor, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    with client.db.transaction() as store:
        return [i for i in ids if not store.execution(i).status.finished]


def _assert_no_permit_held() -> None:
    limiter = RedisLimiter.from_url(CHAOS_REDIS)
    deadline = time.monotonic() + 20  # a killed worker's leases lapse after 3 s
    while True:
        usage = limiter.snapshot()
        if not any(u.in_use or u.waiting for u in usage):
            return
        assert time.monotonic() < deadline, usage
        time.sleep(0.2)


def during(seconds: float, action: Callable[[], None]) -> threading.Thread:
    """Run ``action`` after ``seconds`` in the background (the chaos), while work runs."""

    def later() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


@BOTH_BROKERS
def test_sigkilled_node_workers_lose_nothing(
    chaos_client: Conveyor, spawn: Spawn, chaos_broker: str, executions: int
) -> None:
    cluster = Cluster(spawn)
    ids = start_all(chaos_client, executions)

    # kill a node worker outright, pool and all, and start another
    for _ in range(4 if chaos_broker == CHAOS_REDIS else AMQP_KILLS):
        time.sleep(1.5)
        cluster.replace(cluster.nodes[0], signal.SIGKILL)

    assert_nothing_lost_nothing_twice(chaos_client, ids)


# Redis only: its RabbitMQ twin, a queue purged mid-run, is tests/acceptance/test_rabbitmq_faults.py
def test_a_flushed_broker_loses_nothing(chaos_client: Conveyor, spawn: Spawn) -> None:
    Cluster(spawn)
    ids = start_all(chaos_client)
    client = redis.Redis.from_url(CHAOS_REDIS)

    time.sleep(1.0)
    client.flushdb()  # every waiting message, reserved message and permit: gone
    client.close()

    assert_nothing_lost_nothing_twice(chaos_client, ids)


@BOTH_BROKERS
def test_every_message_delivered_twice_runs_each_node_once(
    chaos_client: Conveyor, spawn: Spawn, executions: int
) -> None:
    Cluster(spawn)
    doubled: set[uuid.UUID] = set()
    stop = threading.Event()

    def duplicate() -> None:  # a second message for every job that is queued
        while not stop.is_set():
            with chaos_client.db.transaction() as store:
                queued = store.stale_queued(store_now(), 1000)
                fresh = [
                    dispatch_of(j)
                    for j in queued
                    if j.id not in doubled and j.status is JobStatus.QUEUED
                ]
            chaos_client.dispatcher.publish(fresh)
            doubled.update(d.job_id for d in fresh)
            time.sleep(0.05)

    thread = threading.Thread(target=duplicate, daemon=True)
    thread.start()
    ids = start_all(chaos_client, executions)
    try:
        assert_nothing_lost_nothing_twice(chaos_client, ids)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert len(doubled) >= executions  # the duplicates were really sent
    engine = create_engine(CHAOS_DB_URL)
    with engine.connect() as conn:
        reruns = conn.execute(text("SELECT count(*) FROM chaos_effects WHERE runs > 1")).scalar()
    engine.dispose()
    assert reruns == 0  # a duplicate message never ran a node again


def push_raw(broker: str, queue: str, bodies: list[bytes]) -> None:
    """Put bodies that are no Celery message on the queue, as a stray producer would."""
    if broker == CHAOS_REDIS:
        client = redis.Redis.from_url(broker)
        client.lpush(queue, *bodies)
        client.close()
        return
    with Connection(broker) as connection:
        producer = Producer(connection.default_channel, routing_key=queue)  # the default exchange
        kinds = ["text/plain", "application/json", "application/json"]
        for body, kind in zip(bodies, kinds, strict=True):
            producer.publish(body, content_type=kind, content_encoding="utf-8")


def store_now() -> datetime:
    """A cutoff after now: every queued job is 'stale' for the duplicating thread."""
    return datetime.now(UTC) + timedelta(seconds=1)


@BOTH_BROKERS
def test_sigterm_restarts_lose_nothing(
    chaos_client: Conveyor, spawn: Spawn, chaos_broker: str, executions: int
) -> None:
    cluster = Cluster(spawn)
    ids = start_all(chaos_client, executions)

    # warm shutdowns, as a deploy does them: each worker exits 0, its running nodes finished
    for _ in range(3 if chaos_broker == CHAOS_REDIS else AMQP_KILLS):
        time.sleep(1.0)
        cluster.replace(cluster.nodes[0], signal.SIGTERM)

    assert_nothing_lost_nothing_twice(chaos_client, ids)


@BOTH_BROKERS
def test_malformed_messages_and_unknown_jobs_disturb_nothing(
    chaos_client: Conveyor, spawn: Spawn, chaos_broker: str, executions: int
) -> None:
    cluster = Cluster(spawn)
    ids = start_all(chaos_client, executions)

    for queue in ("workflow-node", "workflow-execution"):
        push_raw(chaos_broker, queue, [b"not json at all", b'{"body": "?"}', b"\x00\xff"])
    # Well-formed Celery messages naming no job, or not a job id, on the client's own broker
    app = cast(CeleryDispatcher, chaos_client.dispatcher).app
    for args in ([str(uuid.uuid4())], ["not-a-uuid"], [None], []):
        app.send_task("conveyor.node.run", args=args, queue="workflow-node")
    for batch in ([[str(uuid.uuid4()), "not-a-uuid", None]], ["not-a-list"], [None], []):
        app.send_task("conveyor.node.run_many", args=batch, queue="workflow-node",
                      kwargs={"hints": [{"tenant_id": "?"}, 7]})  # fmt: skip

    assert_nothing_lost_nothing_twice(chaos_client, ids)
    assert all(w.poll() is None for w in [cluster.planner, *cluster.nodes])  # none died


@pytest.mark.alone  # restarts the PostgreSQL every tier uses
def test_a_postgresql_restart_loses_nothing(chaos_client: Conveyor, spawn: Spawn) -> None:
    Cluster(spawn)
    ids = start_all(chaos_client)

    time.sleep(1.5)  # mid-run: every connection of every process is cut
    restart_postgresql()

    assert_nothing_lost_nothing_twice(chaos_client, ids)


def restart_postgresql() -> None:
    """Restart the local PostgreSQL server (the newest cluster's ``main``)."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    restarted = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr
