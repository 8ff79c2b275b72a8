"""A map node's items in memory (part of :class:`~conveyor.testing.InMemoryStore`), as
:mod:`conveyor.store.map_items` stores them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import (
    ERROR_SLOT,
    ExecutionRecord,
    ItemRow,
    ItemsLeft,
    JobRecord,
    NewItem,
)
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
        held = None if named is None else self._item_at(job.execution_id, node_id, int(named))
        released = None
        if held is not None and held.status is JobStatus.HELD:
            released = self._named(self._set_job(held, status=JobStatus.QUEUED, enqueued_at=now))
        return ItemsLeft(left=left, failed=failures, released=released)

    def map_runs(self, execution_id: uuid.UUID, node_id: str) -> bool:
        node = self.tables.node_states.get((execution_id, node_id))
        return node is not None and node.status is NodeStatus.RUNNING

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
        node = self.tables.node_states.get((execution_id, node_id))
        total = node.items_total if node is not None else None
        return [
            ItemRow(index=j.item_index, status=j.status, output=j.output, error=j.last_error)
            for j in self._items(execution_id, node_id)
            if j.item_index is not None and total is not None and j.item_index < total
        ]

    def renew_items(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> dict[int, uuid.UUID]:
        wanted = {i.index: i for i in items}
        renewed: dict[int, uuid.UUID] = {}
        for job in self._items(execution.id, node_id):
            if (item := wanted.get(job.item_index or 0)) is None:
                continue
            tried = sum(1 for job_id, _ in self.tables.attempts if job_id == job.id)
            self._set_job(
                job, status=JobStatus.HELD if item.held else JobStatus.QUEUED,
                item=stored(item.item), data=stored(item.data), output=None, last_error=None,
                completed_at=None, next_run_at=None, retry_count=0, tries_before=tried,
                max_retries=max_retries, priority=execution.priority, enqueued_at=now,
            )  # fmt: skip
            renewed[item.index] = job.id
        return renewed

    def retire_items(
        self, execution_id: uuid.UUID, node_id: str, total: int, now: datetime, error: str
    ) -> None:
        for job in self._items(execution_id, node_id):
            if (job.item_index or 0) >= total:
                self._set_job(
                    job, status=JobStatus.CANCELLED, completed_at=now, output=None,
                    last_error=error,
                )  # fmt: skip

    def items_size(self, execution_id: uuid.UUID, node_id: str) -> int:
        rows = self.item_outputs(execution_id, node_id)
        slots = (
            len(ERROR_SLOT) + len(r.error or "") if r.failed else len(json.dumps(r.output))
            for r in rows
        )
        return sum(slot + len(", ") for slot in slots)

    def _item_at(self, execution_id: uuid.UUID, node_id: str, index: int) -> JobRow | None:
        """The map's item job at ``index`` (the map's key)."""
        return next((j for j in self._items(execution_id, node_id) if j.item_index == index), None)

    def _items(self, execution_id: uuid.UUID, node_id: str) -> list[JobRow]:
        """The map's item jobs, in index order."""
        found = [
            j
            for j in self.tables.jobs.values()
            if (j.execution_id, j.node_id) == (execution_id, node_id) and j.item_index is not None
        ]
        return sorted(found, key=lambda j: j.item_index or 0)
