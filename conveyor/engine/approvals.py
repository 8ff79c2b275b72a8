"""Approvals: a wait for a person's decision, made by the approval's id (its job's).

An approval node is a wait (:mod:`conveyor.engine.waits`) whose event is
:data:`~conveyor.engine.waits.APPROVAL_EVENT` and whose key is its job's id, so it needs no
machinery of its own: it holds no worker slot, its timeout is expired by the duty thread, and
cancelling its execution ends it. A decision (:func:`decide`) takes the correlation's lock,
refuses a second decision (the first is kept as an event, for the event retention), and
resumes the wait in the same transaction: approved, the node completes on its ``on_approve``
branch; rejected, on its ``on_reject`` branch, or fails (:class:`ApprovalRejected`) when it
names none. Either way the decision (who, when, the comment) is the node's output.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.engine.failure import fail_node
from conveyor.engine.ports import Store
from conveyor.engine.records import AfterCommit, EventRecord
from conveyor.engine.success import complete_node
from conveyor.engine.waits import APPROVAL_EVENT, DEFAULT_RETENTION, resume, waited_for
from conveyor.exceptions import (
    AlreadyDecided,
    ApprovalNotFound,
    ApprovalRejected,
    ConveyorError,
)
from conveyor.ids import new_id

_EVER = datetime(1970, 1, 1, tzinfo=UTC)
# The most characters a decider's name and a comment may have.
MAX_BY = 200
MAX_COMMENT = 2000


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A person's decision on an approval: approved or not, by whom, when, and why."""

    approved: bool
    by: str
    at: datetime
    comment: str | None = None

    def output(self) -> dict[str, Any]:
        """The approval node's output (and the kept event's payload)."""
        return {
            "decision": "approved" if self.approved else "rejected",
            "by": self.by,
            "at": self.at.isoformat(),
            "comment": self.comment,
        }


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What a decision did: the approval's execution and node, the node's output, and what
    is left to do after commit."""

    execution_id: uuid.UUID
    node_id: str
    output: dict[str, Any]
    after: AfterCommit


def decide(
    store: Store,
    tenant_id: uuid.UUID,
    approval_id: uuid.UUID,
    decision: Decision,
    keep_for: timedelta = DEFAULT_RETENTION,
) -> Decided:
    """``decision`` on the tenant's approval ``approval_id``, in the caller's transaction: the
    approval's node completed on the branch it names (or failed, rejected with no
    ``on_reject``). :class:`AlreadyDecided` when it was decided before;
    :class:`ApprovalNotFound` when the tenant has no such approval waiting."""
    check_decision(decision)
    key = str(approval_id)
    store.lock_correlation(tenant_id, APPROVAL_EVENT, key)
    # What waits now is asked, whatever was decided in an earlier run (a rerun asks again).
    found = store.waits_for(tenant_id, APPROVAL_EVENT, key)
    run = resume(store, found[0]) if found else None
    if run is None:
        earlier = store.first_event(tenant_id, APPROVAL_EVENT, key, _EVER, decision.at)
        if earlier is not None:
            raise AlreadyDecided(_already(approval_id, earlier.payload))
        raise ApprovalNotFound(
            f"no approval {approval_id} waits for a decision in this tenant (its execution "
            f"ended, it timed out, or the id is another tenant's); list the pending ones "
            f"with `conveyor approvals list` or GET /v1/approvals"
        )
    output, waited = decision.output(), waited_for(found[0], decision.at)
    store.add_event(
        EventRecord(
            id=new_id(), tenant_id=tenant_id, name=APPROVAL_EVENT, key=key, payload=output,
            created_at=decision.at, expires_at=decision.at + keep_for,
        )
    )  # fmt: skip
    if decision.approved or "on_reject" in run.node.config:
        branch = "on_approve" if decision.approved else "on_reject"
        after = complete_node(store, run, output, decision.at, waited, branch=branch)
    else:
        why = f" ({decision.comment})" if decision.comment else ""
        rejected = ApprovalRejected(
            f"approval node {run.node.id!r} was rejected by {decision.by}{why}; name nodes "
            f"under its config.on_reject to go on after a rejection"
        )
        after = fail_node(store, run, rejected, decision.at, waited).after
    return Decided(execution_id=run.execution.id, node_id=run.node.id, output=output, after=after)


def check_decision(decision: Decision) -> None:
    """:class:`~conveyor.exceptions.ConveyorError` naming the fix for a decider's name or a
    comment no approval may record."""
    if not decision.by.strip() or len(decision.by) > MAX_BY:
        raise ConveyorError(
            f"a decision must say who made it: 1 to {MAX_BY} characters (the CLI's --by)"
        )
    if decision.comment is not None and len(decision.comment) > MAX_COMMENT:
        raise ConveyorError(f"a decision's comment may have at most {MAX_COMMENT} characters")


def _already(approval_id: uuid.UUID, payload: Any) -> str:
    first = payload if isinstance(payload, dict) else {}
    return (
        f"approval {approval_id} was already {first.get('decision', 'decided')} by "
        f"{first.get('by', 'someone')} at {first.get('at', '?')}; a decision is final (rerun "
        f"the execution from the approval node to ask again)"
    )
