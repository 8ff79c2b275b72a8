"""``conveyor ui``: the web dashboard on the embedded default, with one command."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from conveyor import wiring
from conveyor.cli import render
from conveyor.cli.common import embedded_schema
from conveyor.config import get_settings
from conveyor.engine import credentials
from conveyor.store import DEFAULT_TENANT


def ui(
    host: Annotated[str | None, typer.Option(help="Default: CONVEYOR_API_HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: CONVEYOR_API_PORT.")] = None,
    tenant: Annotated[str, typer.Option(help="The tenant the new key signs in to.")] = (
        DEFAULT_TENANT
    ),
) -> None:
    """Serve the web dashboard (/ui) with the API, and print a new key to sign in with."""
    from conveyor.api.server import serve as serve_api

    settings = get_settings()
    made = credentials.new_api_key()
    now = datetime.now(UTC)
    with embedded_schema():
        wiring.database().run(
            lambda s: s.add_api_key(s.tenant_id(tenant), "ui", made.prefix, made.digest, now)
        )
    where = f"http://{host or settings.api_host}:{port or settings.api_port}/ui"
    render.err.print(
        f"conveyor ui: open {where} and sign in with this key of tenant {tenant} (shown "
        f"once; revoke it with `conveyor keys revoke`):\n{made.key}",
        markup=False,
        soft_wrap=True,
    )
    serve_api(host or settings.api_host, port or settings.api_port, settings)
