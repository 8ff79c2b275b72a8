"""The in-memory store refuses what the SQL schema's keys refuse (a second job for a node, a
node's state twice, a try's attempt twice), so that a unit test cannot pass in memory where
PostgreSQL and SQLite would raise. (The SQL adapters raise the driver's IntegrityError, which
the contract tier cannot compare with this one's StoreError: tests/contract has no twin of
this module.)"""

from __future__ import annotations

import pytest

from conveyor.engine.records import NewJob
from conveyor.exceptions import StoreError
from conveyor.ids import new_id
from tests.support.bench import Bench, node


def test_a_second_job_for_a_node_of_an_execution_is_refused(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)
    again = NewJob(id=new_id(), node_id="a", max_retries=0, next_run_at=None)

    def add(store: object) -> None:
        execution = store.execution(made.execution_id)  # type: ignore[attr-defined]
        store.add_node_jobs(execution, [again], bench.clock())  # type: ignore[attr-defined]

    with pytest.raises(StoreError, match="uq_jobs_execution_node"):
        bench.units.run(add)
    assert len(bench.jobs(made.execution_id)) == 1


def test_a_node_state_stored_twice_is_refused(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)

    with pytest.raises(StoreError, match="has states for nodes"):
        bench.units.run(lambda s: s.add_node_states(made.execution_id, {"a": 0}))


def test_an_attempt_started_twice_for_one_try_is_refused(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)
    run = bench.claim_node(made.execution_id, "a")

    with pytest.raises(StoreError, match="has an attempt 1 already"):
        bench.units.run(lambda s: s.add_attempt(run.job, "again", bench.clock()))
