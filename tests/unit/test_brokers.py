"""Which broker adapter reads what a broker holds, and what the Celery app asks of RabbitMQ."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from datetime import UTC, datetime

from rich.console import Console

from conveyor.brokers import AmqpQueues, RedisQueues, queues_of
from conveyor.cli.stats import view
from conveyor.config import Settings
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority
from conveyor.metrics import BOUNDS, Histogram, Snapshot
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CONFIRM_TIMEOUT, CeleryDispatcher


def test_redis_and_rabbitmq_urls_get_their_adapter_and_the_memory_broker_none() -> None:
    assert isinstance(queues_of("redis://127.0.0.1:6379/0"), RedisQueues)
    assert isinstance(queues_of("rediss://example:6380/0"), RedisQueues)
    for url in ("amqp://guest:guest@127.0.0.1:5672//", "amqps://h/v", "pyamqp://h//"):
        assert isinstance(queues_of(url), AmqpQueues)
    assert queues_of("memory://localhost/") is None


def test_publishes_to_rabbitmq_wait_for_the_broker_s_confirm_and_redis_ones_do_not() -> None:
    amqp = create_app(Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//"))
    redis = create_app(Settings(broker_url="redis://127.0.0.1:6379/0"))

    # the dispatcher's own connections confirm; the app's (Celery's task events, beat) do not
    confirmed = CeleryDispatcher(amqp)._confirmed
    assert confirmed is not None and confirmed.transport_options["confirm_publish"] is True
    assert "confirm_publish" not in amqp.conf.broker_transport_options
    assert "confirm_publish" not in redis.conf.broker_transport_options
    assert CeleryDispatcher(amqp)._confirm and not CeleryDispatcher(redis)._confirm
    assert CeleryDispatcher(redis)._confirmed is None


def test_a_publish_rabbitmq_refuses_is_tried_once_not_sent_again_by_kombu() -> None:
    # (kombu's retries count a nack and a confirm's timeout as recoverable: each retry would
    # send the message again, and make the caller wait for another timeout)
    app = create_app(Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//"))
    sent: list[dict[str, object]] = []
    app.send_task = lambda *a, **kw: sent.append(kw)  # type: ignore[method-assign]
    dispatcher = CeleryDispatcher(app)
    dispatcher._producer = lambda: nullcontext(None)  # type: ignore[method-assign]

    dispatcher.publish(
        [
            Dispatch(
                job_id=uuid.uuid4(),
                kind=JobKind.EXECUTION,
                queue="workflow-execution",
                priority=Priority.NORMAL,
            )
        ]
    )

    assert [(kw["retry"], kw["confirm_timeout"]) for kw in sent] == [(False, CONFIRM_TIMEOUT)]


def test_every_rabbitmq_queue_holds_every_priority() -> None:
    # one queue per name, declared with x-max-priority: the depth has one count a queue
    app = create_app(Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//"))
    arguments = {q.name: q.queue_arguments for q in app.amqp.queues.values()}
    assert arguments and all(a == {"x-max-priority": 10} for a in arguments.values())


def test_conveyor_stats_shows_a_column_per_priority_on_redis_and_one_on_rabbitmq() -> None:
    empty = Histogram(buckets=[0] * len(BOUNDS), total=0.0, count=0)

    def shown(depth: dict[tuple[str, str], int]) -> str:
        snap = Snapshot(taken_at=datetime.now(UTC), queue_depth=depth, jobs={}, executions={},
                        attempts={}, wait=empty, run=empty)  # fmt: skip
        console = Console(record=True, width=120)
        console.print(view(snap, None))
        return console.export_text()

    amqp = shown({("workflow-node", "all"): 20})
    redis = shown({("workflow-node", p): n for p, n in (("high", 1), ("normal", 2), ("low", 3))})

    assert "all" in amqp and "20" in amqp and "normal" not in amqp
    assert all(word in redis for word in ("high", "normal", "low")) and " all " not in redis
