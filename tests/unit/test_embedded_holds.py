"""What the embedded default's recovery sweep takes the in-process broker to hold: the jobs its
messages name, per queue, so that jobs merely waiting there for a worker thread are not re-sent
as lost (the in-process broker is kombu's memory transport; no service is needed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu.transport.memory import Channel

from conveyor.config import Settings
from conveyor.embedded import memory_holds
from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher


@pytest.fixture
def in_process() -> Iterator[CeleryDispatcher]:
    Channel.queues.clear()  # the memory transport's queues are the process's
    yield CeleryDispatcher(create_app(Settings(broker_url="memory://localhost/")))
    Channel.queues.clear()


def dispatch(kind: JobKind, queue: str, priority: Priority) -> Dispatch:
    return Dispatch(job_id=uuid.uuid4(), kind=kind, queue=queue, priority=priority, label="t")


def test_the_in_process_broker_holds_the_jobs_its_waiting_messages_name_per_queue(
    in_process: CeleryDispatcher,
) -> None:
    assert memory_holds({NODE_QUEUE: 8}) == {}  # nothing sent: a job queued long is lost

    nodes = [dispatch(JobKind.NODE, NODE_QUEUE, p) for p in (Priority.HIGH, Priority.LOW)]
    in_process.publish(nodes, batch=False)
    in_process.publish([dispatch(JobKind.EXECUTION, EXECUTION_QUEUE, Priority.NORMAL)])

    # a node message may name up to CONVEYOR_BATCH_MOST jobs, whatever its priority
    assert memory_holds({NODE_QUEUE: 8}) == {NODE_QUEUE: 16, EXECUTION_QUEUE: 1}
