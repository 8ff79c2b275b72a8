"""What operators call on dead letters (requeue: the execution resumes; or discard), and on
finished executions (rerun from a node)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from conveyor.engine import (
    dead_letters,
    later,
    reruns,
)
from conveyor.engine.records import Dispatch
from conveyor.exceptions import (
    ConveyorError,
)
from conveyor.service.base import ServiceBase, utcnow
from conveyor.store import SqlStore


class Operators(ServiceBase):
    """Repairs, one transaction a job."""

    def requeue_dead_letters(
        self,
        job_ids: Sequence[uuid.UUID],
        tenant_id: uuid.UUID | None = None,
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
    ) -> dict[uuid.UUID, str | None]:
        """Resume each dead letter's execution from it (see :mod:`engine.dead_letters`), each
        in its own transaction; for each id, None when done or why it was refused. With
        ``run_at`` (aware) or ``delay`` (seconds) the resumed jobs wait until then
        (:class:`~conveyor.exceptions.StartTimeError`, raised before any, for a bad time)."""
        begins = later.start_time(utcnow(), run_at=run_at, delay=delay)
        return self._each(
            job_ids,
            lambda s, job_id: dead_letters.requeue(s, job_id, tenant_id, utcnow(), begins),
        )

    def discard_dead_letters(
        self, job_ids: Sequence[uuid.UUID], tenant_id: uuid.UUID | None = None
    ) -> dict[uuid.UUID, str | None]:
        """Move dead letters to the archive; for each id, None when done or why not."""

        def discard(store: SqlStore, job_id: uuid.UUID) -> list[Dispatch]:
            dead_letters.discard(store, job_id, tenant_id, utcnow())
            return []

        return self._each(job_ids, discard)

    def rerun(
        self,
        execution_id: uuid.UUID,
        from_node: str,
        *,
        requested_by: str,
        input: dict[str, Any] | None = None,
        tenant_id: uuid.UUID | None = None,
    ) -> reruns.Rerun:
        """Run a finished execution again from ``from_node`` (see :mod:`engine.reruns`), in
        one transaction; what became ready is published once it is committed. ``input``:
        given to that node in place of its rendered inputs; ``requested_by``: who asked (an
        API key's name, or ``cli:<os user>``), recorded with the rerun."""
        done = self.db.run(
            lambda s: reruns.rerun(
                s, execution_id, from_node, requested_by=requested_by, now=utcnow(),
                input=input, tenant_id=tenant_id,
            )
        )  # fmt: skip
        self._publish_now(done.dispatches, f"the rerun of execution {execution_id}")
        return done

    def _each(
        self,
        job_ids: Sequence[uuid.UUID],
        work: Callable[[SqlStore, uuid.UUID], list[Dispatch]],
    ) -> dict[uuid.UUID, str | None]:
        outcomes: dict[uuid.UUID, str | None] = {}
        for job_id in dict.fromkeys(job_ids):
            try:
                dispatches = self.db.run(lambda s, job_id=job_id: work(s, job_id))  # type: ignore[misc]
            except ConveyorError as exc:
                outcomes[job_id] = str(exc)
                continue
            self._publish(dispatches)
            outcomes[job_id] = None
        return outcomes
