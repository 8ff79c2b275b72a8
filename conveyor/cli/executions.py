"""``conveyor run``, ``conveyor executions`` and ``conveyor demo``: start executions, follow
them to their end, inspect, cancel and re-run them. With no broker configured (the embedded
default) ``run``, ``executions rerun`` and ``demo`` migrate the SQLite database and run Celery
worker threads in this process."""

from __future__ import annotations

import getpass
import json
import os
import uuid
from contextlib import suppress
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from conveyor import migrations, views, wiring
from conveyor.cli import render
from conveyor.cli.common import (
    JsonFlag,
    Tenant,
    embedded_schema,
    execution_view,
    fail,
    group,
    parse_input,
    parse_time,
    parse_uuid,
    usage_error,
    wait_for,
    workers_if_embedded,
)
from conveyor.config import get_settings
from conveyor.definition_files import SUFFIXES
from conveyor.engine.states import (
    ExecutionStatus,
    JobStatus,
    NodeStatus,
    Priority,
    TriggerSource,
)
from conveyor.exceptions import InvalidQuery, InvalidTransition
from conveyor.store import DEFAULT_TENANT
from conveyor.store.listing import ExecutionFilter

if TYPE_CHECKING:
    from conveyor.engine.reruns import Rerun

# The definition files' and the service's modules are imported by the commands that use them
# (a read needs neither).
EXAMPLES = migrations.ROOT / "examples"
INPUT_SUFFIX = ".input.json"  # examples/<name>.input.json: the input of examples/<name>.yaml

executions_app = group("Executions: list, count, show, watch, cancel, rerun.")


def _finish(view: views.ExecutionJson, as_json: bool) -> NoReturn:
    if as_json:
        render.print_json(
            {k: view[k] for k in ("status", "output", "error")} | {"execution_id": view["id"]}
        )
    else:
        render.print_outcome(view)
    waiting = views.waits_for_events_only(view)  # not failed: an event moves it on
    raise typer.Exit(0 if view["status"] == ExecutionStatus.COMPLETED or waiting else 1)


def run(
    target: Annotated[str, typer.Argument(metavar="NAME_OR_FILE", help="Workflow or file.")],
    input: Annotated[str, typer.Option("--input", "-i", help="Input as JSON.")] = "{}",
    tenant: Tenant = DEFAULT_TENANT,
    priority: Annotated[Priority | None, typer.Option(help="Override the priority.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the execution to its end.")] = False,
    as_json: JsonFlag = False,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Stop waiting after this many seconds.")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help="Start at this time (ISO 8601 with its offset, e.g. 2030-01-01T09:00Z)."
        ),
    ] = None,
    delay: Annotated[
        float | None, typer.Option("--delay", help="Start this many seconds from now.")
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", help="Tries of each node, overriding the definition's."),
    ] = None,
    try_timeout: Annotated[
        float | None,
        typer.Option(
            "--try-timeout", help="Seconds each try may run, overriding the definition's."
        ),
    ] = None,
    dedupe_key: Annotated[
        str | None,
        typer.Option(
            "--dedupe-key",
            help="Deduplication key: while an execution with it is active, the workflow's "
            "dedupe policy decides what this input does.",
        ),
    ] = None,
) -> None:
    """Start an execution (applying NAME_OR_FILE first if it is a file).

    Exit status: 0 started (or completed, with --wait), 1 failed or cancelled, 2 usage error.
    With no broker configured the workers run in this process, so --wait is implied.
    """
    payload = parse_input(input)
    run_at = parse_time(at)
    path = Path(target)
    from conveyor.cli.definitions import apply_files

    known_file = path.is_file() and path.suffix.lower() in SUFFIXES
    with workers_if_embedded() as embedded:
        # stdout carries only the id (or the JSON): the apply notice goes to stderr
        name = apply_files([path], tenant, render.err)[0] if known_file else target
        made = wiring.service().submit(
            name, payload, tenant=tenant, priority=priority, source=TriggerSource.CLI,
            run_at=run_at, delay=delay, max_attempts=max_attempts, timeout=try_timeout,
            dedupe_key=dedupe_key,
        )  # fmt: skip
        execution_id = made.execution_id
        if made.dedupe is not None and not as_json:  # stdout keeps only the id
            render.err.print(f"{_DEDUPED[made.dedupe]} (dedupe key {dedupe_key!r})")
        if not (wait or embedded):
            _print_started(execution_id, as_json, made.dedupe)
            return
        try:
            view = wait_for(execution_id, timeout, live=not as_json, until_waiting=embedded)
        finally:
            if embedded:
                view = _abandon(execution_id)
    _finish(view, as_json)


