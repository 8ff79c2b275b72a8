"""The accounting work queue's job as Conveyor nodes (docs/coming-from-skip-locked.md).

The ledger is a stand-in: it says an entry has synced once it was polled more than
``ledger_syncs_after`` times, counted in this process.
"""

from __future__ import annotations

from collections import Counter

import conveyor

_polls: Counter[str] = Counter()


@conveyor.node("accounting.load_document")
def load_document(document: int, version: int, deleted: bool = False) -> dict[str, int]:
    """Read the document the job is for; a deleted one ends the job cancelled."""
    if deleted:
        raise conveyor.CancelExecution(f"document {document} was deleted")
    return {"document": document, "version": version}


@conveyor.node("accounting.post_to_ledger")
def post_to_ledger(
    document: int, version: int, ledger_syncs_after: int, ctx: conveyor.NodeContext
) -> dict[str, object]:
    """Post the document's entry once the ledger has synced; until then, poll it every
    second without spending an attempt."""
    _polls[ctx.idempotency_key] += 1
    polls = _polls[ctx.idempotency_key]
    if polls <= ledger_syncs_after:
        ctx.snooze(1, f"ledger not synced yet (poll {polls})")
    return {"posted": f"document {document} v{version}", "polls": polls, "attempt": ctx.attempt}
