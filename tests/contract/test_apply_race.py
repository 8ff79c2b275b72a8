"""Two applies that would each close half of a circle of workflows, at the same moment, on
PostgreSQL (whose transactions read and write side by side; SQLite's take turns from their
start): the applies of workflows that start children take turns, so the second sees the first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import text

from conveyor.engine import workflows
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import DefinitionError
from conveyor.service import utcnow
from conveyor.store import Database
from tests.contract.conftest import emptied
from tests.unit.transitions.test_children import child_node

pytestmark = pytest.mark.contract


def waiting_for_an_advisory_lock(database: Database) -> bool:
    """Whether a session of this database waits for an advisory lock."""
    with database.engine.connect() as connection:
        return bool(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                )
            ).scalar()
        )


def until(done: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


def test_two_applies_that_close_a_circle_together_take_turns_and_the_second_is_refused(
    postgres_database: Database,
) -> None:
    # Given a tenant, and two definitions: a starts b, b starts a (neither applied yet)
    database = postgres_database
    emptied(database)
    database.run(lambda s: s.tenant_id("default"))
    a = parse_workflow({"name": "a", "nodes": [child_node("to_b", "b")]})
    b = parse_workflow({"name": "b", "nodes": [child_node("to_a", "a")]})
    outcome: dict[str, object] = {}

    def apply_b() -> None:
        try:
            database.run(lambda s: workflows.apply_workflow(s, "default", b, utcnow()))
            outcome["b"] = "applied"
        except DefinitionError as exc:
            outcome["b"] = exc

    # When a's apply has checked for a circle (b is not there) and not committed yet, and b's
    # starts meanwhile in another transaction
    with database.transaction() as store:
        workflows.apply_workflow(store, "default", a, utcnow())
        other = threading.Thread(target=apply_b)
        other.start()
        until(
            lambda: not other.is_alive() or waiting_for_an_advisory_lock(database),
            "b's apply to finish or to wait for a's",
        )
    other.join(timeout=60)

    # Then b's apply waited for a's, saw a, and was refused: no circle was stored
    assert isinstance(outcome.get("b"), DefinitionError), outcome
    assert "(b -> a -> b)" in str(outcome["b"])
    with database.transaction() as store:
        tenant = store.tenant_id("default")
        stored = {name for name in "ab" if store.latest_workflow(tenant, name) is not None}
    assert stored == {"a"}
