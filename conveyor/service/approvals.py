"""What approvers call (through the API or the CLI): a tenant's pending approvals, and a
decision on one (:mod:`conveyor.engine.approvals`, whose names are imported one by one: the
method :meth:`Approvals.approvals` shadows the module's name in the class)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from conveyor.engine import waits
from conveyor.engine.approvals import Decided, Decision, decide
from conveyor.engine.records import WaitRecord
from conveyor.engine.workflows import load_workflow
from conveyor.service.base import ServiceBase, utcnow
from conveyor.store import DEFAULT_TENANT, SqlStore


@dataclass(frozen=True, kw_only=True)
class Pending:
    """An approval that waits for a decision: its id (its job's), where it is, what it asks,
    since when and until when it waits (None: no timeout)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    execution_id: uuid.UUID
    workflow: str
    node_id: str
    message: str | None
    since: datetime
    timeout_at: datetime | None


class Approvals(ServiceBase):
    def approvals(self, tenant: str = DEFAULT_TENANT) -> list[Pending]:
        """The tenant's approvals that wait for a decision, oldest first."""

        with self.db.transaction() as store:
            return _pending_in(store, store.tenant_id(tenant))

    def approvals_in(self, tenant_id: uuid.UUID | None) -> list[Pending]:
        """The approvals of the tenant of that id that wait for a decision, oldest first;
        every tenant's with None (an operator's dashboard)."""
        with self.db.transaction() as store:
            return _pending_in(store, tenant_id)

    def decide(
        self,
        approval_id: uuid.UUID,
        *,
        approved: bool,
        by: str,
        comment: str | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Decided:
        """Approve or reject the tenant's approval ``approval_id`` as ``by``: its node goes on
        (on the branch the decision names) with the decision as its output; what that made
        ready is published after commit. A second decision is refused
        (:class:`~conveyor.exceptions.AlreadyDecided`)."""
        decision = Decision(approved=approved, by=by, at=utcnow(), comment=comment)
        decided = self.db.run(
            lambda s: decide(s, s.tenant_id(tenant), approval_id, decision, self.event_retention)
        )
        self._after(decided.after)
        return decided


def _pending_in(store: SqlStore, tenant_id: uuid.UUID | None) -> list[Pending]:
    return [_pending(store, w) for w in store.pending_waits(tenant_id, waits.APPROVAL_EVENT)]


def _pending(store: SqlStore, wait: WaitRecord) -> Pending:
    execution = store.execution(wait.execution_id)
    workflow, _ = load_workflow(store, execution.workflow_id)
    message = workflow.node(wait.node_id).config.get("message")
    return Pending(
        id=wait.job_id, tenant_id=wait.tenant_id, execution_id=wait.execution_id,
        workflow=workflow.name, node_id=wait.node_id,
        message=message if isinstance(message, str) else None,
        since=wait.created_at, timeout_at=wait.timeout_at,
    )  # fmt: skip
