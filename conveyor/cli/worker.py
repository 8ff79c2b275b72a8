"""``conveyor worker``: the embedded default's long-running process. It runs the Celery worker
threads and what celery beat sends in production (the cron check, the recovery and retention
sweeps) until Ctrl-C or SIGTERM, so that schedules fire without the API."""

from __future__ import annotations

import signal
import threading
from types import FrameType

from conveyor import migrations
from conveyor.cli import render
from conveyor.cli.common import fail, load_imports
from conveyor.config import get_settings


def worker() -> None:
    """Run the embedded workers and the schedules until Ctrl-C (embedded default only)."""
    settings = get_settings()
    if not settings.embedded:
        fail(
            "conveyor worker runs the embedded default's workers; with CONVEYOR_BROKER_URL set, "
            "run `celery -A conveyor.tasks worker` for the workers and `celery -A conveyor.tasks "
            "beat` for the schedules (see the README, Run it in production)"
        )
    from conveyor.embedded import embedded_beat, embedded_workers

    load_imports()
    migrations.upgrade()
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGTERM, on_term)
    with embedded_workers(), embedded_beat():
        render.err.print(
            f"conveyor worker: {settings.embedded_workers} worker threads and the schedules "
            f"on {migrations.display_url()}; Ctrl-C stops",
            markup=False,
            soft_wrap=True,
        )
        while not stop.wait(1):
            pass
    render.err.print("conveyor worker: stopped", markup=False)
