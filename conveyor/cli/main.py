"""The root of the ``conveyor`` command: its sub-commands, gathered from their modules, and
how it ends a user's error.

Errors a user can cause (:class:`ConveyorError`, bad settings, an unreachable database) end as a
red message on stderr and exit status 1, never a traceback; usage errors exit with 2. With no
broker configured (the embedded default) ``conveyor run``, ``conveyor demo`` and ``conveyor dlq
requeue`` migrate the SQLite database and run Celery worker threads inside this process until
their work is done; ``conveyor api`` and ``conveyor worker`` run them, and the schedules, until
they are stopped.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from sqlalchemy.exc import SQLAlchemyError
from typer.core import TyperGroup

from conveyor import logs, migrations
from conveyor.cli import render
from conveyor.cli.access import keys_app, serve, webhooks_app
from conveyor.cli.common import fail, group, usage_error
from conveyor.cli.database import db_app
from conveyor.cli.dlq import dlq_app
from conveyor.cli.executions import demo, executions_app, run
from conveyor.cli.schedules import schedules_app
from conveyor.cli.stats import stats
from conveyor.cli.tenants import limits_show, tenants_app
from conveyor.cli.worker import worker
from conveyor.cli.workflows import workflow_app
from conveyor.config import get_settings
from conveyor.exceptions import ConveyorError


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


app = group("Durable DAG workflows on Celery.", cls=_Group)
# --help lists the commands, then the groups, each in the order they are added here.
app.command("limits")(limits_show)
app.command("run")(run)
app.command("demo")(demo)
app.command("stats")(stats)
app.command("api")(serve)
app.command("worker")(worker)
app.add_typer(db_app, name="db")
app.add_typer(workflow_app, name="workflow")
app.add_typer(executions_app, name="executions")
app.add_typer(tenants_app, name="tenants")
app.add_typer(schedules_app, name="schedules")
app.add_typer(keys_app, name="keys")
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(dlq_app, name="dlq")


def main() -> None:
    app()


# Node failures and retries are in the tables already: errors only, unless asked; -q: none.
_LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG}
QUIET = logging.CRITICAL + 1
# A server's log is what its operator reads (its start, each request, an error's traceback), as
# a worker's is: info and tracebacks unless -q or -vv says otherwise.
_SERVERS = {"api"}


def _log_format() -> str:
    """People read the CLI's logs; CONVEYOR_LOG_FORMAT, when set, still chooses. An invalid
    setting is the command's to report (--help still answers)."""
    try:
        settings = get_settings()
    except (SettingsError, ValidationError):
        return "console"
    return settings.log_format if "log_format" in settings.model_fields_set else "console"


def _version(asked: bool) -> None:
    if asked:
        render.out.print(f"conveyor {importlib.metadata.version('conveyor')}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            show_default=False,
            help="Log warnings and info (-vv: and debug) to stderr.",
        ),
    ] = 0,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Log nothing, not even errors (the command's own messages stay)."
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    if verbose and quiet:
        usage_error("-v and -q contradict each other; give one")
    verbosity = max(verbose, 1 if ctx.invoked_subcommand in _SERVERS else 0)
    level = QUIET if quiet else _LEVELS[min(verbosity, 2)]
    logs.configure(_log_format(), level, tracebacks=verbosity > 0)
    # Python shows a warning (a deprecation in the user's node module) by default: so does this
    logging.getLogger("py.warnings").setLevel(QUIET if quiet else min(level, logging.WARNING))
