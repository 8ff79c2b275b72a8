"""The SQL of tenants and workflow versions (part of
:class:`~conveyor.store.sql_store.SqlStore`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import bindparam, func, select, update

from conveyor.engine.records import WorkflowRecord
from conveyor.engine.states import DEFAULT_TENANT
from conveyor.exceptions import StoreError, TenantNotFound, WorkflowNotFound
from conveyor.models import Tenant, WorkflowVersion
from conveyor.store.rows import workflow_record
from conveyor.store.session import TENANTS, WORKFLOWS, StoreCore, upsert


class CatalogQueries(StoreCore):
    """Tenants and workflow versions (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

    # -- tenants --------------------------------------------------------------------------

    def trigger_target(self, tenant: str, workflow: str) -> tuple[uuid.UUID, uuid.UUID | None]:
        """The tenant's id and the id of its latest version of ``workflow`` (None: it has
        none), in one read; a missing tenant as :meth:`tenant_id` has it."""
        found = self._stored_target(tenant, workflow)
        if found is None:
            return self.tenant_id(tenant), None  # made now (the default): no workflow yet
        return found

    def _stored_target(
        self, tenant: str, workflow: str
    ) -> tuple[uuid.UUID, uuid.UUID | None] | None:
        """What :meth:`trigger_target` reads; None when there is no such tenant (none made)."""
        row = self._core(_TRIGGER_TARGET, {"tenant": tenant, "workflow": workflow}).one_or_none()
        return None if row is None else (row.id, row.workflow_id)

    def tenant_named(self, name: str) -> uuid.UUID | None:
        found = self._core(select(Tenant.id).where(Tenant.name == name)).scalar()
        return None if found is None else cast(uuid.UUID, found)

    def tenant_id(self, name: str) -> uuid.UUID:
        if (found := self.tenant_named(name)) is not None:
            return found
        if name == DEFAULT_TENANT:
            return self.create_tenant(name)
        raise TenantNotFound(
            f"no tenant is named {name!r}; create it with `conveyor tenants create {name}`"
        )

    def create_tenant(self, name: str) -> uuid.UUID:
        """The tenant's id, the tenant made if it is new (a racing creation is no error).
        One guarded statement, without a savepoint: fine outside a transaction too."""
        self._core(upsert(self.session, Tenant).values(name=name).on_conflict_do_nothing())
        found = self._core(select(TENANTS.c.id).where(TENANTS.c.name == name)).scalar()
        if found is None:
            raise StoreError(f"could not create tenant {name!r}")
        return cast(uuid.UUID, found)

    def tenant_names(self) -> list[str]:
        return list(self.session.scalars(select(Tenant.name).order_by(Tenant.name)))

    def tenants(self) -> list[Tenant]:
        return list(self.session.scalars(select(Tenant).order_by(Tenant.name)))

    def set_tenant_concurrency(self, name: str, limit: int | None) -> bool:
        """Set (or, with None, clear) a tenant's own limit; False if there is no such tenant."""
        result = self.session.execute(
            update(Tenant).where(Tenant.name == name).values(max_concurrency=limit)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # -- workflows ------------------------------------------------------------------------

    def latest_workflow(self, tenant_id: uuid.UUID, name: str) -> WorkflowRecord | None:
        row = self._core(
            select(WORKFLOWS)
            .where(WORKFLOWS.c.tenant_id == tenant_id, WORKFLOWS.c.name == name)
            .order_by(WORKFLOWS.c.version.desc())
            .limit(1)
        ).one_or_none()
        return workflow_record(row) if row else None

    def workflow_version(
        self, tenant_id: uuid.UUID, name: str, version: int
    ) -> WorkflowRecord | None:
        row = self._core(
            select(WORKFLOWS).where(
                WORKFLOWS.c.tenant_id == tenant_id,
                WORKFLOWS.c.name == name,
                WORKFLOWS.c.version == version,
            )
        ).one_or_none()
        return workflow_record(row) if row else None

    def workflow(self, workflow_id: uuid.UUID) -> WorkflowRecord:
        row = self.session.get(WorkflowVersion, workflow_id)
        if row is None:
            raise WorkflowNotFound(f"no workflow version has id {workflow_id}")
        return workflow_record(row)

    def add_workflow_version(
        self,
        tenant_id: uuid.UUID,
        name: str,
        digest: str,
        definition: dict[str, Any],
        now: datetime,
    ) -> WorkflowRecord:
        latest = self.latest_workflow(tenant_id, name)
        row = WorkflowVersion(
            tenant_id=tenant_id,
            name=name,
            version=(latest.version + 1) if latest else 1,
            digest=digest,
            definition=definition,
            created_at=now,
        )
        self.session.add(row)
        self.session.flush()
        return workflow_record(row)

    def list_workflows(self, tenant_id: uuid.UUID | None) -> list[WorkflowRecord]:
        """Each workflow's latest version, by name: the tenant's, or every tenant's with None
        (an operator's dashboard), then by tenant."""
        newest = select(
            WorkflowVersion.tenant_id, WorkflowVersion.name,
            func.max(WorkflowVersion.version).label("v"),
        ).group_by(WorkflowVersion.tenant_id, WorkflowVersion.name)  # fmt: skip
        if tenant_id is not None:
            newest = newest.where(WorkflowVersion.tenant_id == tenant_id)
        latest = newest.subquery()
        rows = self.session.scalars(
            select(WorkflowVersion)
            .join(
                latest,
                (WorkflowVersion.tenant_id == latest.c.tenant_id)
                & (WorkflowVersion.name == latest.c.name)
                & (WorkflowVersion.version == latest.c.v),
            )
            .order_by(WorkflowVersion.name, WorkflowVersion.tenant_id)
        )
        return [workflow_record(r) for r in rows]


# Built once (their construction cost more than their execution).
_LATEST = (
    select(WORKFLOWS.c.id)
    .where(WORKFLOWS.c.tenant_id == TENANTS.c.id, WORKFLOWS.c.name == bindparam("workflow"))
    .order_by(WORKFLOWS.c.version.desc())
    .limit(1)
    .scalar_subquery()
)
_TRIGGER_TARGET = select(TENANTS.c.id, _LATEST.label("workflow_id")).where(
    TENANTS.c.name == bindparam("tenant")
)
