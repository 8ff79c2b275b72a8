"""A long map's work stays bounded by its window and its insert chunk, whatever its length
(issue 28 asks for 100,000 items with no row or message holding every item job's state; the
benchmark's scale section runs that size). Against real PostgreSQL, with the service's
transitions run in this thread and its messages kept, not published, so that each statement
and each publish is seen: the structure is asserted, at a size a test affords."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from conveyor.engine import mapping
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from conveyor.store import Database
from tests.support import services

ITEMS, WINDOW, CHUNK = 250, 20, 100


class Kept:
    """A dispatcher that keeps each publish's messages: the test runs their jobs itself."""

    def __init__(self) -> None:
        self.publishes: list[list[Dispatch]] = []
        self.waiting: deque[Dispatch] = deque()

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        self.publishes.append(list(dispatches))
        self.waiting.extend(dispatches)


@pytest.fixture
def kept(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Conveyor]:
    """A service keeping its messages, a map window of WINDOW, item jobs CHUNK an INSERT."""
    import tests.support.nodes  # noqa: F401  (registers test.noop)

    services.truncate(database_url)
    monkeypatch.setattr(mapping, "ITEM_CHUNK", CHUNK)
    db = Database(database_url)
    # no continuations: every job runs from a message this test holds and counts
    service = Conveyor(db, Kept(), map_window=WINDOW, continue_steps=0)
    service.apply(parse_workflow({"name": "long", "nodes": [
        {"id": "m", "type": "python", "config": {"function": "test.noop"},
         "map": {"over": "{{ input.rows }}"}},
        {"id": "after", "type": "python", "config": {"function": "test.noop"}, "needs": ["m"]},
    ]}))  # fmt: skip
    yield service
    db.dispose()


@contextmanager
def job_inserts() -> Iterator[list[int]]:
    """How many rows each INSERT INTO jobs this thread sends carries (an executemany: its
    parameter sets; psycopg sends them in one pipeline)."""
    rows: list[int] = []
    me, real = threading.get_ident(), psycopg.Cursor.executemany

    def counted(cursor: Any, query: Any, params: Any, **kwargs: Any) -> Any:
        params = list(params)
        if threading.get_ident() == me and str(query).startswith("INSERT INTO jobs"):
            rows.append(len(params))
        return real(cursor, query, params, **kwargs)

    psycopg.Cursor.executemany = counted  # type: ignore[method-assign]
    try:
        yield rows
    finally:
        psycopg.Cursor.executemany = real  # type: ignore[method-assign]


def item_statuses(service: Conveyor, execution_id: Any) -> dict[JobStatus, int]:
    with service.db.transaction() as store:
        return store.item_counts(execution_id).get("m", {})


def test_a_long_map_makes_its_items_a_chunk_a_statement_and_never_queues_more_than_a_window(
    kept: Conveyor,
) -> None:
    dispatcher = kept.dispatcher
    assert isinstance(dispatcher, Kept)

    # When a map of 250 items makes its item jobs (its own job's try)
    execution_id = kept.trigger("long", {"rows": list(range(ITEMS))})
    (own,) = dispatcher.waiting
    dispatcher.waiting.clear()
    with job_inserts() as inserted:
        kept.run_node(own.job_id, own.hints)

    # Then they were inserted a chunk a statement, and only the window's were published
    assert inserted == [CHUNK, CHUNK, ITEMS - 2 * CHUNK]
    assert [len(p) for p in dispatcher.publishes[1:]] == [WINDOW]
    assert item_statuses(kept, execution_id) == {
        JobStatus.QUEUED: WINDOW, JobStatus.HELD: ITEMS - WINDOW,
    }  # fmt: skip

    # And while every item runs, each settle publishes one message at most, the messages
    # waiting never number more than the window, and the successor is published once
    published_before = len(dispatcher.publishes)
    most_waiting = 0
    while dispatcher.waiting:
        most_waiting = max(most_waiting, len(dispatcher.waiting))
        message = dispatcher.waiting.popleft()
        ran = kept.run_node(message.job_id, message.hints)
        assert ran.outcome is JobStatus.COMPLETED, ran
    settles = dispatcher.publishes[published_before:]
    assert max(len(p) for p in settles) == 1
    assert most_waiting == WINDOW
    assert [d.node for p in settles for d in p].count("after") == 1
    with kept.db.transaction() as store:
        done = store.execution_row(execution_id)
    assert done.status is ExecutionStatus.COMPLETED
    assert item_statuses(kept, execution_id) == {JobStatus.COMPLETED: ITEMS}
