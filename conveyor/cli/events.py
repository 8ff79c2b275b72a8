"""``conveyor events send``: an application event, as ``POST /v1/events`` sends one."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor import wiring
from conveyor.cli import render
from conveyor.cli.common import (
    JsonFlag,
    Tenant,
    embedded_schema,
    group,
    parse_input,
    wait_for,
    workers_if_embedded,
)
from conveyor.engine.states import ExecutionStatus
from conveyor.store import DEFAULT_TENANT

events_app = group("Application events: send one (it starts subscribers and wakes waits).")


@events_app.callback()
def events() -> None:
    """Application events: send one (it starts subscribers and wakes waits)."""
    # a group of one command, not the command itself: `conveyor events send NAME`


@events_app.command("send")
def events_send(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The event's name (its type).")],
    key: Annotated[
        str | None,
        typer.Option(
            "--key", "-k", help="Its correlation key: wakes the wait nodes waiting for it."
        ),
    ] = None,
    payload: Annotated[
        str, typer.Option("--payload", "-p", help="JSON: the woken waits' output.")
    ] = "{}",
    tenant: Tenant = DEFAULT_TENANT,
    timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Embedded default: stop waiting after this many seconds."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Send an application event: every workflow of the tenant subscribing to NAME starts, and
    with --key every wait node waiting for (NAME, KEY) resumes with the payload as its output;
    the event is kept for the waits that begin later. With no broker configured the workers
    run in this process until the executions it started or woke finish (or --timeout)."""
    body = parse_input(payload)
    with embedded_schema(), workers_if_embedded() as embedded:
        delivered = wiring.service().send_event(name, body, key=key, tenant=tenant)
        touched = [t.execution_id for t in delivered.started] + delivered.woke_executions
        statuses = {}
        if embedded:
            statuses = {
                str(e): wait_for(e, timeout, live=False, until_waiting=True)["status"]
                for e in touched
            }
    started = [str(t.execution_id) for t in delivered.started]
    _report(started, [str(e) for e in delivered.woke_executions], statuses, as_json)
    if any(s in (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED) for s in statuses.values()):
        raise typer.Exit(1)


def _report(
    executions: list[str], woke: list[str], statuses: dict[str, str], as_json: bool
) -> None:
    if as_json:
        render.print_json({"executions": executions, "woke": woke, "statuses": statuses})
        return
    render.out.print(
        f"started {len(executions)} execution(s), woke {len(woke)} wait(s)", markup=False
    )
    for execution in executions + woke:
        shown = f" {statuses[execution]}" if execution in statuses else ""
        render.out.print(f"  {execution}{shown}", markup=False)
