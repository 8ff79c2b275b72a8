"""The alert duty of every worker's duty thread: whoever wins the turn takes a snapshot,
evaluates the rules (:mod:`conveyor.alerts.rules`) against the last turn's counters, stores the
new state, and announces each change: in the log, and to the alert webhook if one is set.
A webhook that cannot be reached is logged; the change is not retried (the log has it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from conveyor.alerts import rules
from conveyor.metrics import Snapshot
from conveyor.store import Database

log = logging.getLogger("conveyor.alerts")


class Alerter:
    def __init__(
        self,
        database: Database,
        snapshot: Callable[[], Snapshot],
        thresholds: rules.Thresholds,
        *,
        interval: float,
        webhook_url: str = "",
    ) -> None:
        self.db = database
        self.snapshot = snapshot
        self.thresholds = thresholds
        self.interval = interval
        self.webhook_url = webhook_url

    def run(self) -> int:
        """Evaluate if it is this process's turn; the changes announced."""
        now = datetime.now(UTC)
        turn = self.db.run(lambda s: s.claim_alert_turn(now, self.interval))
        if turn is None:
            return 0
        counters, firing = turn
        snap = self.snapshot()
        changes, still = rules.evaluate(
            snap, rules.Counters.from_json(counters), set(firing), self.thresholds
        )
        after = rules.Counters.of(snap).as_json()
        self.db.run(lambda s: s.save_alert_state(after, sorted(still)))
        for change in changes:
            self._announce({**change.as_json(), "at": snap.taken_at.isoformat()})
        return 0  # never "busy": the next turn is an interval away

    def _announce(self, event: dict[str, Any]) -> None:
        level = logging.ERROR if event["status"] == "firing" else logging.INFO
        log.log(level, "alert %s %s: %s", event["alert"], event["status"], event["message"])
        if not self.webhook_url:
            return
        try:
            httpx.post(self.webhook_url, json=event, timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("alert webhook unreachable (%s): %s", type(exc).__name__, exc)
