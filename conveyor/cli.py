"""The ``conveyor`` command: migrations, definitions, executions and the demo.

Errors a user can cause (:class:`ConveyorError`, bad settings, an unreachable database) end as a
red message on stderr and exit status 1, never a traceback; usage errors exit with 2. With no
broker configured (the embedded default) ``conveyor run`` and ``conveyor demo`` migrate the
SQLite database and run Celery worker threads inside this process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError
from typer.core import TyperGroup

from conveyor import cli_render as render
from conveyor import migrations, runtime, views
from conveyor.config import archive_retention, get_settings
from conveyor.definition_files import SUFFIXES, load_definition
from conveyor.engine.definitions import Workflow
from conveyor.engine.states import ExecutionStatus, Priority, TriggerSource
from conveyor.engine.validation import validate
from conveyor.exceptions import (
    ConfigurationError,
    ConveyorError,
    InvalidTransition,
    TenantNotFound,
)
from conveyor.store import DEFAULT_TENANT

if TYPE_CHECKING:  # imported lazily: only the commands that run or steer work need Celery
    from conveyor.service import Conveyor

POLL_SECONDS = 0.2
EXAMPLES = migrations.ROOT / "examples"


class _Group(TyperGroup):
    """Ends every user-caused error with a clear message instead of a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ConveyorError as exc:
            fail(str(exc))
        except (SettingsError, ValidationError) as exc:
            fail(f"a CONVEYOR_* setting is invalid: {exc}")
        except SQLAlchemyError as exc:
            cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            fail(
                f"database error on {migrations.display_url()}: {cause}; check that it is "
                f"reachable and migrated (`conveyor db upgrade`)"
            )


def fail(message: str, code: int = 1) -> NoReturn:
    render.err.print(message, style="red", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    fail(message, code=2)


def _typer(help: str, **kwargs: Any) -> typer.Typer:
    return typer.Typer(
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        **kwargs,
    )


app = _typer("Durable DAG workflows on Celery.", cls=_Group)
db_app = _typer("The database schema.")
workflow_app = _typer("Workflow definitions: validate, apply, list.")
executions_app = _typer("Executions: list, show, cancel.")
tenants_app = _typer("Tenants.")
app.add_typer(db_app, name="db")
app.add_typer(workflow_app, name="workflow")
app.add_typer(executions_app, name="executions")
app.add_typer(tenants_app, name="tenants")

Tenant = Annotated[str, typer.Option("--tenant", "-t", help="Tenant name.")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (see docs/cli.md).")]
Files = Annotated[
    list[Path], typer.Argument(metavar="FILE", help="Definition files (.yaml, .yml or .json).")
]


def main() -> None:
    app()


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log warnings and info.")
    ] = False,
) -> None:
    render.setup_logging(verbose)


# -- wiring ----------------------------------------------------------------------------------


def _service() -> Conveyor:
    from conveyor.tasks import service

    return service()


def _load_imports() -> None:
    try:
        runtime.load_imports()
    except ImportError as exc:
        raise ConfigurationError(
            f"CONVEYOR_IMPORTS names a module that cannot be imported: {exc}"
        ) from exc


def _known_functions() -> frozenset[str] | None:
    """The registered functions when CONVEYOR_IMPORTS names modules; else no check."""
    _load_imports()
    return runtime.known_functions()


@contextmanager
def _workers_if_embedded() -> Iterator[bool]:
    """With no broker, migrate and run worker threads here; yield whether we did."""
    if not get_settings().embedded:
        yield False
        return
    from conveyor.embedded import embedded_workers

    _load_imports()
    migrations.upgrade()
    with embedded_workers():
        yield True


def _parse_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        usage_error(f"{value!r} is not an id (a UUID); list them with `conveyor executions list`")


# -- definition files ------------------------------------------------------------------------


def load_file(path: Path) -> Any:
    """The parsed content of a YAML or JSON definition file, read strictly (see
    :mod:`conveyor.definition_files`); ConveyorError names the line."""
    return load_definition(path, max_bytes=get_settings().max_definition_bytes)


