"""A worker's continuations: the next node it claims for itself in (or right after) the
success that made it ready, and runs next with no message (docs/guarantees.md#continuations):
a chain's step in one statement, a map's released item, a join's last need in its success's
transaction. Each under the same rules: its permits first, at most ``continue_steps`` in a
row, and only while no job of a higher priority waits in the queue."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conveyor.engine import claiming, success
from conveyor.engine.limits import Permit
from conveyor.engine.ports import Store
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import AfterCommit, Dispatch
from conveyor.exceptions import LimitError
from conveyor.service.base import ServiceBase, log, utcnow

# A node this worker claimed for itself, with its permits (None without a limiter).
Taken = tuple[claiming.NodeRun, Permit | None]


class Continuations(ServiceBase):
    """The worker's side of continuations (:class:`~conveyor.service.workers.Workers` runs
    what they claim)."""

    def _step(
        self, run: claiming.NodeRun, output: Any, duration: float, streak: int
    ) -> tuple[AfterCommit, Taken | None] | None:
        """A chain's step in one statement (:func:`~conveyor.engine.success.complete_step`):
        the success and its one successor's job, claimed for this worker to run next under
        the rules of :meth:`_complete` (its permits taken first, ``continue_steps`` in a row,
        nothing of a higher priority waiting), else queued for its message. None: not a
        chain's step, nothing changed."""
        now = utcnow()
        step = success.chain_step(run, output, now, claim=streak < self.continue_steps)
        if step is None:
            return None
        permit = None
        if step.claim and self.gate is not None:
            permit = self._permit_for(step.dispatch)
            step = step if permit is not None else replace(step, claim=False)
        kept = [permit] if permit is not None else []
        try:
            stepped = self.db.autocommit(
                lambda s: success.complete_step(
                    s, run, output, now, duration, step, self.worker,
                    output_bytes=self.bounds.output_bytes,
                )
            )  # fmt: skip
        except BaseException:
            self._release(kept)
            raise
        if stepped is None or stepped[1] is None:
            self._release(kept)
        if stepped is None:
            return None
        after, taken = stepped
        return after, None if taken is None else (taken, permit)

    def _take_released(self, after: AfterCommit, streak: int) -> tuple[AfterCommit, Taken | None]:
        """A map's item whose success released a held item (past the map's window): this
        worker claims that item to run next instead of publishing its message, as a
        continuation (its permits taken first, ``continue_steps`` in a row, nothing of a
        higher priority waiting). The success is committed already: if this worker dies
        before the claim, the item is queued with no message, and the recovery sweep sends
        it (``CONVEYOR_LOST_AFTER``)."""
        step = success.continuation(after, NODE_QUEUE)
        if step is None or streak >= self.continue_steps:
            return after, None
        permit = None
        if self.gate is not None and (permit := self._permit_for(step)) is None:
            return after, None
        kept = [permit] if permit is not None else []
        try:
            taken = self.db.autocommit(
                lambda s: claiming.claim_continuation(
                    s, step, utcnow(), self.worker, output_bytes=self.bounds.output_bytes
                )
            )
        except Exception:  # the success is committed: its message goes as any other's
            log.warning("no continuation: the released item's claim failed", exc_info=True)
            taken = None
        except BaseException:
            self._release(kept)
            raise
        if taken is None:
            self._release(kept)
            return after, None
        return replace(after, dispatches=[]), (taken, permit)

    def _complete(
        self, run: claiming.NodeRun, output: Any, duration: float, streak: int
    ) -> tuple[AfterCommit, Taken | None]:
        """A success in a transaction and, when it made exactly one node ready in this
        worker's queue (a chain's next step), that node's job claimed in the same
        transaction for this worker to run next, with no message: its permits taken first
        (refused, its message is published as any other's), at most ``continue_steps`` in a
        row, and only while no job of a higher priority waits in the queue (the claim's
        rule). See docs/guarantees.md#continuations."""
        permits: list[Permit] = []  # one a transaction's try: only the last one's is kept

        def record(store: Store) -> tuple[AfterCommit, claiming.NodeRun | None]:
            after = success.complete_node(store, run, output, utcnow(), duration)
            step = success.continuation(after, NODE_QUEUE)
            if step is None or streak >= self.continue_steps:
                return after, None
            if self.gate is not None:
                permit = self._permit_for(step)
                if permit is None:
                    return after, None
                permits.append(permit)
            taken = claiming.claim_continuation(
                store, step, utcnow(), self.worker, output_bytes=self.bounds.output_bytes
            )
            return (after, None) if taken is None else (replace(after, dispatches=[]), taken)

        try:
            after, taken = self.db.run(record)
        except BaseException:
            self._release(permits)
            raise
        kept = permits.pop() if taken is not None and permits else None
        self._release(permits)
        return after, None if taken is None else (taken, kept)

    def _permit_for(self, step: Dispatch) -> Permit | None:
        """The permits of a step this worker would take itself; None when refused, or when
        the limiter cannot be reached (the step's message then goes as any other's)."""
        assert self.gate is not None and step.hints is not None
        try:
            return self.gate.try_admit(step.job_id, step.hints)
        except LimitError:
            log.warning("no continuation: the limiter could not be reached")
            return None

    def _release(self, permits: list[Permit]) -> None:
        if self.gate is not None:
            for permit in permits:
                self.gate.release(permit)
