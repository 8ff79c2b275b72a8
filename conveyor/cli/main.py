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

from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from sqlalchemy.exc import SQLAlchemyError
from typer.core import TyperGroup

from conveyor import migrations
from conveyor.cli import render
from conveyor.cli.access import keys_app, serve, webhooks_app
from conveyor.cli.common import fail, group
from conveyor.cli.database import db_app
from conveyor.cli.dlq import dlq_app
from conveyor.cli.executions import demo, executions_app, run
from conveyor.cli.schedules import schedules_app
from conveyor.cli.stats import stats
from conveyor.cli.tenants import limits_show, tenants_app
from conveyor.cli.worker import worker
from conveyor.cli.workflows import workflow_app
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


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log warnings and info.")
    ] = False,
) -> None:
    render.setup_logging(verbose)