def check_files(paths: Sequence[Path], *, say_valid: bool = False) -> dict[Path, Workflow]:
    """Validate every file, print every problem, and exit 1 if there is any."""
    known = _known_functions()
    valid: dict[Path, Workflow] = {}
    for path in paths:
        try:
            data = load_file(path)
        except ConveyorError as exc:
            render.err.print(str(exc), style="red", markup=False, soft_wrap=True)
            continue
        errors = validate(
            data,
            known_functions=known,
            http_allow=runtime.http_allow(),
            bounds=get_settings().bounds,
        )
        for error in errors:
            render.err.print(f"{path}: {error}", style="red", markup=False, soft_wrap=True)
        if not errors:
            valid[path] = Workflow.model_validate(data)
            if say_valid:
                render.out.print(f"{path}: valid", markup=False)
    if len(valid) < len(paths):
        raise typer.Exit(1)
    return valid


def apply_files(paths: Sequence[Path], tenant: str, console: Console = render.out) -> list[str]:
    """Validate all, then store each; the names applied, each reported on ``console``."""
    workflows = check_files(paths)
    service = _service()
    for workflow in workflows.values():
        record, stored = service.apply(workflow, tenant)
        state = (
            f"stored version {record.version}"
            if stored
            else f"unchanged (version {record.version})"
        )
        console.print(f"{record.name}: {state}", markup=False)
    return [w.name for w in workflows.values()]


# -- commands: db, workflow, tenants ---------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration (alembic upgrade head) to CONVEYOR_DATABASE_URL."""
    migrations.upgrade()
    render.out.print(f"database {migrations.display_url()} is up to date", markup=False)


@db_app.command("prune")
def db_prune(
    older_than: Annotated[
        float | None,
        typer.Option("--older-than", help="Days; default CONVEYOR_RETENTION_DAYS.", min=0),
    ] = None,
    archive_older_than: Annotated[
        float | None,
        typer.Option(
            "--archive-older-than",
            help="Days since a dead letter was discarded to the archive; default "
            "CONVEYOR_ARCHIVE_RETENTION_DAYS; 0 keeps the archive.",
            min=0,
        ),
    ] = None,
) -> None:
    """Delete finished executions (with their jobs, tries and node states) older than the
    retention; beat runs the same sweep every CONVEYOR_RETENTION_INTERVAL seconds."""
    settings = get_settings()
    days = settings.retention_days if older_than is None else older_than
    archive = settings.archive_retention_days if archive_older_than is None else archive_older_than
    pruned = _service().prune(
        timedelta(days=days), most=10**12, archive_older_than=archive_retention(archive)
    )
    render.out.print(f"{pruned} finished execution(s) older than {days:g} day(s) deleted")


@workflow_app.command("validate")
def workflow_validate(files: Files) -> None:
    """Check definition files; print every problem; exit 1 if any file is invalid."""
    check_files(files, say_valid=True)


@workflow_app.command("apply")
def workflow_apply(files: Files, tenant: Tenant = DEFAULT_TENANT) -> None:
    """Validate definition files and store each changed one as a new version."""
    with _embedded_schema():
        apply_files(files, tenant)


@workflow_app.command("list")
def workflow_list(tenant: Tenant = DEFAULT_TENANT, as_json: JsonFlag = False) -> None:
    """The latest version of every workflow of a tenant."""
    with _embedded_schema(), runtime.database().transaction() as store:
        rows = [views.workflow_json(r) for r in store.list_workflows(store.tenant_id(tenant))]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(render.workflows_table(rows) if rows else "no workflows; apply one")


TenantName = Annotated[str, typer.Argument(help="The tenant's name.")]
Concurrency = Annotated[
    int | None,
    typer.Option(
        "--concurrency",
        min=1,
        help="Node jobs of this tenant that may run at once (default: CONVEYOR_LIMIT_TENANT).",
    ),
]


@tenants_app.command("create")
def tenants_create(name: TenantName, concurrency: Concurrency = None) -> None:
    """Create a tenant (nothing happens if it exists)."""
    if not 0 < len(name) <= 100:
        usage_error("a tenant name has 1 to 100 characters")
    with _embedded_schema(), runtime.database().transaction() as store:
        tenant_id = store.create_tenant(name)
        if concurrency is not None:
            store.set_tenant_concurrency(name, concurrency)
    render.out.print(f"tenant {name}: {tenant_id}", markup=False)


