"""``conveyor api``, ``conveyor keys`` and ``conveyor webhooks``: serving the HTTP API and the
credentials that reach it. Secrets (a key, an endpoint's secret) are printed once, when made,
and never again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from conveyor import views, wiring
from conveyor.cli import render
from conveyor.cli.common import JsonFlag, Tenant, embedded_schema, group, usage_error
from conveyor.config import get_settings
from conveyor.engine import credentials
from conveyor.engine.states import SignatureScheme
from conveyor.exceptions import ConveyorError
from conveyor.store import DEFAULT_TENANT

keys_app = group("API keys: each acts for one tenant.")
webhooks_app = group("Webhook endpoints: where third parties post signed deliveries.")
Name = Annotated[str, typer.Option("--name", help="A label to recognise it by.")]


def _now() -> datetime:
    return datetime.now(UTC)


def serve(
    host: Annotated[str | None, typer.Option(help="Default: CONVEYOR_API_HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: CONVEYOR_API_PORT.")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Also serve /metrics on this port, on CONVEYOR_METRICS_HOST. "
            "Default: CONVEYOR_METRICS_PORT (0: none).",
        ),
    ] = None,
) -> None:
    """Serve the REST API, the webhook receiver and live streams (OpenAPI at /docs)."""
    from conveyor.api.server import serve as serve_api

    settings = get_settings()
    if metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": metrics_port})
    serve_api(host or settings.api_host, port or settings.api_port, settings)


Operator = Annotated[
    bool,
    typer.Option(
        "--operator",
        help="An operator's key: its dashboard session sees every tenant (on /v1 it acts for "
        "--tenant only). Made only here, never through the API.",
    ),
]


@keys_app.command("create")
def keys_create(
    tenant: Tenant = DEFAULT_TENANT, name: Name = "", operator: Operator = False
) -> None:
    """Make an API key for a tenant; it is shown this once (only its hash is kept)."""
    made = credentials.new_api_key()
    with embedded_schema():
        wiring.database().run(
            lambda s: s.add_api_key(
                s.tenant_id(tenant), name, made.prefix, made.digest, _now(), operator=operator
            )
        )
    render.out.print(made.key, markup=False)
    kind = "operator key" if operator else "API key"
    render.err.print(
        f"{kind} {made.prefix} for tenant {tenant}: send it as `Authorization: Bearer <key>`; "
        f"it is not shown again",
        markup=False,
        soft_wrap=True,
    )


@keys_app.command("list")
def keys_list(tenant: Tenant = DEFAULT_TENANT, as_json: JsonFlag = False) -> None:
    """A tenant's keys, by prefix (the keys themselves are not kept)."""
    with embedded_schema(), wiring.database().transaction() as store:
        rows = [
            {
                "prefix": k.prefix,
                "name": k.name,
                "created_at": views.iso(k.created_at),
                "revoked_at": views.iso(k.revoked_at),
                "operator": k.operator,
            }
            for k in store.api_keys(store.tenant_id(tenant))
        ]
    if as_json:
        render.print_json(rows)
        return
    table = Table("prefix", "name", "created", "revoked", "operator", box=None)
    for r in rows:
        table.add_row(
            str(r["prefix"]), str(r["name"]), str(r["created_at"]), str(r["revoked_at"] or ""),
            "yes" if r["operator"] else "",
        )  # fmt: skip
    render.out.print(table if rows else "no keys")


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(metavar="PREFIX", help="As `keys list` shows it.")],
    tenant: Tenant = DEFAULT_TENANT,
) -> None:
    """Revoke a key at once: every call with it answers 401 from now on."""
    with embedded_schema():
        done = wiring.database().run(
            lambda s: s.revoke_api_key(s.tenant_id(tenant), prefix, _now())
        )
    if not done:
        raise ConveyorError(
            f"tenant {tenant!r} has no live key with prefix {prefix!r}; see `conveyor keys list`"
        )
    render.out.print(f"API key {prefix} revoked", markup=False)


