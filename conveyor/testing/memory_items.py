"""A map node's items in memory (part of :class:`~conveyor.testing.InMemoryStore`), as
:mod:`conveyor.store.map_items` stores them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import ExecutionRecord, ItemRow, ItemsLeft, JobRecord, NewItem
from conveyor.engine.states import ACTIVE_EXECUTION, AttemptStatus, JobKind, JobStatus, NodeStatus
from conveyor.testing.memory_jobs import MemoryJobs
from conveyor.testing.tables import JobRow, stored


class MemoryMapItems(MemoryJobs):
    """A map's items: jobs of its node with an index, counted down on its node's state."""

    def add_item_jobs(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> None:
        for item in items:
            self._add_job(
                execution, item.id, now, kind=JobKind.NODE, queue=NODE_QUEUE,
                status=JobStatus.HELD if item.held else JobStatus.QUEUED,
                max_retries=max_retries, node_id=node_id, item_index=item.index,
                item=stored(item.item), data=item.data,
            )  # fmt: skip

    def open_map(self, execution_id: uuid.UUID, node_id: str, total: int) -> None:
        if (node := self.tables.node_states.get((execution_id, node_id))) is not None:
            self._set_node(node, items_total=total, items_left=total, items_failed=0)

    def complete_item(self, job: JobRecord, output: Any, now: datetime, duration: float) -> bool:
        row = self.tables.jobs.get(job.id)
        execution = self._execution_row(job.execution_id)
        if (
            row is None
            or row.status is not JobStatus.PROCESSING
            or row.try_number != job.try_number
            or execution is None
            or execution.status not in ACTIVE_EXECUTION
        ):
            return False
        self._set_job(
            row, status=JobStatus.COMPLETED, completed_at=now, last_error=None,
            output=stored(output),
        )  # fmt: skip
        self.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
        return True

    def complete_item_alone(
        self, job: JobRecord, node_id: str, output: Any, now: datetime, duration: float
    ) -> ItemsLeft | None:
        node = self.tables.node_states.get((job.execution_id, node_id))
        if node is None or node.status is not NodeStatus.RUNNING or (node.items_left or 0) <= 1:
            return None
        if not self.complete_item(job, output, now, duration):
            return None
        return self.settle_item(job, node_id, False, now)

    def settle_item(
        self, job: JobRecord, node_id: str, failed: bool, now: datetime
    ) -> ItemsLeft | None:
        node = self.tables.node_states.get((job.execution_id, node_id))
        if (
            node is None
            or node.status is not NodeStatus.RUNNING
            or node.items_left is None
            or node.items_left <= 0
        ):
            return None
        left, failures = node.items_left - 1, (node.items_failed or 0) + (1 if failed else 0)
        self._set_node(node, items_left=left, items_failed=failures)
        settled = self.tables.jobs.get(job.id)
        named = (settled.data or {}).get("releases") if settled is not None else None
        held = self.tables.jobs.get(uuid.UUID(named)) if named else None
        released = None
        if held is not None and held.status is JobStatus.HELD:
            released = self._named(self._set_job(held, status=JobStatus.QUEUED, enqueued_at=now))
        return ItemsLeft(left=left, failed=failures, released=released)

    def close_map(
        self, execution_id: uuid.UUID, node_id: str, now: datetime, error: str
    ) -> list[uuid.UUID] | None:
        node = self.tables.node_states.get((execution_id, node_id))
        if node is None or node.status is not NodeStatus.RUNNING or node.items_total is None:
            return None
        self._set_node(node, status=NodeStatus.FAILED, error=error, finished_at=now)
        return self._cancel_jobs(
            lambda j: (j.execution_id, j.node_id) == (execution_id, node_id), now
        )

    def item_outputs(self, execution_id: uuid.UUID, node_id: str) -> list[ItemRow]:
        return [
            ItemRow(index=j.item_index, status=j.status, output=j.output, error=j.last_error)
            for j in self._items(execution_id, node_id)
            if j.item_index is not None
        ]

    def _items(self, execution_id: uuid.UUID, node_id: str) -> list[JobRow]:
        """The map's item jobs, in index order."""
        found = [
            j
            for j in self.tables.jobs.values()
            if (j.execution_id, j.node_id) == (execution_id, node_id) and j.item_index is not None
        ]
        return sorted(found, key=lambda j: j.item_index or 0)
