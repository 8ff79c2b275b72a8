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

import gc
import importlib
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from conveyor.cli.common import fail, group, usage_error
from conveyor.exceptions import ConveyorError


@dataclass(frozen=True)
class _Entry:
    """A command of the root: where it is defined (a Typer group, or a function that is one
    command), and its line in ``conveyor --help``."""

    module: str
    attribute: str
    help: str

    def load(self, name: str) -> Any:
        """The click command, its module imported now (with what that module imports)."""
        found = getattr(importlib.import_module(self.module), self.attribute)
        if not isinstance(found, typer.Typer):
            found, command = group(self.help), found
            found.command(name)(command)  # one command and no callback: a command, no group
        return typer.main.get_command(found)


# The root's commands, in the order --help lists them. A command's module is imported only
# when it runs (or its own --help is asked): each command pays for its own imports, not for
# every command's (SQLAlchemy, Celery, the API). Each line of help is the command's own first
# line (tests/unit/test_cli_imports.py holds them together).
COMMANDS = {
    "limits": _Entry(
        "conveyor.cli.tenants",
        "limits_show",
        "Permits in use against each limit, and the jobs waiting for one.",
    ),
    "run": _Entry(
        "conveyor.cli.executions",
        "run",
        "Start an execution (applying NAME_OR_FILE first if it is a file).",
    ),
    "demo": _Entry(
        "conveyor.cli.executions",
        "demo",
        "Apply the examples and run two of them here, with live progress (no setup needed).",
    ),
    "stats": _Entry(
        "conveyor.cli.stats",
        "stats",
        "Queue depth, jobs, latency, throughput, errors, dead letters, permits, schedule lag.",
    ),
    "api": _Entry(
        "conveyor.cli.access",
        "serve",
        "Serve the REST API, the webhook receiver and live streams (OpenAPI at /docs).",
    ),
    "ui": _Entry(
        "conveyor.cli.ui",
        "ui",
        "Serve the web dashboard (/ui) with the API, and print a new key to sign in with.",
    ),
    "worker": _Entry(
        "conveyor.cli.worker",
        "worker",
        "Run the embedded workers and the schedules until Ctrl-C (embedded default only).",
    ),
    "db": _Entry("conveyor.cli.database", "db_app", "The database schema."),
    "workflow": _Entry(
        "conveyor.cli.workflows", "workflow_app", "Workflow definitions: validate, apply, list."
    ),
    "executions": _Entry(
        "conveyor.cli.executions",
        "executions_app",
        "Executions: list, count, show, watch, cancel, rerun.",
    ),
    "tenants": _Entry("conveyor.cli.tenants", "tenants_app", "Tenants."),
    "schedules": _Entry(
        "conveyor.cli.schedules",
        "schedules_app",
        "Cron schedules: list, add, pause, resume, remove.",
    ),
    "keys": _Entry("conveyor.cli.access", "keys_app", "API keys: each acts for one tenant."),
    "webhooks": _Entry(
        "conveyor.cli.access",
        "webhooks_app",
        "Webhook endpoints: where third parties post signed deliveries.",
    ),
    "dlq": _Entry("conveyor.cli.dlq", "dlq_app", "Dead letters: list, show, requeue, discard."),
    "events": _Entry(
        "conveyor.cli.events",
        "events_app",
        "Application events: send one (it starts subscribers and wakes waits).",
    ),
    "approvals": _Entry(
        "conveyor.cli.approvals",
        "approvals_app",
        "Approvals: list those waiting for a decision, approve or reject one.",
    ),
}


class _Listed(TyperCommand):
    """A command as the root's --help lists it; the real one is built when it runs."""

    def __init__(self, name: str, entry: _Entry) -> None:
        super().__init__(name, help=entry.help)
        self.entry = entry

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        real = self.entry.load(self.name or "")
        return real.make_context(info_name, args, parent=parent, **extra)


class _Group(TyperGroup):
    """The root: its commands loaded as they run; every user-caused error ends with a clear
    message instead of a traceback."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = COMMANDS.get(cmd_name)
        return None if entry is None else _Listed(cmd_name, entry)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ConveyorError as exc:
            fail(str(exc))
        except Exception as exc:
            message = _infrastructure_error(exc)
            if message is None:
                raise
            fail(message)


_LIBRARIES = ("pydantic_core", "pydantic_settings", "sqlalchemy")  # whose errors are the user's


def _infrastructure_error(exc: Exception) -> str | None:
    """What to tell the user of bad settings or an unreachable database; None for any other
    error (a usage error, an exit: nothing is imported to tell those apart)."""
    if type(exc).__module__.partition(".")[0] not in _LIBRARIES:
        return None
    from pydantic import ValidationError
    from pydantic_settings import SettingsError
    from sqlalchemy.exc import SQLAlchemyError

    from conveyor import migrations

    if isinstance(exc, SettingsError | ValidationError):
        return f"a CONVEYOR_* setting is invalid: {exc}"
    if isinstance(exc, SQLAlchemyError):
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return (
            f"database error on {migrations.display_url()}: {cause}; check that it is "
            f"reachable and migrated (`conveyor db upgrade`)"
        )
    return None


app = group("Durable DAG workflows on Celery.", cls=_Group)


def main() -> None:
    try:
        app()
    finally:
        # The interpreter's last collection at exit walked every module loaded, a quarter of a
        # short command's time (1.1 -> 0.85 s): it skips what is frozen (the OS frees it all).
        gc.freeze()


# Node failures and retries are in the tables already: errors only, unless asked; -q: none.
_LEVELS = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG}
QUIET = logging.CRITICAL + 1
# A server's log is what its operator reads (its start, each request, an error's traceback), as
# a worker's is: info and tracebacks unless -q or -vv says otherwise.
_SERVERS = {"api", "ui"}


def _log_format() -> str:
    """People read the CLI's logs; CONVEYOR_LOG_FORMAT, when set, still chooses. An invalid
    setting is the command's to report (--help still answers)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from conveyor.config import get_settings

    try:
        settings = get_settings()
    except (SettingsError, ValidationError):
        return "console"
    return settings.log_format if "log_format" in settings.model_fields_set else "console"


def _version(asked: bool) -> None:
    if asked:
        typer.echo(f"conveyor {importlib.metadata.version('conveyor')}")
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
    from conveyor import logs

    verbosity = max(verbose, 1 if ctx.invoked_subcommand in _SERVERS else 0)
    level = QUIET if quiet else _LEVELS[min(verbosity, 2)]
    logs.configure(_log_format(), level, tracebacks=verbosity > 0)
    # Python shows a warning (a deprecation in the user's node module) by default: so does this
    logging.getLogger("py.warnings").setLevel(QUIET if quiet else min(level, logging.WARNING))
