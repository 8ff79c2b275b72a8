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
    execution_id: uuid.UUID
    workflow: str
    node_id: str
    message: str | None
    since: datetime
    timeout_at: datetime | None


class Approvals(ServiceBase):
    def approvals(self, tenant: str = DEFAULT_TENANT) -> list[Pending]:
        """The tenant's approvals that wait for a decision, oldest first."""

        def read(store: SqlStore) -> list[Pending]:
            found = store.pending_waits(store.tenant_id(tenant), waits.APPROVAL_EVENT)
            return [_pending(store, wait) for wait in found]

        with self.db.transaction() as store:
            return read(store)

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


def _pending(store: SqlStore, wait: WaitRecord) -> Pending:
    execution = store.execution(wait.execution_id)
    workflow, _ = load_workflow(store, execution.workflow_id)
    message = workflow.node(wait.node_id).config.get("message")
    return Pending(
        id=wait.job_id, execution_id=wait.execution_id, workflow=workflow.name,
        node_id=wait.node_id, message=message if isinstance(message, str) else None,
        since=wait.created_at, timeout_at=wait.timeout_at,
    )  # fmt: skip