@tenants_app.command("limit")
def tenants_limit(
    name: TenantName,
    concurrency: Annotated[
        int | None, typer.Argument(min=1, help="Its limit; leave out to use the default.")
    ] = None,
) -> None:
    """Set a tenant's concurrency limit, or go back to the default without a number."""
    with _embedded_schema(), runtime.database().transaction() as store:
        if not store.set_tenant_concurrency(name, concurrency):
            raise TenantNotFound(
                f"no tenant is named {name!r}; create it with `conveyor tenants create {name}`"
            )
    shown = concurrency if concurrency is not None else f"default ({get_settings().limit_tenant})"
    render.out.print(f"tenant {name}: concurrency {shown}", markup=False)


@tenants_app.command("list")
def tenants_list(as_json: JsonFlag = False) -> None:
    """Every tenant with its concurrency limit."""
    default = get_settings().limit_tenant
    with _embedded_schema(), runtime.database().transaction() as store:
        rows = [
            {"name": t.name, "id": str(t.id), "concurrency": t.max_concurrency}
            for t in store.tenants()
        ]
    if as_json:
        render.print_json(rows)
        return
    table = Table("name", "id", "concurrency", box=None)
    for r in rows:
        limit = r["concurrency"]
        table.add_row(str(r["name"]), str(r["id"]), str(limit or f"{default} (default)"))
    render.out.print(table)


@app.command("limits")
def limits_show(as_json: JsonFlag = False) -> None:
    """Permits in use against each limit, and the jobs waiting for one."""
    settings = get_settings()
    limiter = runtime.limiter()
    if limiter is None:
        why = "the embedded default" if settings.embedded else "CONVEYOR_LIMITS_ENABLED=false"
        render.out.print(f"concurrency limits are off ({why})", markup=False)
        return
    usages = limiter.snapshot()
    with runtime.database().transaction() as store:
        names = {str(t.id): t.name for t in store.tenants()}
    rows = [render.limit_json(u, names) for u in usages]
    if as_json:
        render.print_json(rows)
        return
    render.out.print(
        f"defaults: global {settings.limit_global}, tenant {settings.limit_tenant}, "
        f"workflow {settings.limit_workflow}",
        markup=False,
    )
    if not rows:
        render.out.print("no node job has asked for a permit yet", markup=False)
        return
    render.out.print(render.limits_table(rows))


@contextmanager
def _embedded_schema() -> Iterator[None]:
    """The embedded database is migrated on first use; production runs `conveyor db upgrade`."""
    if get_settings().embedded:
        migrations.upgrade()
    yield


# -- commands: run ---------------------------------------------------------------------------


