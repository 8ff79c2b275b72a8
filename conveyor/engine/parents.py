"""The parent's side of a child's finish, as the transitions that finish an execution reach it.

Every transition that finishes an execution (a settle that completes it, or fails it on its
output; a node's failure that fails it; a stop that cancels it) calls :func:`child_finished`
in its own transaction, so that a parent's workflow node never waits on a child that has
finished. Settling that node records its try's outcome (the node's success, or its failure
and retry), which may finish the parent in turn: the transitions call each other in a circle
that the modules cannot import in one. So :func:`child_finished` imports
:mod:`conveyor.engine.children`, above them, when a child finishes, not at import.
"""

from __future__ import annotations

from datetime import datetime

from conveyor.engine.ports import Store
from conveyor.engine.records import AfterCommit, ExecutionRecord


def child_finished(store: Store, execution: ExecutionRecord, now: datetime) -> AfterCommit:
    """In the transaction that finished ``execution``: when it is a child, its parent's node
    settled with its outcome (the node completed with its output, or failed by its retry
    policy: its failure may stop the parent); nothing for an execution no node started."""
    if execution.parent is None:
        return AfterCommit()
    from conveyor.engine.children import settle_parent  # it imports this module's importers

    return settle_parent(store, execution, now)
