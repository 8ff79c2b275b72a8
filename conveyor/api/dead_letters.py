"""``/v1/dead-letters``: the tenant's dead-lettered node jobs, and their repair."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from conveyor import views
from conveyor.api.deps import ServiceDep, TenantDep
from conveyor.api.rest import router as rest_router
from conveyor.api.schemas import JobIds, Outcomes, RequeueBody
from conveyor.exceptions import NotFound
from conveyor.store.dead_letters import DeadLetterFilter

router = APIRouter(
    prefix="/v1/dead-letters", tags=["dead letters"], responses=rest_router.responses
)


@router.get("")
def list_dead_letters(
    service: ServiceDep,
    tenant: TenantDep,
    workflow: str | None = None,
    node: str | None = None,
    error: Annotated[str | None, Query(max_length=200, description="In the last error.")] = None,
    older_than: Annotated[float | None, Query(ge=0, le=87_600, description="Hours.")] = None,
    archived: Annotated[bool, Query(description="The discarded ones instead.")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[views.DeadLetterJson]:
    """The tenant's dead letters, the most recent first."""
    before = datetime.now(UTC) - timedelta(hours=older_than) if older_than is not None else None
    where = DeadLetterFilter(
        tenant_id=tenant.id, workflow=workflow, node=node, error=error, before=before,
        discarded=archived,
    )  # fmt: skip
    with service.db.transaction() as store:
        return [views.dead_letter_json(*row) for row in store.dead_letter_rows(where, limit)]


@router.get("/{job_id}")
def show_dead_letter(
    job_id: uuid.UUID, service: ServiceDep, tenant: TenantDep
) -> views.DeadLetterDetailJson:
    """One dead letter with every try it made."""
    with service.db.transaction() as store:
        if store.dead_letter(job_id, tenant.id) is None:
            raise NotFound(f"no dead letter has id {job_id}")
        return views.dead_letter_view(store, job_id)


@router.post("/requeue")
def requeue(body: RequeueBody, service: ServiceDep, tenant: TenantDep) -> Outcomes:
    """Resume each dead letter's execution from it, with a fresh set of tries (with
    `run_at` or `delay`, then: its jobs wait until then)."""
    return _outcomes(
        service.requeue_dead_letters(body.job_ids, tenant.id, run_at=body.run_at, delay=body.delay)
    )


@router.post("/discard")
def discard(body: JobIds, service: ServiceDep, tenant: TenantDep) -> Outcomes:
    """Move dead letters to the archive (`?archived=true`); their executions stay failed."""
    return _outcomes(service.discard_dead_letters(body.job_ids, tenant.id))


def _outcomes(results: dict[uuid.UUID, str | None]) -> Outcomes:
    return Outcomes(
        done=[job_id for job_id, refused in results.items() if refused is None],
        refused={str(job_id): refused for job_id, refused in results.items() if refused},
    )