def _parse_input(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        usage_error(f"--input is not valid JSON ({exc.msg} at column {exc.colno}): {raw}")


def _execution_view(execution_id: uuid.UUID) -> views.ExecutionJson:
    with runtime.database().transaction() as store:
        return views.execution_view(store, execution_id)


def wait_for(execution_id: uuid.UUID, timeout: float | None, live: bool) -> views.ExecutionJson:
    """Poll the execution until it finishes or ``timeout`` seconds pass; the last view."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with render.live_progress(live) as show:
        while True:
            view = _execution_view(execution_id)
            show(view)
            if ExecutionStatus(view["status"]).finished:
                return view
            if deadline is not None and time.monotonic() >= deadline:
                return view
            time.sleep(POLL_SECONDS)


def _finish(view: views.ExecutionJson, as_json: bool) -> NoReturn:
    if as_json:
        render.print_json(
            {k: view[k] for k in ("status", "output", "error")} | {"execution_id": view["id"]}
        )
    else:
        render.print_outcome(view)
    raise typer.Exit(0 if view["status"] == ExecutionStatus.COMPLETED else 1)


@app.command("run")
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
) -> None:
    """Start an execution (applying NAME_OR_FILE first if it is a file).

    Exit status: 0 started (or completed, with --wait), 1 failed or cancelled, 2 usage error.
    With no broker configured the workers run in this process, so --wait is implied.
    """
    payload = _parse_input(input)
    path = Path(target)
    known_file = path.is_file() and path.suffix.lower() in SUFFIXES
    with _workers_if_embedded() as embedded:
        # stdout carries only the id (or the JSON): the apply notice goes to stderr
        name = apply_files([path], tenant, render.err)[0] if known_file else target
        execution_id = _service().trigger(
            name, payload, tenant=tenant, priority=priority, source=TriggerSource.CLI
        )
        if not (wait or embedded):
            _print_started(execution_id, as_json)
            return
        try:
            view = wait_for(execution_id, timeout, live=not as_json)
        finally:
            if embedded:
                view = _abandon(execution_id)
    _finish(view, as_json)


def _print_started(execution_id: uuid.UUID, as_json: bool) -> None:
    if as_json:
        render.print_json({"execution_id": str(execution_id)})
    else:
        render.out.print(str(execution_id))


def _abandon(execution_id: uuid.UUID) -> views.ExecutionJson:
    """Cancel an execution that is still running when the embedded workers are about to stop:
    nothing else would ever finish it."""
    if not ExecutionStatus(_execution_view(execution_id)["status"]).finished:
        with suppress(InvalidTransition):  # it finished meanwhile
            _service().cancel(execution_id)
            render.err.print("stopped waiting; the execution is cancelled", style="yellow")
    return _execution_view(execution_id)


# -- commands: executions --------------------------------------------------------------------


@executions_app.command("list")
def executions_list(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant.")] = None,
    status: Annotated[ExecutionStatus | None, typer.Option(help="Only this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """The most recent executions, newest first."""
    with _embedded_schema(), runtime.database().transaction() as store:
        tenant_id = store.tenant_id(tenant) if tenant is not None else None
        rows = [
            views.execution_summary(e, name, version)
            for e, name, version in store.list_executions(tenant_id, status=status, limit=limit)
        ]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(render.executions_table(rows) if rows else "no executions")


@executions_app.command("show")
def executions_show(
    execution_id: Annotated[str, typer.Argument(metavar="ID", help="Execution id.")],
    as_json: JsonFlag = False,
) -> None:
    """One execution: its nodes with outputs and errors, its jobs with every attempt."""
    parsed = _parse_uuid(execution_id)
    with _embedded_schema():
        view = _execution_view(parsed)
    if as_json:
        render.print_json(view)
    else:
        render.print_execution(view)


@executions_app.command("cancel")
def executions_cancel(
    execution_id: Annotated[str, typer.Argument(metavar="ID", help="Execution id.")],
) -> None:
    """Cancel a pending or running execution; running nodes are asked to stop."""
    parsed = _parse_uuid(execution_id)
    with _embedded_schema():
        _service().cancel(parsed)
    render.out.print(f"execution {parsed} cancelled", markup=False)


# -- commands: demo --------------------------------------------------------------------------


@app.command("demo")
def demo() -> None:
    """Apply the examples and run two of them here, with live progress (no setup needed)."""
    if not get_settings().embedded:
        fail(
            "conveyor demo runs its own workers in this process and needs the embedded "
            "default; unset CONVEYOR_BROKER_URL, or apply examples/ and run them on your "
            "workers (CONVEYOR_IMPORTS=conveyor.demo)"
        )
    from conveyor import demo as demo_nodes  # registers the examples' node functions

    files = sorted(p for p in EXAMPLES.iterdir() if p.suffix in SUFFIXES)
    with _workers_if_embedded():
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
    execution_id = _service().trigger(name, payload, source=TriggerSource.CLI)
    view = wait_for(execution_id, timeout=60, live=True)
    render.print_outcome(view)
    return view["status"] == ExecutionStatus.COMPLETED


# -- sub-commands in their own modules (they import the helpers above) -----------------------

from conveyor.cli_access import keys_app, serve, webhooks_app  # noqa: E402
from conveyor.cli_dlq import dlq_app  # noqa: E402
from conveyor.cli_schedules import schedules_app  # noqa: E402
from conveyor.cli_stats import stats  # noqa: E402

app.add_typer(schedules_app, name="schedules")
app.add_typer(keys_app, name="keys")
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(dlq_app, name="dlq")
app.command("stats")(stats)
app.command("api")(serve)
