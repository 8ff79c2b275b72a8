"""Structured logs: one JSON object a line (structlog), for our events and for Celery's and
every library's, with the level by meaning (a job received or completed is info, a retry
scheduled a warning, a dead letter an error) and the job's fields.

Workers and beat use it (``CONVEYOR_LOG_FORMAT``: ``json``, the default, or ``console`` for
people). Events carry ids and names, never secrets, inputs or outputs; an error message is
cut at :data:`ERROR_CHARS` characters.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

ERROR_CHARS = 300


def configure(fmt: str = "json", level: int | str = logging.INFO) -> None:
    """Send every log record, ours and the libraries', through one structlog formatter."""
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
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)


def get(name: str) -> Any:
    """A structured logger; its events go through :func:`configure`'s formatter."""
    return structlog.stdlib.get_logger(name)


def short(message: str) -> str:
    return message if len(message) <= ERROR_CHARS else message[: ERROR_CHARS - 1] + "…"
