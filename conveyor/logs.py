"""Structured logs: one JSON object a line (structlog), for our events and for Celery's and
every library's, with the level by meaning (a job received or completed is info, a retry
scheduled a warning, a dead letter an error) and the job's fields.

Workers and beat use it (``CONVEYOR_LOG_FORMAT``: ``json``, the default, or ``console`` for
people), and so does the ``conveyor`` command (``console`` unless the setting says otherwise),
always on stderr: stdout is a command's output. Events carry ids and names, never secrets,
inputs or outputs; an error message is cut at :data:`ERROR_CHARS` characters.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict

ERROR_CHARS = 300
# A dropped message is logged at info at most once this often (seconds), with the count since.
DROPPED_EVERY = 10.0


def configure(
    fmt: str = "json", level: int | str = logging.INFO, *, tracebacks: bool = True
) -> None:
    """Send every log record, ours, the libraries' and Python's warnings, through one structlog
    formatter to stderr (stdout is a command's output). Without ``tracebacks`` an exception is
    cut to one line: its type and message."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if tracebacks else _exception_in_one_line,
            renderer,
        ],
    )
    handler = _StderrHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # The worker pool (billiard) logs to "multiprocessing", which does not propagate: without
    # the handler, a pool process's death would be a raw line from logging's last resort.
    logging.getLogger("multiprocessing").handlers = [handler]
    # warnings.warn (Celery's SecurityWarning, a library's deprecation) would otherwise write
    # its own lines to stderr, in neither format: as records of "py.warnings" they are ours.
    warnings.showwarning = _log_warning


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stderr`` of the moment, as logging's last resort does: a stream
    swapped after set-up (a test runner's capture) is followed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning as one record of "py.warnings" (as logging.captureWarnings makes them), on one
    line: its category, its text with the line breaks folded, and where it was raised."""
    text = " ".join(str(message).split())
    logging.getLogger("py.warnings").warning(
        "%s: %s (%s:%s)", category.__name__, text, filename, lineno
    )


def _exception_in_one_line(_: Any, __: str, event: EventDict) -> EventDict:
    """An event's exception as ``raised="Type: message"`` on its own line, no traceback."""
    exc_info = event.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(error, BaseException):
        event["raised"] = short(f"{type(error).__name__}: {error}")
    return event


def get(name: str) -> Any:
    """A structured logger; its events go through :func:`configure`'s formatter."""
    return structlog.stdlib.get_logger(name)


def short(message: str) -> str:
    return message if len(message) <= ERROR_CHARS else message[: ERROR_CHARS - 1] + "…"


class Flood:
    """An event that may come by the thousand (a stale message dropped after a broker outage):
    the first after a quiet spell is logged in full, the rest of each ``every`` seconds are
    only counted, and the next full line says how many there were."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._logged_at: float | None = None
        self._since = 0

    def admit(self) -> int | None:
        """How many went uncounted since the last full line, when this one is to be logged in
        full; None when it is only counted (log it at debug)."""
        with self._lock:
            now = self._clock()
            if self._logged_at is not None and now - self._logged_at < self.every:
                self._since += 1
                return None
            since, self._since, self._logged_at = self._since, 0, now
            return since


_jobs = get("conveyor.jobs")
_dropped = Flood(DROPPED_EVERY)


def message_dropped(job_id: uuid.UUID, reason: str) -> None:
    """A message whose job was done or taken by another message: a duplicate, which every
    re-send may make, harmless. At info once every :data:`DROPPED_EVERY` seconds (with how
    many more there were), at debug otherwise."""
    since = _dropped.admit()
    if since is None:
        _jobs.debug("message dropped", job_id=str(job_id), reason=reason)
    else:
        _jobs.info("message dropped", job_id=str(job_id), reason=reason, more_dropped=since)
