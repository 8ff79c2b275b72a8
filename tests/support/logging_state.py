"""This process's logging, put back after a test that configured it (the ``conveyor`` command,
run in-process, calls conveyor.logs.configure): its level and handlers would otherwise carry
over to the tests that follow."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


@contextmanager
def kept_logging() -> Iterator[None]:
    root, pool = logging.getLogger(), logging.getLogger("multiprocessing")
    warned = logging.getLogger("py.warnings")
    handlers, level, pool_handlers = root.handlers[:], root.level, pool.handlers[:]
    warned_level, show = warned.level, warnings.showwarning
    try:
        yield
    finally:
        root.handlers, pool.handlers = handlers, pool_handlers
        root.setLevel(level)
        warned.setLevel(warned_level)
        warnings.showwarning = show
        structlog.reset_defaults()