# What a dedupe key active on another execution did, said on stderr
_DEDUPED = {
    "deduplicated": "deduplicated: the active execution is returned, this input dropped",
    "replaced": "replaced: the active execution, not started yet, runs with this input",
    "follow_up": "follow-up queued: this input runs once the active execution finishes",
}


def _print_started(execution_id: uuid.UUID, as_json: bool, dedupe: str | None = None) -> None:
    if as_json:
        shown = {"execution_id": str(execution_id)}
        if dedupe is not None:
            shown["dedupe"] = dedupe
        render.print_json(shown)
    else:
        render.out.print(str(execution_id))


def _abandon(execution_id: uuid.UUID) -> views.ExecutionJson:
    """Cancel an execution that is still running when the embedded workers are about to stop:
    nothing else would ever finish it."""
    view = execution_view(execution_id)
    if views.waits_for_events_only(view):  # an event moves it on: `conveyor events send`
        render.err.print(
            "the execution waits for an event; send it with `conveyor events send NAME --key "
            "KEY` (or, for an approval, decide it: `conveyor approvals list`)",
            style="yellow", markup=False,
        )  # fmt: skip
        return view
    if not ExecutionStatus(view["status"]).finished:
        with suppress(InvalidTransition):  # it finished meanwhile
            wiring.service().cancel(execution_id)
            render.err.print("stopped waiting; the execution is cancelled", style="yellow")
    return execution_view(execution_id)


OnlyTenant = Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant.")]
Status = Annotated[ExecutionStatus | None, typer.Option(help="Only this status.")]
Workflow = Annotated[str | None, typer.Option("--workflow", "-w", help="Only this workflow.")]
NodeStatusOption = Annotated[
    NodeStatus | None, typer.Option(help="Only those with a node in this status.")
]
Time = Annotated[
    datetime | None,
    typer.Option(
        formats=[
            f"%Y-%m-%dT%H:%M:%S{fraction}{offset}"
            for fraction in ("", ".%f")
            for offset in ("%z", "")
        ]
        + ["%Y-%m-%d"],
        metavar="TIME",
        help="A time (created_at as shown, or without an offset: UTC).",
    ),
]
Key = Annotated[str | None, typer.Option()]


def _filter(
    status: ExecutionStatus | None,
    workflow: str | None,
    node_status: NodeStatus | None,
    created_after: datetime | None,
    created_before: datetime | None,
    dedupe_key: str | None = None,
    idempotency_key: str | None = None,
    parent: uuid.UUID | None = None,
) -> ExecutionFilter:
    def aware(value: datetime | None) -> datetime | None:  # a time without offset is UTC
        return value.replace(tzinfo=UTC) if value and value.tzinfo is None else value

    return ExecutionFilter(
        status=status, workflow=workflow, node_status=node_status,
        created_after=aware(created_after), created_before=aware(created_before),
        dedupe_key=dedupe_key, idempotency_key=idempotency_key, parent=parent,
    )  # fmt: skip


