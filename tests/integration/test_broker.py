"""Conveyor's Redis transport against real Redis: messages published through it arrive, and
publishing does not build a redis-py client per message (kombu's own transport does, for
every publish, task event and ack)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from kombu.common import ignore_errors

from conveyor.config import Settings
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher
from conveyor.tasks.transport import GuardedTransport
from tests.conftest import REDIS_URL

QUEUE = "test-broker-only"  # no worker serves it


def test_publishing_keeps_one_redis_client_and_every_message_arrives(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(Settings(database_url=database_url, broker_url=REDIS_URL))
    assert app.conf.broker_transport == "conveyor.tasks.transport:GuardedTransport"
    dispatches = [
        Dispatch(job_id=uuid.uuid4(), kind=JobKind.NODE, queue=QUEUE, priority=Priority.NORMAL)
        for _ in range(30)
    ]
    made: list[Any] = []
    init = redis.Redis.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counted)
    try:
        CeleryDispatcher(app).publish(dispatches)
        CeleryDispatcher(app).publish(dispatches[:1])
    finally:
        monkeypatch.undo()  # (the connection pool is kombu's, shared with the session's app)

    assert len(made) <= 2, len(made)  # one kept per pool (kombu's makes two per message)
    client = redis.Redis.from_url(REDIS_URL)
    keys = [QUEUE, *(f"{QUEUE}:{step}" for step in range(1, 10))]
    try:
        assert sum(client.llen(key) for key in keys) == 31
    finally:
        client.delete(*keys)
        client.close()


def test_a_channel_left_open_by_a_lost_broker_closes_without_killing_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's consumer, its broker lost, collects the connection and then closes it. When a
    read on the dead socket cut the channel's first close short, the second one ran on a
    transport already collected: kombu's channel, to give back its unacked message, built a
    connection pool from that transport's settings, gone, and the AttributeError it raised
    (not a connection error, which the clean-up ignores) stopped the worker for good. Seen in
    the chaos outage test: the planning worker dead, 220 executions never finished."""
    conn = Connection(REDIS_URL, transport=GuardedTransport)
    channel = conn.default_channel
    producer = conn.Producer(channel)
    producer.publish({"job": "x"}, routing_key=QUEUE, declare=[Queue(QUEUE)])
    message = channel.basic_get(QUEUE, no_ack=False)  # delivered, not acked
    assert message is not None
    close = type(channel).close
    cut_short = redis.ConnectionError("Connection reset by peer")

    def dead_socket(self: Any) -> None:
        raise cut_short

    monkeypatch.setattr(type(channel), "close", dead_socket)
    conn.collect()  # what Celery does first: every close of the channel cut short
    monkeypatch.setattr(type(channel), "close", close)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        # Celery's next step, which lets connection errors pass and nothing else
        ignore_errors(conn, conn.close)
        # and the message is not lost: the visibility timeout gives it back
        assert client.hexists(channel.unacked_key, message.delivery_tag)
    finally:
        client.delete(QUEUE, *(f"{QUEUE}:{step}" for step in range(1, 10)))
        client.hdel(channel.unacked_key, message.delivery_tag)  # left for the visibility
        client.zrem(channel.unacked_index_key, message.delivery_tag)  # timeout: not here
        client.close()
