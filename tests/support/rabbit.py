"""RabbitMQ for the tests: a vhost of the run's own (its queues shared with no other run),
made and deleted with ``rabbitmqctl`` on this machine's broker (``CONVEYOR_TEST_AMQP``, default
amqp://guest:guest@127.0.0.1:5672). A broker that is down fails the test, as any service."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu import Connection

from conveyor.engine.queues import ALL_QUEUES

AMQP_SERVER = os.environ.get("CONVEYOR_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")


def rabbitmqctl(*args: str) -> None:
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}"


@contextmanager
def vhost(name: str) -> Iterator[str]:
    """A new vhost that guest may use, deleted after (its queues with it); its URL."""
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"{AMQP_SERVER}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


@contextmanager
def policy(vhost_name: str, pattern: str, definition: dict[str, Any]) -> Iterator[None]:
    """A policy on the vhost's queues matching ``pattern`` for the block's length."""
    rabbitmqctl("set_policy", "-p", vhost_name, "--apply-to", "queues", "conveyor-test",
                pattern, json.dumps(definition))  # fmt: skip
    try:
        yield
    finally:
        rabbitmqctl("clear_policy", "-p", vhost_name, "conveyor-test")


def on_channel(url: str, method: str, queue: str) -> Any:
    """Call a channel method on a queue (``queue_purge``, ``queue_delete``): what an operator
    does by hand."""
    with Connection(url) as connection:
        return getattr(connection.default_channel, method)(queue=queue)


def purge(url: str) -> None:
    """Empty Conveyor's queues on the vhost, those that are there."""
    with Connection(url) as connection:
        for queue in ALL_QUEUES:
            channel = connection.channel()
            try:
                channel.queue_purge(queue=queue)
            except connection.channel_errors:  # NOT_FOUND (which closes the channel)
                continue
            channel.close()


def ready(url: str, queue: str) -> int:
    """The queue's ready messages (0 when it is missing)."""
    with Connection(url) as connection:
        try:
            return int(connection.default_channel.queue_declare(queue=queue, passive=True)[1])
        except connection.channel_errors:
            return 0


def connections(vhost_name: str) -> int:
    """How many client connections the vhost has now."""
    done = subprocess.run(["rabbitmqctl", "-q", "list_connections", "vhost"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return sum(1 for line in done.stdout.splitlines() if line.strip() == vhost_name)
