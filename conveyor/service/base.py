"""What every audience of the service stands on: the unit of work, the dispatcher, the limiter's
gate, and publishing only after a commit."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from conveyor.batches import Durations
from conveyor.engine import cancellation
from conveyor.engine.bounds import Bounds
from conveyor.engine.children import DEFAULT_MAX_DEPTH
from conveyor.engine.limits import Limits
from conveyor.engine.ports import Dispatcher, Limiter
from conveyor.engine.records import AfterCommit, Dispatch
from conveyor.engine.waits import DEFAULT_RETENTION
from conveyor.exceptions import LimitError
from conveyor.limiter.gate import BrokerHolds, Gate
from conveyor.store import Database, SqlStore
from conveyor.watcher import Watcher

log = logging.getLogger("conveyor")


# Transactions one call of ServiceBase._stop_orphans runs at most (a share of children each).
ORPHAN_ROUNDS = 100


def utcnow() -> datetime:
    return datetime.now(UTC)


class ServiceBase:
    """The state the audiences share; each audience (:mod:`~conveyor.service.clients`,
    :mod:`~conveyor.service.workers`, :mod:`~conveyor.service.duties`,
    :mod:`~conveyor.service.operators`) adds its methods, :class:`~conveyor.service.Conveyor`
    all of them."""

    def __init__(
        self,
        database: Database,
        dispatcher: Dispatcher,
        *,
        worker: str = "",
        limiter: Limiter | None = None,
        limits: Limits | None = None,
        lease: float = 30.0,
        age_low_after: float = 300.0,
        misfire_grace: float = 120.0,
        resend_after: float = 60.0,
        broker_holds: BrokerHolds = lambda: None,
        replay_window: timedelta = timedelta(days=30),
        map_window: int = 1000,
        continue_steps: int = 16,
        max_child_depth: int = DEFAULT_MAX_DEPTH,
        bounds: Bounds | None = None,
        event_retention: timedelta = DEFAULT_RETENTION,
    ) -> None:
        self.db = database
        # how long an event with a key is kept for the wait nodes that begin after it
        self.event_retention = event_retention
        self.map_window = map_window  # a map's items queued or running at once (at most)
        # a chain's steps a worker runs in a row without a message (0: none)
        self.continue_steps = continue_steps
        # the size bounds (CONVEYOR_MAX_*): here, a map's items and its assembled output
        self.bounds = bounds or Bounds()
        self.max_child_depth = max_child_depth  # how deep child executions may nest
        self.replay_window = replay_window  # a GitHub body received again in it is refused
        self.dispatcher = dispatcher
        self.worker = worker
        self.age_low_after = age_low_after
        self.misfire_grace = misfire_grace
        self.watcher = Watcher(database)
        self.durations = Durations()  # of the nodes this process ran (for batches)
        self._rng = random.Random()
        self.gate = (
            Gate(
                database,
                limiter,
                defaults=limits or Limits(global_=100, tenant=10, workflow=5),
                lease=lease,
                publish=self._publish,
                resend_after=resend_after,
                broker_holds=broker_holds,
            )
            if limiter is not None
            else None
        )

    def _publish_now(self, dispatches: Sequence[Dispatch], what: str) -> None:
        """Publish for a caller that answers at once (an API call, the CLI) once its rows are
        committed. A failure is logged, never raised: the work is stored, the recovery sweep
        publishes it when the broker is back (see :meth:`Duties.recover`), and an error answer would
        invite a retry that starts it twice."""
        try:
            self.dispatcher.publish(dispatches)
        except Exception as exc:
            log.error(
                "%s is stored but its message could not be published (%s); the recovery sweep "
                "sends it once the broker is back: check CONVEYOR_BROKER_URL",
                what,
                exc,
            )

    def _after(self, after: AfterCommit) -> None:
        """What a committed transition left to do: the limiter forgets the jobs it cancelled,
        then its messages are published."""
        self._forget(after.forget)
        self._publish(after.dispatches)

    def _forget(self, job_ids: Sequence[uuid.UUID]) -> None:
        """The limiter forgets node jobs a committed transition cancelled before they ran:
        their places in its lines, and a grant one holds, go to the next jobs now, not at its
        sweep. A failure is logged, not raised: each is dropped when its turn comes."""
        if self.gate is None or not job_ids:
            return
        try:
            self.gate.forget(job_ids)
        except LimitError:
            log.warning("could not tell the limiter about %d cancelled jobs", len(job_ids))

    def _publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        if not dispatches:
            return
        try:
            self.dispatcher.publish(dispatches, batch=batch)
        except Exception:
            # The jobs stay committed as queued: the recovery sweep re-publishes them once
            # they have waited past CONVEYOR_LOST_AFTER (see Duties.recover).
            log.exception("publishing %d job(s) failed; they stay queued", len(dispatches))

    def _stop_orphans(self, *, rounds: int = ORPHAN_ROUNDS, recovered: bool = False) -> int:
        """Children a stop left running past its transaction's share (and theirs) stopped, a
        share (cancellation.STOPS_A_TRANSACTION) a transaction, until none is left or after
        ``rounds`` transactions (the recovery sweep goes on with the rest); with
        ``recovered``, counted as the recovery sweep's. How many were stopped."""
        stopped_in_all = 0
        for _ in range(rounds):

            def stop(store: SqlStore) -> cancellation.Stopped:
                stopped = cancellation.stop_orphans(store, utcnow())
                if recovered:
                    store.count_recovered("children_stopped", stopped.children)
                return stopped

            stopped = self.db.run(stop)
            stopped_in_all += stopped.children
            self._publish(stopped.dispatches)
            self._forget(stopped.forget)
            if not stopped.more:
                break
        return stopped_in_all
