"""``conveyor dlq``: list, show, requeue and discard dead-lettered node jobs without SQL.

A requeue resumes the failed execution from the dead node with a fresh set of tries (on the
embedded default it runs the workers in this process and waits for the resumed executions to
finish); a discard moves the dead letter to the archive (``list --archived``), never deleting
it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.table import Table

from conveyor import views, wiring
from conveyor.cli import render
from conveyor.cli.common import (
    JsonFlag,
    embedded_schema,
    fail,
    group,
    parse_time,
    parse_uuid,
    usage_error,
    wait_for,
    workers_if_embedded,
)
from conveyor.engine.states import ExecutionStatus
from conveyor.exceptions import NotFound
from conveyor.store.dead_letters import DeadLetterFilter

dlq_app = group("Dead letters: list, show, requeue, discard.")
TenantOpt = Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's.")]
WorkflowOpt = Annotated[str | None, typer.Option(help="Only this workflow's.")]
NodeOpt = Annotated[str | None, typer.Option(help="Only this node's.")]
ErrorOpt = Annotated[str | None, typer.Option("--error", help="Whose last error contains this.")]
OlderOpt = Annotated[
    float | None, typer.Option("--older-than", min=0, help="Dead for more than this many hours.")
]
Ids = Annotated[list[str] | None, typer.Argument(metavar="JOB_ID...", help="Dead letters.")]
AllFlag = Annotated[
    bool, typer.Option("--all", help="Every dead letter the filters match (up to --limit).")
]
Limit = Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")]


def _filter(
    tenant: str | None,
    workflow: str | None,
    node: str | None,
    error: str | None,
    older_than: float | None,
    archived: bool = False,
) -> DeadLetterFilter:
    with wiring.database().transaction() as store:
        tenant_id = store.tenant_id(tenant) if tenant is not None else None
    before = datetime.now(UTC) - timedelta(hours=older_than) if older_than is not None else None
    return DeadLetterFilter(
        tenant_id=tenant_id, workflow=workflow, node=node, error=error, before=before,
        discarded=archived,
    )  # fmt: skip


def _rows(where: DeadLetterFilter, limit: int) -> list[views.DeadLetterJson]:
    with wiring.database().transaction() as store:
        return [views.dead_letter_json(*row) for row in store.dead_letter_rows(where, limit)]


@dlq_app.command("list")
def dlq_list(
    tenant: TenantOpt = None,
    workflow: WorkflowOpt = None,
    node: NodeOpt = None,
    error: ErrorOpt = None,
    older_than: OlderOpt = None,
    archived: Annotated[bool, typer.Option(help="The discarded ones instead.")] = False,
    limit: Limit = 50,
    as_json: JsonFlag = False,
) -> None:
    """Dead-lettered node jobs, the most recent first."""
    with embedded_schema():
        rows = _rows(_filter(tenant, workflow, node, error, older_than, archived), limit)
    if as_json:
        render.print_json(rows)
        return
    linked = any(_link(r) for r in rows)  # the column only when a row has a link
    table = Table("job", "tenant", "workflow", "node", "tries", "dead at",
                  *(["link"] if linked else []), "error", box=None)  # fmt: skip
    for r in rows:
        when, why = render.fmt_time(r["dead_at"]), render.short(r["error"] or "", 60)
        table.add_row(r["job_id"], r["tenant"], r["workflow"], _node(r), str(r["tries"]), when,
                      *([_link(r)] if linked else []), why)  # fmt: skip
    render.out.print(table if rows else "no dead letters")


def _node(row: views.DeadLetterJson) -> str:
    """The node, and a map item's index: ``resize[3]``."""
    node = row["node"] or ""
    return node if row["item_index"] is None else f"{node}[{row['item_index']}]"


def _link(row: views.DeadLetterJson) -> str:
    """The child whose failure a workflow node's dead letter records, or the parent of a
    dead letter in a child."""
    if row["child_execution_id"]:
        return f"child {row['child_execution_id']}"
    if row["parent_execution_id"]:
        return f"in a child of {row['parent_execution_id']}"
    return ""


