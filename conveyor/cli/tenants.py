"""``conveyor tenants`` and ``conveyor limits``: tenants, their concurrency limits, and the
permits in use against them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from conveyor import wiring
from conveyor.cli import render
from conveyor.cli.common import JsonFlag, embedded_schema, group, usage_error
from conveyor.config import get_settings
from conveyor.exceptions import TenantNotFound

tenants_app = group("Tenants.")
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
    with embedded_schema(), wiring.database().transaction() as store:
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
    with embedded_schema(), wiring.database().transaction() as store:
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
    with embedded_schema(), wiring.database().transaction() as store:
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


def limits_show(as_json: JsonFlag = False) -> None:
    """Permits in use against each limit, and the jobs waiting for one."""
    settings = get_settings()
    limiter = wiring.limiter()
    if limiter is None:
        why = "the embedded default" if settings.embedded else "CONVEYOR_LIMITS_ENABLED=false"
        render.out.print(f"concurrency limits are off ({why})", markup=False)
        return
    usages = limiter.snapshot()
    with wiring.database().transaction() as store:
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