@webhooks_app.command("create")
def webhooks_create(
    name: Annotated[str, typer.Argument(help="Workflows name it in `webhooks: [{endpoint: …}]`.")],
    scheme: Annotated[
        SignatureScheme, typer.Option(help="standard (Standard Webhooks) or github.")
    ] = SignatureScheme.STANDARD,
    secret: Annotated[
        str | None, typer.Option(help="The sender's secret; default: a new random one.")
    ] = None,
    tenant: Tenant = DEFAULT_TENANT,
    wakes_key: Annotated[
        str | None,
        typer.Option(
            help="Its deliveries wake wait nodes: the key they carry, a template over the "
            "delivery (event, payload, delivery_id), e.g. '{{ payload.data.order_id }}'."
        ),
    ] = None,
    wakes_event: Annotated[
        str | None,
        typer.Option(
            help="With --wakes-key: the event name the waits wait for (a template too); "
            "default: the delivery's type."
        ),
    ] = None,
) -> None:
    """Make a webhook endpoint; prints its URL path and, this once, its secret. With
    --wakes-key its deliveries also wake the wait nodes waiting for them, as an application
    event (conveyor events send) would."""
    if not 0 < len(name) <= 100:
        usage_error("an endpoint name has 1 to 100 characters")
    _check_wakes(wakes_key, wakes_event)
    chosen = secret or credentials.new_webhook_secret(scheme)
    if scheme is SignatureScheme.STANDARD:
        _check_standard_secret(chosen)
    wakes = {"wakes_event": wakes_event, "wakes_key": wakes_key}
    with embedded_schema():
        endpoint = wiring.database().run(
            lambda s: s.add_endpoint(s.tenant_id(tenant), name, scheme, chosen, _now(), **wakes)
        )
    render.out.print(f"/webhooks/{endpoint.id}", markup=False)
    shown = "the one you gave" if secret else f"{chosen} (not shown again)"
    render.err.print(
        f"endpoint {name} ({scheme.value}) for tenant {tenant}; secret: {shown}",
        markup=False,
        soft_wrap=True,
    )


def _check_wakes(key: str | None, event: str | None) -> None:
    from conveyor.engine import templates

    if event is not None and key is None:
        usage_error("--wakes-event needs --wakes-key: the key the woken waits wait for")
    for flag, value, most in (("--wakes-key", key, 500), ("--wakes-event", event, 200)):
        if value is None:
            continue
        if not value.strip() or len(value) > most:
            usage_error(f"{flag} has 1 to {most} characters")
        if problem := templates.syntax_error(value):
            usage_error(f"{flag} {value!r} does not parse: {problem}")


def _check_standard_secret(secret: str) -> None:
    from standardwebhooks import Webhook

    try:
        Webhook(secret)
    except Exception:
        usage_error("a Standard Webhooks secret is base64, optionally after 'whsec_'")


@webhooks_app.command("list")
def webhooks_list(tenant: Tenant = DEFAULT_TENANT, as_json: JsonFlag = False) -> None:
    """A tenant's endpoints with their URL paths and refused deliveries (no secrets)."""
    with embedded_schema(), wiring.database().transaction() as store:
        rows = [
            {"name": e.name, "path": f"/webhooks/{e.id}", "scheme": e.scheme.value,
             "rejected": e.rejected, "wakes_event": e.wakes_event, "wakes_key": e.wakes_key}
            for e in store.endpoints(store.tenant_id(tenant))
        ]  # fmt: skip
    if as_json:
        render.print_json(rows)
        return
    table = Table("name", "path", "scheme", "refused", box=None)
    for r in rows:
        table.add_row(str(r["name"]), str(r["path"]), str(r["scheme"]), str(r["rejected"]))
    render.out.print(table if rows else "no webhook endpoints")
