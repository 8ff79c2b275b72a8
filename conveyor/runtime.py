"""Process-wide wiring: settings -> database, Celery app, service. Built once, lazily."""

from __future__ import annotations

import importlib
import socket
import threading
from functools import lru_cache

from conveyor.config import get_settings
from conveyor.store import Database

_imported: set[str] = set()
_lock = threading.Lock()


@lru_cache(maxsize=1)
def database() -> Database:
    return Database(get_settings().resolved_database_url)


def load_imports(extra: list[str] | None = None) -> None:
    """Import the modules that register node functions (CONVEYOR_IMPORTS)."""
    with _lock:
        for module in [*get_settings().imports, *(extra or [])]:
            if module not in _imported:
                importlib.import_module(module)
                _imported.add(module)


def worker_name() -> str:
    return f"{socket.gethostname()}:{threading.get_native_id()}"
