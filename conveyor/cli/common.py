"""What every sub-command of ``conveyor`` shares: the options they have in common, how they
end with a user's error, and the embedded database's first use. It imports no sub-command."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer

from conveyor import migrations, wiring
from conveyor.cli import render
from conveyor.config import get_settings

Tenant = Annotated[str, typer.Option("--tenant", "-t", help="Tenant name.")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (see docs/cli.md).")]


def group(help: str, **kwargs: Any) -> typer.Typer:
    """A command group (the root's or a sub-command's): its help when called bare."""
    return typer.Typer(
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        **kwargs,
    )


def fail(message: str, code: int = 1) -> NoReturn:
    render.err.print(message, style="red", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    fail(message, code=2)


def parse_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        usage_error(f"{value!r} is not an id (a UUID); list them with `conveyor executions list`")


def parse_input(raw: str) -> Any:
    """The value of an ``--input`` option, or a usage error naming where its JSON breaks."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        usage_error(f"--input is not valid JSON ({exc.msg} at column {exc.colno}): {raw}")


def load_imports() -> None:
    """Import the modules of CONVEYOR_IMPORTS (they register node functions); a module that
    will not import is a ConfigurationError saying which and what to do."""
    wiring.load_imports()


@contextmanager
def embedded_schema() -> Iterator[None]:
    """The embedded database is migrated on first use; production runs `conveyor db upgrade`."""
    if get_settings().embedded:
        migrations.upgrade()
    yield
