"""The settlement consumer's handler as a Conveyor node (docs/coming-from-a-queue-consumer.md).

The payouts table stands in for your own database: a SQLite file in the working directory.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

import structlog

import conveyor

log = structlog.stdlib.get_logger("settlement")

PAYOUTS = "CREATE TABLE IF NOT EXISTS payouts (settlement TEXT PRIMARY KEY, amount REAL, key TEXT)"


def _pay_out(settlement: str, amount: float, key: str) -> bool:
    """Insert the payout unless its settlement has one; whether this call made it."""
    with closing(sqlite3.connect("payouts.db")) as db, db:  # `with db` commits
        db.execute(PAYOUTS)
        made = db.execute(
            "INSERT INTO payouts VALUES (?, ?, ?) ON CONFLICT (settlement) DO NOTHING",
            (settlement, amount, key),
        )
        return made.rowcount == 1


@conveyor.node("settlement.settle")
def settle(
    settlement: str, amount: float, ctx: conveyor.NodeContext, bank_down_tries: int = 0
) -> dict[str, object]:
    """Pay a settlement out once, however often its message arrives or its node runs."""
    if amount <= 0:  # a poison message: no retry can fix it, so it is dead-lettered at once
        raise conveyor.NonRetryableError(f"settlement {settlement}: amount {amount} is not > 0")
    if ctx.attempt <= bank_down_tries:  # a transient outage: retried with the node's backoff
        raise ConnectionError(f"bank unavailable (try {ctx.attempt})")
    if not _pay_out(settlement, amount, ctx.idempotency_key):
        raise conveyor.Skip(f"settlement {settlement} was paid out already")  # a redelivery
    log.info("paid out", settlement=settlement, amount=amount, attempt=ctx.attempt)
    return {"paid": settlement, "amount": amount, "try": ctx.attempt}
