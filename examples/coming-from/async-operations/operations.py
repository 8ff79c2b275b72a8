"""Two operation types of an async_operations table as Conveyor nodes
(docs/coming-from-async-operations.md). Two stand-ins for a service that is down: the first
``outage_tries`` tries of a statement fail, and core banking fails while a file named
``core-banking-down`` is in the working directory."""

from __future__ import annotations

from pathlib import Path

import conveyor


@conveyor.node("operations.send_statement")
def send_statement(
    account: str, ctx: conveyor.NodeContext, outage_tries: int = 0, closed: bool = False
) -> dict[str, object]:
    """Mail the account's statement."""
    if closed:  # nothing to send, ever: the operation ends cancelled, not failed
        raise conveyor.CancelExecution(f"account {account} is closed")
    if ctx.attempt <= outage_tries:  # any other exception is retried by the retry policy
        raise ConnectionError(f"mail service unavailable (try {ctx.attempt})")
    return {"sent_to": account, "try": ctx.attempt}


@conveyor.node("operations.refresh_balance")
def refresh_balance(account: str) -> dict[str, str]:
    """Read the account's balance from core banking."""
    if Path("core-banking-down").exists():
        raise ConnectionError("core banking unavailable")
    return {"refreshed": account}
