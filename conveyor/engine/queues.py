"""The four queues, each served by its own worker pool and scaled on its own."""

from __future__ import annotations

from collections.abc import Mapping

from conveyor.engine.states import JobKind

EXECUTION_QUEUE = "workflow-execution"  # start an execution, plan its nodes
NODE_QUEUE = "workflow-node"  # run one node
SCHEDULED_QUEUE = "workflow-scheduled"  # the cron check and periodic maintenance
WEBHOOK_QUEUE = "workflow-webhook"  # turn a received webhook into executions

ALL_QUEUES = (EXECUTION_QUEUE, NODE_QUEUE, SCHEDULED_QUEUE, WEBHOOK_QUEUE)

QUEUE_FOR_KIND = {
    JobKind.EXECUTION: EXECUTION_QUEUE,
    JobKind.NODE: NODE_QUEUE,
    JobKind.WEBHOOK: WEBHOOK_QUEUE,
}


def may_hold(held: Mapping[str, int] | None, queue: str, jobs: int) -> bool:
    """Whether ``queue``'s waiting messages may still name ``jobs`` jobs taken for lost
    (``held``: at most how many jobs each queue's messages name, None when the broker cannot
    tell). While they may, their messages are taken to be waiting, not lost: re-sending them
    would only queue duplicates behind the originals."""
    return held is not None and held.get(queue, 0) >= jobs


def jobs_held(
    depth: Mapping[tuple[str, str], int], jobs_per_message: Mapping[str, int] | None = None
) -> dict[str, int]:
    """At most how many jobs each queue's waiting messages name: its messages (``depth``, per
    (queue, priority label), summed over the labels) times the most jobs one message of that
    queue carries (``jobs_per_message``, 1 if not named: a batch message names up to
    ``CONVEYOR_BATCH_MOST`` node jobs)."""
    per = jobs_per_message or {}
    held: dict[str, int] = {}
    for (queue, _), n in depth.items():
        held[queue] = held.get(queue, 0) + n * per.get(queue, 1)
    return held
