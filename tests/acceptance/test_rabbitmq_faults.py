"""RabbitMQ's own faults, with real `celery worker` and beat processes on a vhost of the run's
own: the broker restarted, a queue purged, the workers' connections closed mid-task (their
unacknowledged messages redelivered). Each time every execution completes and every node's
effect is written once. None of them touches PostgreSQL's process.

The restart stops the whole RabbitMQ application (``rabbitmqctl stop_app``): nothing else on
the machine may use it meanwhile (the acceptance tier runs one test at a time)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, ACCEPTANCE_VHOST, await_ready
from tests.support import rabbit
from tests.support.services import effects, wait_for

pytestmark = pytest.mark.parametrize("acceptance_broker", ["amqp"], indirect=True)

StartWorker = Callable[..., Popen[str]]
RUNS = 8
# beat sends the recovery sweep every second; a job queued 3 s is looked for in the broker
SWEEPING = {"CONVEYOR_RECOVER_INTERVAL": "1", "CONVEYOR_LOST_AFTER": "3"}


def chain(client: Conveyor, seconds: float, hold: Path | None = None) -> None:
    """A workflow of three nodes one after another, each writing its effect; with ``hold``,
    the first runs until a file is there."""

    def node(name: str, needs: list[str]) -> dict[str, Any]:
        if name == "a" and hold is not None:
            return {"id": name, "type": "python", "config": {"function": "test.wait_for_file"},
                    "inputs": {"path": str(hold)}}  # fmt: skip
        return {"id": name, "type": "python", "config": {"function": "test.sleep_add"},
                "inputs": {"a": 1, "b": 1, "seconds": seconds}, "needs": needs}  # fmt: skip

    nodes = [node(name, needs) for name, needs in (("a", []), ("b", ["a"]), ("c", ["b"]))]
    client.apply(parse_workflow({"name": "chain", "nodes": nodes}))


def workers(start_worker: StartWorker, start_beat: Callable[..., Popen[str]]) -> None:
    await_ready(
        start_worker("workflow-execution", concurrency=2, name="exec", env=SWEEPING, wait=False),
        start_worker("workflow-node", concurrency=4, name="node", env=SWEEPING, wait=False),
        start_worker("workflow-scheduled", concurrency=1, name="sched", env=SWEEPING, wait=False),
        start_beat(env=SWEEPING, wait=False),
    )


def all_done_once(client: Conveyor, ids: list[uuid.UUID], timeout: float = 90) -> None:
    """Every execution completed, and every node's effect was written once."""
    deadline = time.monotonic() + timeout
    for execution_id in ids:
        row = wait_for(client, execution_id, timeout=max(1.0, deadline - time.monotonic()))
        assert row.status is ExecutionStatus.COMPLETED, row.error
    written = Counter((e["idempotency_key"], e["node_id"]) for e in effects(ACCEPTANCE_DB_URL))
    assert len(written) == len(ids) * 3 and set(written.values()) == {1}, written


@pytest.mark.alone  # stops the whole RabbitMQ application every vhost uses
def test_a_rabbitmq_restart_loses_nothing(
    client: Conveyor,
    start_worker: StartWorker,
    start_beat: Callable[..., Popen[str]],
    tmp_path: Path,
) -> None:
    # Given four first nodes running (until a file is there) and four more waiting in RabbitMQ
    workers(start_worker, start_beat)
    hold = tmp_path / "go"
    chain(client, 0.05, hold=hold)
    ids = [client.trigger("chain") for _ in range(RUNS)]
    wait_running(client, 4)

    # When RabbitMQ stops and starts again (its queues durable, as declared), then the nodes
    # finish
    rabbit.rabbitmqctl("stop_app")
    try:
        time.sleep(1)
    finally:
        rabbit.rabbitmqctl("start_app")
        rabbit.rabbitmqctl("await_startup")
    hold.touch()

    # Then the workers reconnect and everything completes, each node once
    all_done_once(client, ids)


def test_a_purged_node_queue_loses_nothing(
    client: Conveyor, start_worker: StartWorker, start_beat: Callable[..., Popen[str]]
) -> None:
    # Given a backlog of node jobs waiting in RabbitMQ (one slow node worker)
    await_ready(
        start_worker("workflow-execution", concurrency=2, name="exec", env=SWEEPING, wait=False),
        start_worker("workflow-scheduled", concurrency=1, name="sched", env=SWEEPING, wait=False),
        start_beat(env=SWEEPING, wait=False),
    )
    chain(client, 0.05)
    ids = [client.trigger("chain") for _ in range(RUNS)]
    deadline = time.monotonic() + 30
    while rabbit.ready(client_url(client), NODE_QUEUE) == 0:
        assert time.monotonic() < deadline, "no node message reached RabbitMQ"
        time.sleep(0.05)

    # When an operator purges the node queue, then node workers start
    rabbit.on_channel(client_url(client), "queue_purge", NODE_QUEUE)
    start_worker("workflow-node", concurrency=4, name="node", env=SWEEPING)

    # Then the recovery sweep re-publishes what was purged and everything completes, once
    all_done_once(client, ids)


def test_connections_closed_mid_task_redeliver_their_messages_and_run_each_node_once(
    client: Conveyor,
    start_worker: StartWorker,
    start_beat: Callable[..., Popen[str]],
    tmp_path: Path,
) -> None:
    # Given four node worker processes each running a first node (until a file is there),
    # their messages unacknowledged
    workers(start_worker, start_beat)
    hold = tmp_path / "go"
    chain(client, 0.05, hold=hold)
    ids = [client.trigger("chain") for _ in range(4)]
    wait_running(client, 4)

    # When RabbitMQ closes every connection of the vhost (the workers' channels with them)
    # while the nodes run, and they finish after
    rabbit.rabbitmqctl("close_all_connections", "--vhost", ACCEPTANCE_VHOST, "acceptance test")
    with client.db.transaction() as store:
        assert store.job_counts().get(("node", "processing"), 0) == 4
    hold.touch()

    # Then the unacknowledged messages come back, and the nodes run once each, to the end
    all_done_once(client, ids)


def wait_running(client: Conveyor, count: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        with client.db.transaction() as store:
            if store.job_counts().get(("node", "processing"), 0) >= count:
                return
        assert time.monotonic() < deadline, "no node started"
        time.sleep(0.05)


def client_url(client: Conveyor) -> str:
    return str(client.dispatcher.app.conf.broker_url)  # type: ignore[attr-defined]
