"""``conveyor workflow``: validate, apply and list workflow definitions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from conveyor import views, wiring
from conveyor.cli import render
from conveyor.cli.common import JsonFlag, Tenant, embedded_schema, group, usage_error
from conveyor.cli.definitions import apply_files, apply_modules, check_files
from conveyor.store import DEFAULT_TENANT

workflow_app = group("Workflow definitions: validate, apply, list.")
Files = Annotated[
    list[Path], typer.Argument(metavar="FILE", help="Definition files (.yaml, .yml or .json).")
]


@workflow_app.command("validate")
def workflow_validate(files: Files) -> None:
    """Check definition files; print every problem; exit 1 if any file is invalid."""
    check_files(files, say_valid=True)


Modules = Annotated[
    list[str] | None,
    typer.Option(
        "--module",
        "-m",
        help="A module (importable from here) whose workflows written in Python "
        "(conveyor.Flow) are applied; repeat for more.",
    ),
]


@workflow_app.command("apply")
def workflow_apply(
    files: Annotated[
        list[Path] | None,
        typer.Argument(metavar="[FILE]...", help="Definition files (.yaml, .yml or .json)."),
    ] = None,
    modules: Modules = None,
    tenant: Tenant = DEFAULT_TENANT,
) -> None:
    """Validate definition files, or the flows of Python modules, and store each changed one
    as a new version."""
    if not files and not modules:
        usage_error("name definition files, or modules with --module")
    with embedded_schema():
        if modules:
            apply_modules(modules, tenant)
        if files:
            apply_files(files, tenant)


@workflow_app.command("list")
def workflow_list(tenant: Tenant = DEFAULT_TENANT, as_json: JsonFlag = False) -> None:
    """The latest version of every workflow of a tenant."""
    with embedded_schema(), wiring.database().transaction() as store:
        rows = [views.workflow_json(r) for r in store.list_workflows(store.tenant_id(tenant))]
    if as_json:
        render.print_json(rows)
    else:
        render.out.print(render.workflows_table(rows) if rows else "no workflows; apply one")
