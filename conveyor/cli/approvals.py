"""``conveyor approvals``: list the approvals waiting for a decision, approve or reject one.

A decision is recorded with who made it (``--by``, else the user running the command); on
the embedded default the workers run in this process until the execution it moved on
finishes or waits again.
"""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from rich.table import Table

from conveyor import wiring
from conveyor.cli import render
from conveyor.cli.common import (
    JsonFlag,
    Tenant,
    embedded_schema,
    group,
    parse_uuid,
    wait_for,
    workers_if_embedded,
)
from conveyor.engine.states import ExecutionStatus
from conveyor.service.approvals import Pending
from conveyor.store import DEFAULT_TENANT

approvals_app = group("Approvals: list those waiting for a decision, approve or reject one.")
Id = Annotated[str, typer.Argument(metavar="ID", help="The approval's id (from `list`).")]
Comment = Annotated[str | None, typer.Option("--comment", "-c", help="Why: kept with it.")]
By = Annotated[
    str | None, typer.Option("--by", help="Who decides (default: the user running this).")
]
Timeout = Annotated[
    float | None,
    typer.Option(min=0, help="Embedded default: stop waiting after this many seconds."),
]


@approvals_app.command("list")
def approvals_list(tenant: Tenant = DEFAULT_TENANT, as_json: JsonFlag = False) -> None:
    """The tenant's approvals waiting for a decision, oldest first."""
    with embedded_schema():
        pending = wiring.service().approvals(tenant)
    if as_json:
        render.print_json([_json(p) for p in pending])
        return
    table = Table("ID", "WORKFLOW", "NODE", "SINCE", "TIMEOUT", "MESSAGE", box=None)
    for p in pending:
        timeout = p.timeout_at.isoformat(timespec="seconds") if p.timeout_at else "-"
        table.add_row(
            str(p.id), p.workflow, p.node_id, p.since.isoformat(timespec="seconds"), timeout,
            p.message or "",
        )  # fmt: skip
    render.out.print(table)


@approvals_app.command("approve")
def approvals_approve(
    approval_id: Id,
    comment: Comment = None,
    by: By = None,
    tenant: Tenant = DEFAULT_TENANT,
    timeout: Timeout = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve: the approval node completes, the decision its output, and its on_approve
    branch runs."""
    _decide(approval_id, True, comment, by, tenant, timeout, as_json)


@approvals_app.command("reject")
def approvals_reject(
    approval_id: Id,
    comment: Comment = None,
    by: By = None,
    tenant: Tenant = DEFAULT_TENANT,
    timeout: Timeout = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject: the approval node's on_reject branch runs (it fails when it names none)."""
    _decide(approval_id, False, comment, by, tenant, timeout, as_json)


def _json(pending: Pending) -> dict[str, str | None]:
    timeout = pending.timeout_at.isoformat() if pending.timeout_at else None
    return {
        "id": str(pending.id), "execution_id": str(pending.execution_id),
        "workflow": pending.workflow, "node_id": pending.node_id, "message": pending.message,
        "since": pending.since.isoformat(), "timeout_at": timeout,
    }  # fmt: skip


def _decide(
    raw_id: str,
    approved: bool,
    comment: str | None,
    by: str | None,
    tenant: str,
    timeout: float | None,
    as_json: bool,
) -> None:
    approval_id = parse_uuid(raw_id)
    with embedded_schema(), workers_if_embedded() as embedded:
        decided = wiring.service().decide(
            approval_id, approved=approved, by=by or getpass.getuser(), comment=comment,
            tenant=tenant,
        )  # fmt: skip
        status = None
        if embedded:
            status = wait_for(decided.execution_id, timeout, live=False, until_waiting=True)
    shown = {"execution_id": str(decided.execution_id), **decided.output}
    if status is not None:
        shown["status"] = status["status"]
    if as_json:
        render.print_json(shown)
    else:
        render.out.print(
            f"{decided.output['decision']} by {decided.output['by']}: execution "
            f"{decided.execution_id}" + (f" {shown['status']}" if "status" in shown else ""),
            markup=False,
        )
    if shown.get("status") in (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED):
        raise typer.Exit(1)
