"""Watching the nodes a process runs: one thread per process, whatever the concurrency.

While a node runs, its execution may be cancelled (or fail elsewhere), and the recovery sweep
must be able to tell a long node from a dead worker. Every ``poll`` seconds the thread reads
the status of every watched execution in one query and sets the cancel flag of the nodes
whose execution stopped; every ``heartbeat_interval`` seconds it renews the heartbeat of
every watched job in one UPDATE, and a job it cannot renew was reclaimed: its node is told to
stop too. One thread and two batched statements, not a thread and a query per running node.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from conveyor.engine.node_types import NodeContext
from conveyor.engine.states import ExecutionStatus
from conveyor.store.unit_of_work import Database

log = logging.getLogger(__name__)
IDLE_EXIT = 30.0  # seconds with nothing to watch before the thread ends


@dataclass(frozen=True)
class _Watched:
    execution_id: uuid.UUID
    ctx: NodeContext


class Watcher:
    def __init__(self, db: Database, *, poll: float = 1.0, heartbeat_interval: float = 5.0):
        self.db = db
        self.poll = poll
        self.heartbeat_interval = heartbeat_interval
        self._watched: dict[uuid.UUID, _Watched] = {}
        self._lock = threading.Lock()
        self._pid: int | None = None  # the process the thread runs in (a fork has none)

    def watch(self, job_id: uuid.UUID, execution_id: uuid.UUID, ctx: NodeContext) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="conveyor-watcher", daemon=True).start()
            self._watched[job_id] = _Watched(execution_id, ctx)

    def unwatch(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self._watched.pop(job_id, None)

    def _run(self) -> None:
        last_beat = idle_since = time.monotonic()
        while True:
            time.sleep(self.poll)
            now = time.monotonic()
            with self._lock:
                watched = dict(self._watched)
                if not watched and now - idle_since > IDLE_EXIT:
                    self._pid = None  # the next watch starts a thread again
                    return
            if not watched:
                last_beat = now  # a claim has just set the heartbeat of whatever comes next
                continue
            idle_since = now
            beat = now - last_beat >= self.heartbeat_interval
            try:
                self.check(watched, beat)
            except Exception:  # keep watching: a passing database error must not end it
                log.warning("could not check %d running node(s)", len(watched), exc_info=True)
                continue
            if beat:
                last_beat = now

    def check(self, watched: dict[uuid.UUID, _Watched], beat: bool) -> None:
        """One round: cancel flags from the executions' statuses, and heartbeats if due."""
        with self.db.transaction() as store:
            renewed = store.heartbeat(watched, datetime.now(UTC)) if beat else set(watched)
            statuses = store.execution_statuses({w.execution_id for w in watched.values()})
        for job_id, w in watched.items():
            stopped = statuses.get(w.execution_id, ExecutionStatus.RUNNING).finished
            if stopped or job_id not in renewed:
                w.ctx.cancel_event.set()