class ListedStatus(StrEnum):
    """The statuses ``executions list --status`` takes: an execution's, or ``waiting``."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # running, with a node waiting (a wait node for its event, a workflow node for its child)
    WAITING = "waiting"


@executions_app.command("list")
def executions_list(
    tenant: OnlyTenant = None,
    status: Annotated[
        ListedStatus | None,
        typer.Option(help="Only this status (waiting: running, with a node that waits)."),
    ] = None,
    workflow: Workflow = None,
    node_status: NodeStatusOption = None,
    created_after: Time = None,
    created_before: Time = None,
    dedupe_key: Annotated[str | None, typer.Option(help="Only this deduplication key.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Only this idempotency key.")] = None,
    parent: Annotated[
        str | None,
        typer.Option(metavar="ID", help="Only the children this execution's nodes started."),
    ] = None,
    after: Annotated[
        str | None, typer.Option(metavar="ID", help="Go on after this id (the last shown).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """Executions, newest first, narrowed by the options given (times in UTC unless they
    carry an offset); page on with --after set to the last id shown."""
    if status is ListedStatus.WAITING:
        if node_status not in (None, NodeStatus.WAITING):
            usage_error("--status waiting lists executions with a node waiting: drop --node-status")
        node_status = NodeStatus.WAITING
    where = _filter(
        None if status is None else ExecutionStatus(
            ExecutionStatus.RUNNING if status is ListedStatus.WAITING else status.value
        ),
        workflow, node_status, created_after, created_before, dedupe_key,
        idempotency_key, parse_uuid(parent) if parent is not None else None,
    )  # fmt: skip
    last = parse_uuid(after) if after is not None else None
    with embedded_schema(), wiring.database().transaction() as store:
        tenant_id = store.tenant_id(tenant) if tenant is not None else None
        rows = [
            views.execution_summary(e, name, version)
            for e, name, version in store.list_executions(
                tenant_id, where=where, after=last, limit=limit
            )
        ]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(render.executions_table(rows) if rows else "no executions")


@executions_app.command("stats")
def executions_stats(
    tenant: OnlyTenant = None,
    status: Status = None,
    workflow: Workflow = None,
    node_status: NodeStatusOption = None,
    created_after: Time = None,
    created_before: Time = None,
    as_json: JsonFlag = False,
) -> None:
    """The status view: executions counted by workflow and status, with the oldest, the
    newest and the average tries per execution."""
    where = _filter(status, workflow, node_status, created_after, created_before)
    with embedded_schema(), wiring.database().transaction() as store:
        tenant_id = store.tenant_id(tenant) if tenant is not None else None
        rows = [views.status_count_json(c) for c in store.status_counts(tenant_id, where)]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(render.status_counts_table(rows) if rows else "no executions")


@executions_app.command("show")
def executions_show(
    execution_id: Annotated[str, typer.Argument(metavar="ID", help="Execution id.")],
    items: Annotated[
        str | None,
        typer.Option("--items", metavar="NODE", help="List the items of this map node instead."),
    ] = None,
    after: Annotated[
        int | None,
        typer.Option(metavar="INDEX", help="With --items: go on after this item's index."),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="With --items: at most this many.")
    ] = 100,
    status: Annotated[
        JobStatus | None, typer.Option(help="With --items: only the items in this status.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """One execution: its nodes with outputs and errors (a map's items summed up), its jobs
    with every attempt, the parent that started it and the children it started; or, with
    --items NODE, a page of that map node's items."""
    parsed = parse_uuid(execution_id)
    if items is not None:
        _show_items(parsed, items, after, limit, status, as_json)
        return
    with embedded_schema():
        view = execution_view(parsed)
    if as_json:
        render.print_json(view)
    else:
        render.print_execution(view)


@executions_app.command("watch")
def executions_watch(
    tenant: Tenant = DEFAULT_TENANT,
    workflow: Workflow = None,
    dedupe_key: Annotated[
        str | None, typer.Option(help="Only executions with this deduplication key.")
    ] = None,
    after: Annotated[
        str | None,
        typer.Option(metavar="EVENT_ID", help="Resume after this event: every one since first."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print each change of the status of the tenant's executions as it happens, those
    triggered later included (the events of GET /v1/stream), until Ctrl-C."""
    if after is not None:
        from conveyor.service.reads import cursor_of

        try:
            cursor_of(after, "--after")
        except InvalidQuery as exc:
            usage_error(str(exc))
    with embedded_schema():
        events = wiring.service().stream(
            tenant, workflow=workflow, dedupe_key=dedupe_key, after=after
        )
        render.err.print("watching; Ctrl-C stops", style="dim")  # stderr: stdout is events
        with suppress(KeyboardInterrupt):
            for event in events:
                render.print_stream_event(event.id, event.kind, event.data, as_json)


def _show_items(
    execution_id: uuid.UUID,
    node_id: str,
    after: int | None,
    limit: int,
    status: JobStatus | None,
    as_json: bool,
) -> None:
    with embedded_schema(), wiring.database().transaction() as store:
        store.execution_row(execution_id)  # (an unknown execution is said so)
        rows = views.items_json(
            store, execution_id, node_id, after=after, limit=limit, status=status
        )
    if as_json:
        render.print_json(rows)
    elif rows:
        render.out.print(render.items_table(rows))
        if len(rows) == limit:
            render.err.print(f"more may follow: add --after {rows[-1]['index']}")
    else:
        render.out.print(f"no items of node {node_id!r} here", markup=False)


@executions_app.command("cancel")
def executions_cancel(
    execution_id: Annotated[str, typer.Argument(metavar="ID", help="Execution id.")],
) -> None:
    """Cancel a pending or running execution; running nodes are asked to stop."""
    parsed = parse_uuid(execution_id)
    with embedded_schema():
        wiring.service().cancel(parsed)
    render.out.print(f"execution {parsed} cancelled", markup=False)


@executions_app.command("rerun")
def executions_rerun(
    execution_id: Annotated[str, typer.Argument(metavar="ID", help="Execution id.")],
    from_node: Annotated[
        str, typer.Option("--from", metavar="NODE", help="The node to run again, and downstream.")
    ],
    input: Annotated[
        str | None,
        typer.Option(
            "--input", "-i", help="JSON object given to that node in place of its inputs."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the execution to its end.")] = False,
    as_json: JsonFlag = False,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Stop waiting after this many seconds.")
    ] = None,
) -> None:
    """Run a finished (failed, cancelled or completed) execution again from a node: it and
    every node downstream of it run again (so do the nodes that did not end well), the
    others keep their outputs; their earlier tries stay in the history. Recorded as asked by
    cli:<your user name>.

    Exit status: 0 re-run (or completed, with --wait), 1 refused, failed or cancelled, 2 usage
    error. With no broker configured the workers run in this process, so --wait is implied.
    """
    parsed = parse_uuid(execution_id)
    given = parse_input(input) if input is not None else None
    if given is not None and not isinstance(given, dict):
        usage_error(f"--input must be a JSON object (the node's inputs by name): {input}")
    with workers_if_embedded() as embedded:
        done = wiring.service().rerun(
            parsed, from_node, requested_by=f"cli:{_os_user()}", input=given
        )
        if not (wait or embedded):
            _print_rerun(done, as_json)
            return
        if not as_json:
            render.err.print(_rerun_line(done), markup=False, soft_wrap=True)
        try:
            view = wait_for(parsed, timeout, live=not as_json)
        finally:
            if embedded:
                view = _abandon(parsed)
    _finish(view, as_json)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's, often)
        return f"uid {os.getuid()}"


def _rerun_line(done: Rerun) -> str:
    return (
        f"execution {done.execution_id} runs again from {done.from_node}: "
        f"{', '.join(done.nodes)} (queued now: {', '.join(done.queued) or 'none'})"
    )


def _print_rerun(done: Rerun, as_json: bool) -> None:
    if as_json:
        render.print_json(
            {"execution_id": str(done.execution_id), "from_node": done.from_node,
             "nodes": done.nodes, "queued": done.queued}
        )  # fmt: skip
    else:
        render.out.print(_rerun_line(done), markup=False, soft_wrap=True)


def demo() -> None:
    """Apply the examples and run two of them here, with live progress (no setup needed)."""
    if not get_settings().embedded:
        fail(
            "conveyor demo runs its own workers in this process and needs the embedded "
            "default; unset CONVEYOR_BROKER_URL, or apply examples/ and run them on your "
            "workers (CONVEYOR_IMPORTS=conveyor.demo)"
        )
    from conveyor import demo as demo_nodes  # registers the examples' node functions
    from conveyor.cli.definitions import apply_files

    files = sorted(
        p
        for p in EXAMPLES.iterdir()
        if p.suffix in SUFFIXES and not p.name.endswith(INPUT_SUFFIX)  # an example's input
    )
    with workers_if_embedded():
        apply_files(files, DEFAULT_TENANT)
        ok = [_demo_run(name, payload) for name, payload in demo_nodes.RUNS]
        render.out.print(
            "\nSee them again with `conveyor executions list`; run the examples yourself with "
            "`CONVEYOR_IMPORTS=conveyor.demo conveyor run branching --input '{\"amount\": 250}'`.",
            markup=False,
            soft_wrap=True,
        )
    raise typer.Exit(0 if all(ok) else 1)


def _demo_run(name: str, payload: Any) -> bool:
    render.out.print(f"\n[bold]▶ conveyor run {name} --input '{json.dumps(payload)}'[/bold]")
    execution_id = wiring.service().trigger(name, payload, source=TriggerSource.CLI)
    view = wait_for(execution_id, timeout=60, live=True)
    render.print_outcome(view)
    return view["status"] == ExecutionStatus.COMPLETED
