"""A batch message on a worker: its node jobs run one after another, and those not started
are handed back once the message runs past its budget. Which jobs share a message is decided
before it is sent, by the pure :mod:`conveyor.engine.packing`.

The hand-back keeps slow siblings parallel: once the batch has run for its budget, or one of
its jobs for a quarter of it (``JOB_SHARE``), the jobs not started are published again, one a
message, for any free worker. The worker that held them runs at most the one it was about to
start. While a job runs past that point (an HTTP call of a second), a thread the process keeps
hands the rest back at that moment, so they never wait for it: eight siblings of 40 ms in a
message start within some 13 ms of each other with the default budget (0.05 s), not one
after another. A node that took longer than that share the last time this process ran it
has the rest handed back before it starts (:class:`Durations`), so known-slow siblings wait
for nothing. A job handed back is still ``queued`` in the database: its new message is an
ordinary one, and a duplicate of it is dropped at its claim as any duplicate is.
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
# How much of the budget one job may take before the rest is handed back. Not the budget over
# the batch's size: that share is a few ms, which a small node's whole path (permits, claim,
# outcome) overruns on a busy machine, when handing back gains nothing.
JOB_SHARE = 0.25


class BatchRun:
    """The jobs of one message, taken in order by :meth:`take` until they run out or are
    handed back. ``hand_back`` publishes the given members one a message."""

    def __init__(
        self,
        members: Sequence[Member],
        budget: float,
        hand_back: Callable[[list[Member]], None],
        slow: Callable[[Member, float], bool] = lambda _, __: False,
    ) -> None:
        self._pending = deque(members)
        self._lock = threading.Lock()
        self._hand_back = hand_back
        self._slow = slow
        self._share = budget * JOB_SHARE
        now = time.monotonic()
        self._end = now + budget
        self.deadline = min(self._end, now + self._share)  # of the job running now

    def take(self) -> Member | None:
        """The next job to run, or None when none is left. The rest is handed back first
        when the deadline passed (the batch's budget, or the last job's share of it) or when
        ``slow`` says the job handed out now took longer than a share here before: this
        worker is free for one, others for the rest."""
        with self._lock:
            if not self._pending:
                return None
            taken = self._pending.popleft()
            now = time.monotonic()
            late = now >= self.deadline or self._slow(taken, self._share)
            rest = self._take_rest() if late else []
            self.deadline = min(self._end, now + self._share)
        if rest:
            self._hand_back(rest)
        return taken

    def hand_back_rest(self) -> None:
        """Hand back every job not started: a job ran past the deadline, or its run raised."""
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
    slow: Callable[[Member, float], bool] = lambda _, __: False,
) -> None:
    """Run each member with ``run``, in order, handing back the rest past ``budget`` (or
    before a job ``slow`` expects to take more than its share: see :class:`BatchRun`). A job
    whose run raises (the limiter or the database unreachable) has the rest handed back, each
    to its own fate, and the error goes on to the message as a single job's would."""
    batch = BatchRun(members, budget, hand_back, slow)
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


class Durations:
    """How long each node (workflow version, node id) ran the last time this process ran it:
    what a batch reads to hand back the rest before a node known to be slow."""

    def __init__(self, most: int = 10_000) -> None:
        self._last: dict[tuple[uuid.UUID, str], float] = {}
        self._most = most

    def record(self, workflow_id: uuid.UUID, node_id: str, seconds: float) -> None:
        if len(self._last) >= self._most:
            self._last.clear()
        self._last[(workflow_id, node_id)] = seconds

    def slow(self, member: Member, share: float) -> bool:
        """Whether the member's node ran longer than ``share`` the last time here."""
        hints = member[1]
        if hints is None or hints.node_id is None:
            return False
        return self._last.get((hints.workflow_id, hints.node_id), 0.0) > share


_ALARM = _Alarm()
# A forked child has none of its parent's threads, and a lock one of them held stays held.
os.register_at_fork(after_in_child=_ALARM._reset)
