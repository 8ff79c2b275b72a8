"""The parent's side of a child's finish, as the transitions that finish an execution reach it.

Every transition that finishes an execution (a settle that completes it, or fails it on its
output; a node's failure that fails it; a stop that cancels it) calls :func:`child_finished`
in its own transaction, so that a parent's workflow node never waits on a child that has
finished. Settling that node records its try's outcome (the node's success, or its failure
and retry), which may finish the parent in turn: the transitions call each other in a circle
that the modules cannot import in one. So :mod:`conveyor.engine.children`, above them, binds
its :func:`~conveyor.engine.children.settle_parent` here when it is imported, which the
engine package does first of all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from conveyor.engine.ports import Store
from conveyor.engine.records import AfterCommit, ExecutionRecord


class SettleParent(Protocol):
    """Settle the parent's node waiting on ``child``, which has just finished; what is left
    to do after commit."""

    def __call__(self, store: Store, child: ExecutionRecord, now: datetime) -> AfterCommit: ...


_settle: SettleParent | None = None


def bind(settle: SettleParent) -> None:
    """What :func:`child_finished` calls (conveyor.engine.children binds it at import)."""
    global _settle
    _settle = settle


def child_finished(store: Store, execution: ExecutionRecord, now: datetime) -> AfterCommit:
    """In the transaction that finished ``execution``: when it is a child, its parent's node
    settled with its outcome (the node completed with its output, or failed by its retry
    policy: its failure may stop the parent); nothing for an execution no node started."""
    if execution.parent is None:
        return AfterCommit()
    if _settle is None:  # the engine package imports conveyor.engine.children first
        raise RuntimeError("conveyor.engine.children is not imported: a child cannot settle")
    return _settle(store, execution, now)
