"""The four queues, each served by its own worker pool and scaled on its own."""

from __future__ import annotations

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
