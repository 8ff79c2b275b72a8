"""``conveyor schedules``: list, add, pause, resume and remove cron schedules.

Schedules declared in a workflow definition are managed by applying the definition; these
commands add an operator's own, and pause or resume either kind. The runs start when
``celery -A conveyor.tasks beat`` sends its due check; on the embedded default, while
``conveyor api`` or ``conveyor worker`` runs (see docs/schedules.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict
from zoneinfo import ZoneInfo

import typer
from pydantic import ValidationError
from rich.table import Table

from conveyor import views, wiring
from conveyor.cli import render
from conveyor.cli.common import (
    JsonFlag,
    Tenant,
    embedded_schema,
    group,
    parse_input,
    who_fires,
)
from conveyor.engine.cron import MisfirePolicy, parse_cron
from conveyor.engine.definitions import ScheduleSpec
from conveyor.engine.records import ScheduleRecord
from conveyor.engine.states import Priority
from conveyor.exceptions import ScheduleError
from conveyor.scheduler import schedules
from conveyor.store import DEFAULT_TENANT

schedules_app = group("Cron schedules: list, add, pause, resume, remove.")
Name = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


class ScheduleJson(TypedDict):
    id: str
    name: str
    workflow: str
    origin: str
    cron: str
    timezone: str
    description: str
    input: Any
    priority: str | None
    misfire: str
    catch_up: int
    enabled: bool
    next_run_at: str | None
    last_run_at: str | None
    run_count: int


def schedule_json(record: ScheduleRecord) -> ScheduleJson:
    return {
        "id": str(record.id),
        "name": record.name,
        "workflow": record.workflow_name,
        "origin": record.origin.value,
        "cron": record.cron,
        "timezone": record.timezone,
        "description": parse_cron(record.cron, record.timezone).describe(),
        "input": record.input,
        "priority": record.priority.value if record.priority else None,
        "misfire": record.misfire.value,
        "catch_up": record.catch_up,
        "enabled": record.enabled,
        "next_run_at": views.iso(record.next_run_at) if record.enabled else None,
        "last_run_at": views.iso(record.last_run_at),
        "run_count": record.run_count,
    }


def local_time(value: str | None, timezone: str) -> str:
    """An ISO UTC time as the schedule's own wall clock, with the zone's abbreviation."""
    if value is None:
        return ""
    local = datetime.fromisoformat(value).astimezone(ZoneInfo(timezone))
    return local.strftime("%Y-%m-%d %H:%M %Z")


def schedules_table(rows: list[ScheduleJson]) -> Table:
    table = Table("name", "workflow", "cron", "timezone", "next run", "last run", "runs", "state",
                  box=None)  # fmt: skip
    for r in rows:
        table.add_row(
            r["name"],
            r["workflow"],
            r["cron"],
            r["timezone"],
            local_time(r["next_run_at"], r["timezone"]),
            local_time(r["last_run_at"], r["timezone"]),
            str(r["run_count"]),
            ("enabled" if r["enabled"] else "paused") + f" ({r['origin']})",
        )
    return table


def _say(record: ScheduleRecord, verb: str) -> None:
    shown = schedule_json(record)
    when = (
        f"next run {local_time(shown['next_run_at'], record.timezone)} "
        f"({render.fmt_time(shown['next_run_at'])})"
        if record.enabled
        else "paused"
    )
    words = shown["description"][:1].lower() + shown["description"][1:]
    render.out.print(
        f"schedule {record.name} {verb}: {record.workflow_name} {words} "
        f"({record.cron}, {record.timezone}); {when}",
        markup=False,
        soft_wrap=True,
    )


def _spec(**fields: Any) -> ScheduleSpec:
    """The options as a valid schedule, or ScheduleError naming every problem."""
    try:
        return ScheduleSpec.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        problems = [
            str(e["ctx"]["error"])
            if "error" in e.get("ctx", {})
            else f"--{e['loc'][0]}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ScheduleError("; ".join(problems)) from None


def _problem(error: Any) -> str:
    if "error" in error.get("ctx", {}):  # our validators' messages say it all
        return str(error["ctx"]["error"])
    return f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}"


def _now() -> datetime:
    return datetime.now(UTC)


@schedules_app.command("list")
def schedules_list(
    tenant: Tenant = DEFAULT_TENANT,
    workflow: Annotated[str | None, typer.Option(help="Only this workflow's.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """A tenant's schedules: when each runs next (in its timezone) and how often it ran."""
    with embedded_schema(), wiring.database().transaction() as store:
        records = store.schedules(store.tenant_id(tenant), workflow=workflow)
    rows = [schedule_json(r) for r in records]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(schedules_table(rows) if rows else "no schedules")


@schedules_app.command("add")
def schedules_add(
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="An applied workflow.")],
    cron: Annotated[str, typer.Option("--cron", help="e.g. '0 9 * * 1-5', or @daily.")],
    timezone: Annotated[str, typer.Option(help="IANA timezone the cron is read in.")] = "UTC",
    name: Annotated[str | None, typer.Option(help="Default: the workflow's name.")] = None,
    input: Annotated[str, typer.Option("--input", "-i", help="Each run's input (JSON).")] = "{}",
    priority: Annotated[Priority | None, typer.Option(help="Default: normal.")] = None,
    misfire: Annotated[
        MisfirePolicy, typer.Option(help="After downtime: once, skip or all missed runs.")
    ] = MisfirePolicy.ONCE,
    catch_up: Annotated[
        int, typer.Option(min=1, max=1000, help="With --misfire all: missed runs at most.")
    ] = 10,
    tenant: Tenant = DEFAULT_TENANT,
) -> None:
    """Run WORKFLOW on a cron schedule."""
    spec = _spec(
        name=name,
        cron=cron,
        timezone=timezone,
        input=parse_input(input),
        priority=priority,
        misfire=misfire,
        catch_up=catch_up,
    )
    with embedded_schema():
        record = wiring.database().run(
            lambda s: schedules.add(s, tenant=tenant, workflow=workflow, spec=spec, now=_now())
        )
    _say(record, "added")
    render.out.print(who_fires("its"), markup=False, soft_wrap=True)


@schedules_app.command("pause")
def schedules_pause(name: Name, tenant: Tenant = DEFAULT_TENANT) -> None:
    """Start no more runs; slots passing while paused are never run."""
    with embedded_schema():
        record = wiring.database().run(lambda s: schedules.pause(s, tenant, name, _now()))
    _say(record, "paused")


@schedules_app.command("resume")
def schedules_resume(name: Name, tenant: Tenant = DEFAULT_TENANT) -> None:
    """Start runs again, from the first slot after now."""
    with embedded_schema():
        record = wiring.database().run(lambda s: schedules.resume(s, tenant, name, _now()))
    _say(record, "resumed")
    render.out.print(who_fires("its"), markup=False, soft_wrap=True)


@schedules_app.command("remove")
def schedules_remove(name: Name, tenant: Tenant = DEFAULT_TENANT) -> None:
    """Delete a schedule added with `schedules add` (its past runs stay)."""
    with embedded_schema():
        wiring.database().run(lambda s: schedules.remove(s, tenant, name))
    render.out.print(f"schedule {name} removed", markup=False)
