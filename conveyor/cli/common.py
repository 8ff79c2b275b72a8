"""What every sub-command of ``conveyor`` shares: the options they have in common, how they
end with a user's error, the embedded database's first use, and the embedded workers a command
runs to carry its work to its end. It imports no sub-command, and at its top nothing the root
of ``conveyor`` does not need (``conveyor --version`` imports it)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from conveyor.engine.states import ExecutionStatus

if TYPE_CHECKING:
    from conveyor import views

POLL_SECONDS = 0.2

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
    from conveyor.cli import render

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


def parse_time(raw: str | None, option: str = "--at") -> datetime | None:
    """The value of an ``--at`` option (ISO 8601), or a usage error saying what to give. A
    time without an offset is left naive: the trigger refuses it, naming the fix."""
    if raw is None:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        usage_error(f"{option} is not an ISO 8601 time: {raw!r}; give e.g. 2030-01-01T09:00Z")


def load_imports() -> None:
    """Import the modules of CONVEYOR_IMPORTS (they register node functions); a module that
    will not import is a ConfigurationError saying which and what to do."""
    from conveyor import wiring

    wiring.load_imports()


@contextmanager
def embedded_schema() -> Iterator[None]:
    """The embedded database is migrated on first use; production runs `conveyor db upgrade`."""
    from conveyor import migrations
    from conveyor.config import get_settings

    if get_settings().embedded:
        migrations.upgrade()
    yield


@contextmanager
def workers_if_embedded() -> Iterator[bool]:
    """On the embedded default, migrate and run worker threads in this process; yield whether
    it did. A command that publishes work needs them: the in-process broker's messages are
    gone when the command exits, so it waits for the work to finish first."""
    from conveyor import migrations
    from conveyor.config import get_settings

    if not get_settings().embedded:
        yield False
        return
    from conveyor.embedded import embedded_workers

    load_imports()
    migrations.upgrade()
    with embedded_workers():
        yield True


def execution_view(execution_id: uuid.UUID) -> views.ExecutionJson:
    from conveyor import views, wiring

    with wiring.database().transaction() as store:
        return views.execution_view(store, execution_id)


def wait_for(
    execution_id: uuid.UUID, timeout: float | None, live: bool, *, until_waiting: bool = False
) -> views.ExecutionJson:
    """Poll the execution until it finishes or ``timeout`` seconds pass (with
    ``until_waiting``: or it only waits for an application event); the last view."""
    from conveyor import views
    from conveyor.cli import render

    deadline = None if timeout is None else time.monotonic() + timeout
    with render.live_progress(live) as show:
        while True:
            view = execution_view(execution_id)
            show(view)
            if ExecutionStatus(view["status"]).finished:
                return view
            if until_waiting and views.waits_for_events_only(view):
                return view
            if deadline is not None and time.monotonic() >= deadline:
                return view
            time.sleep(POLL_SECONDS)


def who_fires(whose: str) -> str:
    """What starts a schedule's runs in this deployment, said after a schedule is added or
    resumed, or a definition that declares some is applied: ``whose`` begins the sentence
    ("its", "the schedules of nightly: their")."""
    from conveyor.config import get_settings

    if get_settings().embedded:
        return (
            f"{whose} runs start while `conveyor api` or `conveyor worker` runs (the embedded "
            f"default has no beat): keep one of them running"
        )
    return (
        f"{whose} runs start while `celery -A conveyor.tasks beat` runs, with workers serving "
        f"workflow-scheduled and the workflow's queues"
    )
