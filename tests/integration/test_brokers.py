"""The recovery sweep, publishing and the metrics on each broker Conveyor supports: Redis and
RabbitMQ (a vhost of the run's own). Here no worker reads the queues: what the sweep adds to a
queue stays there to be counted."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from amqp.exceptions import NotFound
from sqlalchemy import update

from conveyor import metrics, wiring
from conveyor.alerts.rules import Thresholds, evaluate
from conveyor.config import Settings
from conveyor.engine import ready, triggering
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.states import JobStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import PublishRefused
from conveyor.models import Job
from conveyor.service import Conveyor, utcnow
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.conftest import REDIS_DB, REDIS_SERVER, RUN_ID
from tests.support import rabbit, services
from tests.support.watch import CONVEYOR

BACKLOG = 10_000
VHOST = f"conveyor_test_{RUN_ID}"


@dataclass
class Broker:
    """A broker no worker reads, and a service that publishes to it."""

    url: str
    service: Conveyor
    queues: list[Any]  # the Celery app's (for the sweep to declare a missing one again)
    batch_most: int

    def holds(self) -> dict[str, int] | None:
        return metrics.broker_holds(self.url, {NODE_QUEUE: self.batch_most}, repair=self.queues)

    def messages(self, queue: str = NODE_QUEUE) -> int:
        depth = metrics.queue_depth(self.url)
        assert depth is not None
        return sum(n for (q, _), n in depth.items() if q == queue)

    def sweep(self) -> dict[str, int]:
        return self.service.recover(heartbeat_timeout=60, lost_after=60, broker_holds=self.holds)


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    with rabbit.vhost(VHOST) as url:
        yield url


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, database_url: str) -> Iterator[Broker]:
    yield from made_broker(request, database_url, request.param)


@pytest.fixture
def amqp_broker(request: pytest.FixtureRequest, database_url: str) -> Iterator[Broker]:
    yield from made_broker(request, database_url, "amqp")


def made_broker(request: pytest.FixtureRequest, database_url: str, kind: str) -> Iterator[Broker]:
    services.truncate(database_url)
    wiring.load_imports()
    if kind == "redis":
        url = f"{REDIS_SERVER}/{REDIS_DB + 4}"  # the recovery tests' db (see test_recovery)
        redis.Redis.from_url(url).flushdb()
    else:
        url = request.getfixturevalue("amqp_url")
        for queue in ("workflow-node", "workflow-execution"):
            empty(url, queue)
    app = create_app(Settings(broker_url=url))
    service = Conveyor(wiring.database(), CeleryDispatcher(app))
    yield Broker(url=url, service=service, queues=list(app.amqp.queues.values()),
                 batch_most=app.conf.conveyor_batch_most)  # fmt: skip
    if kind == "redis":
        redis.Redis.from_url(url).flushdb()


def empty(url: str, queue: str) -> None:
    """Purge a RabbitMQ queue if it is there."""
    with contextlib.suppress(NotFound):
        rabbit.on_channel(url, "queue_purge", queue)


def backlog(service: Conveyor, jobs: int, chunk: int = 1000) -> None:
    """``jobs`` one-node executions, published, then aged past ``lost_after``."""
    node = {"id": "add", "type": "python", "config": {"function": "test.sleep_add"},
            "inputs": {"a": 1, "b": 2, "seconds": 0}}  # fmt: skip
    service.apply(parse_workflow({"name": "backlog", "nodes": [node]}))
    for start in range(0, jobs, chunk):

        def make(store: Any, n: int = min(chunk, jobs - start)) -> list[Any]:
            return [
                d
                for _ in range(n)
                for d in triggering.trigger(store, workflow_name="backlog", tenant="default",
                                            input={}, now=utcnow(),
                                            source=TriggerSource.API).dispatches
            ]  # fmt: skip

        service.dispatcher.publish(service.db.run(make))
    with service.db.transaction() as store:
        store.session.execute(update(Job).values(enqueued_at=utcnow() - timedelta(minutes=5)))


def test_a_backlog_older_than_lost_after_gains_no_duplicates(broker: Broker) -> None:
    # Given 10,000 node jobs queued five minutes ago, their messages waiting in the broker
    backlog(broker.service, BACKLOG)
    before = broker.messages()
    assert before >= BACKLOG // broker.batch_most

    # When the recovery sweep runs again and again
    swept = [broker.sweep() for _ in range(3)]

    # Then it re-publishes none of them: the queue holds what it held
    assert [s["republished"] for s in swept] == [0, 0, 0]
    assert broker.messages() == before


def test_a_purged_queue_is_refilled_by_the_sweep(broker: Broker) -> None:
    backlog(broker.service, 3)
    assert broker.messages() > 0
    if broker.url.startswith("redis"):
        redis.Redis.from_url(broker.url).flushdb()
    else:
        rabbit.on_channel(broker.url, "queue_purge", NODE_QUEUE)
    assert broker.messages() == 0

    swept = broker.sweep()

    assert swept["republished"] == 3
    held = broker.holds()
    assert held is not None and held[NODE_QUEUE] >= 3 and broker.messages() > 0


def test_a_deleted_rabbitmq_queue_is_declared_again_and_refilled(amqp_broker: Broker) -> None:
    backlog(amqp_broker.service, 3)
    rabbit.on_channel(amqp_broker.url, "queue_delete", NODE_QUEUE)
    assert amqp_broker.messages() == 0  # a missing queue holds nothing

    swept = amqp_broker.sweep()

    # the sweep declared it again (as the app declares it: every priority) and re-published
    assert swept["republished"] == 3 and amqp_broker.messages() > 0


def test_a_publish_rabbitmq_refuses_raises_is_logged_and_left_to_the_sweep(
    amqp_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    service = amqp_broker.service
    backlog(service, 1)  # its publish declared the queues
    empty(amqp_broker.url, NODE_QUEUE)
    # Given a node queue that takes no message (full, and rejecting publishes)
    with rabbit.policy(VHOST, f"^{NODE_QUEUE}$", {"max-length": 0, "overflow": "reject-publish"}):
        # When a job is published: the publisher confirm is a nack, and the dispatcher raises
        with pytest.raises(PublishRefused, match="RabbitMQ did not take the message"):
            service.dispatcher.publish(made_dispatches(service))
        # and the service, which publishes after its commit, logs it and keeps the job
        with caplog.at_level(logging.ERROR):
            execution_id = service.trigger("backlog")
        assert "could not be published" in caplog.text
        assert amqp_broker.messages() == 0
    with service.db.transaction() as store:
        queued = [j for j, _ in store.execution_jobs(execution_id)]
    assert [j.status for j in queued] == [JobStatus.QUEUED]

    # Then once the queue takes messages again, the sweep publishes what was refused
    with service.db.transaction() as store:
        store.session.execute(update(Job).values(enqueued_at=utcnow() - timedelta(minutes=5)))
    swept = amqp_broker.sweep()
    assert swept["republished"] == 2 and amqp_broker.messages() > 0


def test_a_publish_on_a_connection_rabbitmq_closed_goes_out_on_a_new_one(
    amqp_broker: Broker,
) -> None:
    # Given a publisher whose pool holds a connection (its first publish opened it)
    service = amqp_broker.service
    backlog(service, 1)
    empty(amqp_broker.url, NODE_QUEUE)

    # When RabbitMQ closes every connection of the vhost (a restart, an operator), the pool's
    rabbit.rabbitmqctl("close_all_connections", "--vhost", VHOST, "integration test")
    # (gone once RabbitMQ's close handshake with the idle client times out, about 30 s)
    deadline = time.monotonic() + 90
    while rabbit.connections(VHOST):
        assert time.monotonic() < deadline, "RabbitMQ did not close the vhost's connections"
        time.sleep(0.2)

    # Then the next publish goes out on a new connection: not refused, not left to the sweep
    service.dispatcher.publish(made_dispatches(service))
    assert amqp_broker.messages() == 1


def made_dispatches(service: Conveyor) -> list[Any]:
    """The messages of every queued job, as the sweep would make them."""
    with service.db.transaction() as store:
        return [ready.dispatch_of(job) for job in store.stale_queued(utcnow(), 100)]


def test_queue_depth_metrics_stats_and_alert_read_rabbitmq(amqp_broker: Broker) -> None:
    # Given 20 node jobs waiting in RabbitMQ, one message each
    backlog(amqp_broker.service, 0)
    service = amqp_broker.service
    for _ in range(20):
        service.trigger("backlog")
    snap = metrics.take(service.db, amqp_broker.url, None)

    # Then the metric, the alert and conveyor stats see them
    assert snap.queue_depth is not None and snap.queue_depth[(NODE_QUEUE, "all")] == 20
    scraped = {
        (m.name, tuple(s.labels.values())): s.value
        for m in metrics.metric_families(snap)
        for s in m.samples
    }
    assert scraped[("conveyor_queue_depth", (NODE_QUEUE, "all"))] == 20
    changes, firing = evaluate(snap, None, set(), Thresholds(queue_depth=10))
    assert "queue_depth" in firing and "20 messages" in changes[0].message
    env = {**os.environ, "CONVEYOR_BROKER_URL": amqp_broker.url}
    shown = subprocess.run([CONVEYOR, "stats", "--json"], env=env, text=True,
                           capture_output=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert {"queue": NODE_QUEUE, "priority": "all", "messages": 20} in json.loads(shown.stdout)[
        "queue_depth"
    ]