@dlq_app.command("show")
def dlq_show(
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID")], as_json: JsonFlag = False
) -> None:
    """One dead letter with every try it made."""
    parsed = parse_uuid(job_id)
    with embedded_schema(), wiring.database().transaction() as store:
        if store.dead_letter(parsed, None) is None:
            raise NotFound(f"no dead letter has id {parsed}; list them with `conveyor dlq list`")
        view = views.dead_letter_view(store, parsed)
    if as_json:
        render.print_json(view)
        return
    link = f", {_link(view)}" if _link(view) else ""
    render.out.print(
        f"{view['status']} job {view['job_id']}: {view['tenant']}/{view['workflow']} node "
        f"{_node(view)}, execution {view['execution_id']}{link}, {view['tries']} tries",
        markup=False,
    )
    table = Table("try", "status", "worker", "started", "duration", "error", box=None)
    for a in view["attempts"]:
        table.add_row(str(a["number"]), render.styled(a["status"]), a["worker"] or "",
                      render.fmt_time(a["started_at"]), render.fmt_seconds(a["duration"]),
                      a["error"] or "")  # fmt: skip
    render.out.print(table)


def _chosen(
    ids: list[str] | None, every: bool, where: DeadLetterFilter, limit: int
) -> list[uuid.UUID]:
    if ids and every:
        usage_error("give job ids or --all with filters, not both")
    if ids:
        return [parse_uuid(i) for i in ids]
    if not every:
        usage_error(
            "give the dead letters' job ids, or --all to act on every one the filters match"
        )
    return [uuid.UUID(r["job_id"]) for r in _rows(where, limit)]


def _report(outcomes: dict[uuid.UUID, str | None], verb: str) -> None:
    for job_id, refused in outcomes.items():
        if refused is None:
            render.out.print(f"{job_id}: {verb}", markup=False)
        else:
            render.err.print(f"{job_id}: {refused}", style="red", markup=False, soft_wrap=True)


def _end(outcomes: dict[uuid.UUID, str | None], verb: str) -> None:
    if any(outcomes.values()):
        fail(f"{sum(1 for v in outcomes.values() if v)} of {len(outcomes)} not {verb}")


def _executions_of(job_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """The execution of each dead letter found (job id -> execution id)."""
    with wiring.database().transaction() as store:
        found = {job_id: store.dead_letter(job_id, None) for job_id in job_ids}
    return {job_id: job.execution_id for job_id, job in found.items() if job is not None}


def _follow(execution_ids: list[uuid.UUID]) -> bool:
    """Wait for each resumed execution to finish (the embedded workers run it here); whether
    all completed."""
    completed = True
    for execution_id in dict.fromkeys(execution_ids):
        view = wait_for(execution_id, timeout=None, live=True)
        render.print_outcome(view)
        completed = completed and view["status"] == ExecutionStatus.COMPLETED
    return completed


@dlq_app.command("requeue")
def dlq_requeue(
    ids: Ids = None,
    every: AllFlag = False,
    tenant: TenantOpt = None,
    workflow: WorkflowOpt = None,
    node: NodeOpt = None,
    error: ErrorOpt = None,
    older_than: OlderOpt = None,
    limit: Limit = 1000,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Resume at this time (ISO 8601 with its offset)."),
    ] = None,
    delay: Annotated[
        float | None, typer.Option("--delay", help="Resume this many seconds from now.")
    ] = None,
) -> None:
    """Resume each dead letter's execution from it, with a fresh set of tries (with --at
    or --delay, its jobs wait in the database until then).

    Exit status: 0 requeued (and completed), 1 otherwise, 2 usage error.
    With no broker configured the workers run in this process until the resumed
    executions finished.
    """
    run_at = parse_time(at)
    with embedded_schema(), workers_if_embedded() as embedded:
        chosen = _chosen(ids, every, _filter(tenant, workflow, node, error, older_than), limit)
        executions = _executions_of(chosen) if embedded else {}
        outcomes = wiring.service().requeue_dead_letters(chosen, run_at=run_at, delay=delay)
        _report(outcomes, "requeued")
        resumed = [executions[j] for j, refused in outcomes.items() if refused is None and embedded]
        completed = _follow(resumed)
    _end(outcomes, "requeued")
    if not completed:
        fail("a resumed execution did not complete; see `conveyor dlq list`")


@dlq_app.command("discard")
def dlq_discard(
    ids: Ids = None,
    every: AllFlag = False,
    tenant: TenantOpt = None,
    workflow: WorkflowOpt = None,
    node: NodeOpt = None,
    error: ErrorOpt = None,
    older_than: OlderOpt = None,
    limit: Limit = 1000,
) -> None:
    """Move dead letters to the archive (`dlq list --archived`); their executions stay failed."""
    with embedded_schema():
        chosen = _chosen(ids, every, _filter(tenant, workflow, node, error, older_than), limit)
        outcomes = wiring.service().discard_dead_letters(chosen)
    _report(outcomes, "discarded")
    _end(outcomes, "discarded")
