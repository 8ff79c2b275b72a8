"""Reruns in memory (part of :class:`~conveyor.testing.InMemoryStore`): the record of who
re-ran an execution from which node, the held jobs of the nodes that run again, and the input
a rerun gave its node."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from conveyor.engine.records import ExecutionRecord, NewJob
from conveyor.engine.states import ACTIVE_EXECUTION, JobKind, JobStatus, NodeStatus
from conveyor.testing.memory_jobs import MemoryDeadLetters
from conveyor.testing.tables import RerunRow, stored

# A job whose try is over: a rerun may hold it (one in flight is left alone).
_HOLDABLE = frozenset(
    {
        JobStatus.COMPLETED,
        JobStatus.DEAD_LETTER,
        JobStatus.DISCARDED,
        JobStatus.CANCELLED,
        JobStatus.HELD,
    }
)


class MemoryReruns(MemoryDeadLetters):
    """Reruns: recorded, their nodes' jobs held until ready, their input read at claim."""

    def dedupe_holder(self, execution_id: uuid.UUID) -> uuid.UUID | None:
        row = self._execution_row(execution_id)
        if row is None or row.dedupe_key is None:
            return None
        return next(
            (e.id for e in self.tables.executions.values()
             if e.id != execution_id and e.tenant_id == row.tenant_id
             and e.dedupe_key == row.dedupe_key and e.status in ACTIVE_EXECUTION),
            None,
        )  # fmt: skip

    def add_rerun(
        self,
        execution_id: uuid.UUID,
        from_node: str,
        input: dict[str, Any] | None,
        requested_by: str,
        now: datetime,
    ) -> None:
        number = max(self.tables.reruns, default=0) + 1
        self.tables.reruns[number] = RerunRow(
            id=number, execution_id=execution_id, from_node=from_node, input=stored(input),
            requested_by=requested_by, requested_at=now,
        )  # fmt: skip
        if (row := self._execution_row(execution_id)) is not None:
            self._set_execution(row, reruns=row.reruns + 1)

    def rerun_input(self, execution_id: uuid.UUID, node_id: str) -> dict[str, Any] | None:
        mine = [r for r in self.tables.reruns.values() if r.execution_id == execution_id]
        latest = max(mine, key=lambda r: r.id, default=None)
        if latest is None or latest.from_node != node_id:
            return None
        return stored(latest.input)  # type: ignore[no-any-return]

    def hold_jobs(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        for job in list(self.tables.jobs.values()):
            if (
                job.execution_id == execution_id
                and job.kind is JobKind.NODE
                and job.node_id in node_ids
                and job.status in _HOLDABLE
            ):
                tried = sum(1 for job_id, _ in self.tables.attempts if job_id == job.id)
                self._set_job(
                    job, status=JobStatus.HELD, tries_before=tried, retry_count=0,
                    next_run_at=None, completed_at=None, last_error=None, output=None,
                )  # fmt: skip

    def items_in_flight(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> list[str]:
        return sorted(
            {
                job.node_id
                for job in self.tables.jobs.values()
                if job.execution_id == execution_id
                and job.node_id is not None
                and job.node_id in node_ids
                and job.item_index is not None
                and job.status not in _HOLDABLE
            }
        )

    def reset_nodes(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        for node_id in node_ids:
            if (node := self.tables.node_states.get((execution_id, node_id))) is not None:
                self._set_node(
                    node, status=NodeStatus.PENDING, output=None, branch=None, error=None,
                    started_at=None, finished_at=None, items_total=None, items_left=None,
                    items_failed=None,
                )  # fmt: skip

    def take_held_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> dict[str, uuid.UUID]:
        wanted = {j.node_id: j for j in jobs}
        taken: dict[str, uuid.UUID] = {}
        for job in list(self.tables.jobs.values()):
            if (
                job.execution_id != execution.id
                or job.status is not JobStatus.HELD
                or job.node_id not in wanted
                or job.item_index is not None  # a map's held item is not a node's own job
            ):
                continue
            new = wanted[job.node_id]
            self._set_job(
                job, status=JobStatus.SCHEDULED if new.next_run_at else JobStatus.QUEUED,
                next_run_at=new.next_run_at, max_retries=new.max_retries,
                priority=execution.priority, enqueued_at=now,
            )  # fmt: skip
            taken[job.node_id] = job.id
        return taken
