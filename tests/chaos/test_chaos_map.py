"""A map of 2,000 items while node workers are SIGKILLed (pool and all) mid-map: every item's
effect is there once, and the map's successor ran once with the items' outputs in item order.

The items and the successor write the careful author's effect (``chaos_effects``, keyed by
``ctx.idempotency_key``, a re-run counted in ``runs``), so what is checked is what the node
functions did, not only the engine's rows. Only workers are killed: PostgreSQL and Redis are
left alone, so this test may run by itself beside other work."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from sqlalchemy import create_engine, text

from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution
from conveyor.service import Conveyor
from tests.chaos.conftest import CHAOS_DB_URL, Spawn
from tests.chaos.test_chaos import Cluster, _assert_no_permit_held

pytestmark = pytest.mark.timeout(420)

ITEMS = 2000
KILLS = 3
ITEM_SECONDS = 0.02
# The map's items tried more than once.
RECLAIMED = """
SELECT count(*) FROM jobs j
WHERE j.execution_id = :e AND j.item_index IS NOT NULL
  AND (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id) > 1
"""


def map_workflow() -> dict:
    return {
        "name": "map_chaos",
        "concurrency": 50,
        "defaults": {"retry": {"max_attempts": 10, "backoff": 0.2, "jitter": 0.1}},
        "nodes": [
            {"id": "m", "type": "python", "config": {"function": "test.chaos_effect"},
             "map": {"over": "{{ input.rows }}"}, "inputs": {"seconds": ITEM_SECONDS}},
            {"id": "after", "type": "python", "needs": ["m"],
             "config": {"function": "test.chaos_collect"},
             "inputs": {"values": "{{ nodes.m | map(attribute='key') | list }}"}},
        ],
    }  # fmt: skip


def completed_items(client: Conveyor, execution_id: uuid.UUID) -> int:
    with client.db.transaction() as store:
        return store.item_counts(execution_id).get("m", {}).get(JobStatus.COMPLETED, 0)


def await_items(client: Conveyor, execution_id: uuid.UUID, at_least: int) -> int:
    """Wait until ``at_least`` items completed; how many had."""
    deadline = time.monotonic() + 120
    while (done := completed_items(client, execution_id)) < at_least:
        assert time.monotonic() < deadline, f"{done} items completed, waiting for {at_least}"
        time.sleep(0.1)
    return done


def await_finished(client: Conveyor, execution_id: uuid.UUID) -> Execution:
    deadline = time.monotonic() + 240
    while True:
        with client.db.transaction() as store:
            row = store.execution_row(execution_id)
        if row.status.finished:
            return row
        assert time.monotonic() < deadline, f"{completed_items(client, execution_id)} items done"
        time.sleep(0.5)


def test_a_map_of_2000_items_loses_no_item_and_runs_its_successor_once_while_workers_die(
    chaos_client: Conveyor, spawn: Spawn
) -> None:
    # Given beat, a planner and two node workers of four processes each, running a map of 2,000
    cluster = Cluster(spawn)
    chaos_client.apply(parse_workflow(map_workflow()))
    execution_id = chaos_client.trigger("map_chaos", {"rows": list(range(ITEMS))})

    # When a node worker is killed outright, three times, each once the map has gone further
    seen = []
    for kill in range(KILLS):
        seen.append(await_items(chaos_client, execution_id, 150 * (kill + 1)))
        assert completed_items(chaos_client, execution_id) < ITEMS - 100, seen  # mid-map
        cluster.replace(cluster.nodes[kill % 2], signal.SIGKILL)

    # Then the execution completes
    done = await_finished(chaos_client, execution_id)
    assert done.status is ExecutionStatus.COMPLETED, (done.error, seen)

    # every item's effect is there once (a run killed in flight ran again: its effect is the
    # same row), and the successor's once, from one run, with the outputs in item order
    keys = [f"{execution_id}:m:{i}" for i in range(ITEMS)]
    assert done.output == {"after": {"values": keys}}
    engine = create_engine(CHAOS_DB_URL)
    with engine.connect() as conn:
        runs = dict(conn.execute(text("SELECT key, runs FROM chaos_effects")).all())
        # the kills landed on items mid-try: their tries were reclaimed and run again
        reclaimed = conn.execute(text(RECLAIMED), {"e": execution_id}).scalar_one()
    engine.dispose()
    assert set(runs) == {*keys, f"{execution_id}:after"}
    assert runs[f"{execution_id}:after"] == 1
    assert reclaimed >= 1, (seen, sorted(runs.values())[-5:])
    with chaos_client.db.transaction() as store:
        assert store.item_counts(execution_id) == {"m": {JobStatus.COMPLETED: ITEMS}}
    _assert_no_permit_held()
