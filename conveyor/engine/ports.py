"""The narrow ports the engine talks through. Real adapters: :mod:`conveyor.store.sql`
(the store) and :mod:`conveyor.tasks.dispatch` (the dispatcher)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conveyor.engine.records import Dispatch


class Dispatcher(Protocol):
    """Publishes job ids to the broker. Called only after the transaction has committed."""

    def publish(self, dispatches: Sequence[Dispatch]) -> None: ...
