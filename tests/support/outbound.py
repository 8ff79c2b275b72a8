"""Letting the http node reach the tests' servers on loopback, as an operator would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor.config import get_settings


@contextmanager
def http_allowed(*entries: str) -> Iterator[None]:
    """``CONVEYOR_HTTP_ALLOW`` set to ``entries`` for the process (the in-process worker reads
    it too) while the block runs."""
    before = os.environ.get("CONVEYOR_HTTP_ALLOW")
    os.environ["CONVEYOR_HTTP_ALLOW"] = ",".join(entries)
    get_settings.cache_clear()
    try:
        yield
    finally:
        if before is None:
            del os.environ["CONVEYOR_HTTP_ALLOW"]
        else:
            os.environ["CONVEYOR_HTTP_ALLOW"] = before
        get_settings.cache_clear()
