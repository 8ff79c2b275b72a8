"""A batch message on a worker: its node jobs run one after another, and those not started
are handed back once the message has run past its budget (see :mod:`conveyor.engine.batching`).

The hand-back keeps a slow node's siblings parallel: past the budget, the jobs of the message
that have not started are published again, one a message, for any free worker; the worker
that held them runs at most the one it was about to start. While a node runs past the budget
(an HTTP call of seconds), a thread the process keeps hands the rest back at the deadline, so
they never wait for it. A job handed back is still ``queued`` in the database: its new
message is an ordinary one, and a duplicate of it is dropped at its claim as any duplicate is.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from conveyor.engine.records import NodeHints

Member = tuple[uuid.UUID, NodeHints | None]


class BatchRun:
    """The jobs of one message, taken in order by :meth:`take` until they run out or are
    handed back. ``hand_back`` publishes the given members one a message."""

    def __init__(
        self,
        members: Sequence[Member],
        budget: float,
        hand_back: Callable[[list[Member]], None],
    ) -> None:
        self._pending = deque(members)
        self._lock = threading.Lock()
        self._hand_back = hand_back
        self.deadline = time.monotonic() + budget

    def take(self) -> Member | None:
        """The next job to run, or None when none is left. Past the deadline the rest but
        the one taken is handed back first: this worker is free for one, others for the rest."""
        with self._lock:
            if not self._pending:
                return None
            taken = self._pending.popleft()
            rest = self._take_rest() if time.monotonic() >= self.deadline else []
        if rest:
            self._hand_back(rest)
        return taken

    def hand_back_rest(self) -> None:
        """Hand back every job not started: the deadline passed while a job ran, or a job's
        run raised."""
        with self._lock:
            rest = self._take_rest()
        if rest:
            self._hand_back(rest)

    def _take_rest(self) -> list[Member]:
        rest = list(self._pending)
        self._pending.clear()
        return rest


def run_batch(
    members: Sequence[Member],
    budget: float,
    hand_back: Callable[[list[Member]], None],
    run: Callable[[uuid.UUID, NodeHints | None], None],
) -> None:
    """Run each member with ``run``, in order, handing back the rest past ``budget``. A job
    whose run raises (the limiter or the database unreachable) has the rest handed back, each
    to its own fate, and the error goes on to the message as a single job's would."""
    batch = BatchRun(members, budget, hand_back)
    with _ALARM.watching(batch) if len(members) > 1 else nullcontext():
        while (member := batch.take()) is not None:
            try:
                run(*member)
            except BaseException:
                batch.hand_back_rest()
                raise


class _Alarm:
    """One thread per process that hands back the rest of each batch whose deadline passed
    while a job of it ran (a pool process runs one batch at a time; the embedded worker's
    threads, several). Started at the first batch of the process, again in a forked child."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._batches: set[BatchRun] = set()
        self._thread: threading.Thread | None = None

    def watching(self, batch: BatchRun) -> _Watching:
        return _Watching(self, batch)

    def add(self, batch: BatchRun) -> None:
        with self._cond:
            self._batches.add(batch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="conveyor-batch-alarm", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def remove(self, batch: BatchRun) -> None:
        with self._cond:
            self._batches.discard(batch)

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                now = time.monotonic()
                due = [b for b in self._batches if b.deadline <= now]
                if not due:
                    nearest = min((b.deadline for b in self._batches), default=None)
                    cond.wait(None if nearest is None else nearest - now)
                    continue
                self._batches.difference_update(due)
            for batch in due:
                batch.hand_back_rest()


class _Watching:
    def __init__(self, alarm: _Alarm, batch: BatchRun) -> None:
        self._alarm, self._batch = alarm, batch

    def __enter__(self) -> None:
        self._alarm.add(self._batch)

    def __exit__(self, *_: object) -> None:
        self._alarm.remove(self._batch)


_ALARM = _Alarm()
# A forked child has none of its parent's threads, and a lock one of them held stays held.
os.register_at_fork(after_in_child=_ALARM._reset)
