"""Conveyor's Redis transport against real Redis: messages published through it arrive, and
publishing does not build a redis-py client per message (kombu's own transport does, for
every publish, task event and ack)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from conveyor.config import Settings
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher
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
