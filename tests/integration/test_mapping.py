"""Maps end to end: real PostgreSQL, Redis broker and an in-process Celery worker. The node
functions count their own runs (test_effects) and overlap (Redis), not only the engine's rows."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.engine import claiming, mapping, success, triggering
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution
from conveyor.service import Conveyor, utcnow
from tests.support import nodes as test_nodes
from tests.support.services import effects, in_thread, lock_waiters, wait_for, wait_until

NO_RETRY = {"retry": {"max_attempts": 1}}


def py(node_id: str, function: str, needs: list[str] | None = None, **fields: Any) -> dict:
    inputs = fields.pop("inputs", {})
    return {
        "id": node_id, "type": "python", "config": {"function": f"test.{function}"},
        "needs": needs or [], "inputs": inputs, **fields,
    }  # fmt: skip


def run(
    service: Conveyor, name: str, nodes: list[dict], input: Any, timeout: float = 60
) -> Execution:
    service.apply(parse_workflow({"name": name, "nodes": nodes, "defaults": NO_RETRY}))
    return wait_for(service, service.trigger(name, input), timeout=timeout)


def items(service: Conveyor, execution_id: uuid.UUID, node_id: str = "m") -> list[Any]:
    with service.db.transaction() as store:
        return [j for j, _ in store.execution_items(execution_id, node_id, limit=1000)]


def runs_of(url: str, node_id: str) -> list[str]:
    """The idempotency keys of the effects a node's runs recorded."""
    return [e["idempotency_key"] for e in effects(url) if e["node_id"] == node_id]


@pytest.fixture
def window(conveyor_service: Conveyor) -> Iterator[None]:
    """The worker's CONVEYOR_MAP_WINDOW of 2 for the test."""
    before = conveyor_service.map_window
    conveyor_service.map_window = 2
    yield
    conveyor_service.map_window = before


@pytest.fixture
def bounded(conveyor_service: Conveyor) -> Iterator[None]:
    """The worker's CONVEYOR_MAP_MAX_ITEMS of 4 and CONVEYOR_MAX_OUTPUT_BYTES of 1,024."""
    before = conveyor_service.bounds
    conveyor_service.bounds = replace(before, map_items=4, output_bytes=1024)
    yield
    conveyor_service.bounds = before


ITEM = {"value": "{{ item }}", "seconds": "{{ 0.05 if index % 3 == 0 else 0 }}"}


def test_a_map_runs_once_per_item_and_its_successor_once_with_the_outputs_in_item_order(
    conveyor_service: Conveyor, database_url: str
) -> None:
    rows = [f"row-{i}" for i in range(30)]
    done = run(conveyor_service, "map_order", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs=ITEM),
        py("after", "collect", ["m"], inputs={"values": "{{ nodes.m }}"}),
    ], {"rows": rows})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    expected = [{"value": r, "index": i, "item": r} for i, r in enumerate(rows)]
    assert done.output == {"after": {"values": expected}}
    keys = runs_of(database_url, "m")
    assert sorted(keys) == sorted(f"{done.id}:m:{i}" for i in range(30))  # once each
    assert runs_of(database_url, "after") == [f"{done.id}:after"]
    assert {j.status for j in items(conveyor_service, done.id)} == {JobStatus.COMPLETED}


def test_a_map_keeps_at_most_its_window_of_items_queued_or_running(
    conveyor_service: Conveyor, database_url: str, window: None
) -> None:
    key = str(uuid.uuid4())
    done = run(conveyor_service, "map_window", [
        py("m", "overlap", map={"over": "{{ input.rows }}"},
           inputs={"key": key, "seconds": 0.1}),
    ], {"rows": list(range(8))})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert len(runs_of(database_url, "m")) == 8
    assert 1 <= test_nodes.overlap_peak(key) <= 2


def test_a_map_s_concurrency_of_3_never_runs_more_than_3_items_at_once(
    conveyor_service: Conveyor, database_url: str
) -> None:
    key = str(uuid.uuid4())
    done = run(conveyor_service, "map_cap", [
        py("m", "overlap", map={"over": "{{ input.rows }}", "concurrency": 3},
           inputs={"key": key, "seconds": 0.15}),
    ], {"rows": list(range(12))})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert len(runs_of(database_url, "m")) == 12
    assert 1 <= test_nodes.overlap_peak(key) <= 3  # the worker has 6 threads


def test_an_empty_list_completes_the_map_at_once_and_its_successor_runs(
    conveyor_service: Conveyor, database_url: str
) -> None:
    done = run(conveyor_service, "map_empty", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs=ITEM),
        py("after", "collect", ["m"], inputs={"values": "{{ nodes.m }}"}),
    ], {"rows": []})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"after": {"values": []}}
    assert runs_of(database_url, "m") == []


def test_a_map_over_a_dict_fails_its_node_naming_the_template_and_the_type(
    conveyor_service: Conveyor, database_url: str
) -> None:
    done = run(conveyor_service, "map_dict", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs=ITEM),
    ], {"rows": {"a": 1}})  # fmt: skip

    assert done.status is ExecutionStatus.FAILED
    assert "map over `{{ input.rows }}` gave a dict, not a list: {'a': 1}" in (done.error or "")
    assert runs_of(database_url, "m") == []


@pytest.mark.usefixtures("bounded")
def test_a_list_longer_than_the_limit_fails_its_node_before_any_item_runs(
    conveyor_service: Conveyor, database_url: str
) -> None:
    done = run(conveyor_service, "map_long", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs=ITEM),
    ], {"rows": list(range(5))})  # fmt: skip

    assert done.status is ExecutionStatus.FAILED
    assert "gave a list of 5 items, more than the limit of 4 (CONVEYOR_MAP_MAX_ITEMS)" in (
        done.error or ""
    )
    assert runs_of(database_url, "m") == []
    assert items(conveyor_service, done.id) == []


@pytest.mark.usefixtures("bounded")
def test_a_map_whose_outputs_together_pass_the_output_bound_fails_cleanly_once(
    conveyor_service: Conveyor, database_url: str
) -> None:
    # Four items of about 300 characters each: each fits a node's 1,024 bytes, not together
    done = run(conveyor_service, "map_wide", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs={"value": "{{ item }}"}),
        py("after", "collect", ["m"], inputs={"values": "{{ nodes.m }}"}),
    ], {"rows": ["x" * 130] * 4})  # fmt: skip

    assert done.status is ExecutionStatus.FAILED
    assert "its output (the list of its items' outputs) is " in (done.error or "")
    assert "over the limit of 1024 bytes (CONVEYOR_MAX_OUTPUT_BYTES)" in (done.error or "")
    assert len(runs_of(database_url, "m")) == 4  # each item once: nothing looped
    assert {j.status for j in items(conveyor_service, done.id)} == {JobStatus.COMPLETED}
    assert runs_of(database_url, "after") == []


def test_fail_fast_fails_at_the_first_dead_item_and_never_starts_the_held_ones(
    conveyor_service: Conveyor, database_url: str
) -> None:
    done = run(conveyor_service, "map_fail_fast", [
        py("m", "item", map={"over": "{{ input.rows }}", "concurrency": 1},
           inputs={"value": "{{ item }}", "fail_on": [2]}),
        py("after", "collect", ["m"], inputs={"values": "{{ nodes.m }}"}),
    ], {"rows": list(range(6))})  # fmt: skip

    assert done.status is ExecutionStatus.FAILED
    assert done.error == ("node 'm' failed: item 2 failed after 1 attempt(s): item 2 refused")
    assert sorted(runs_of(database_url, "m")) == [f"{done.id}:m:{i}" for i in range(3)]
    assert [j.status for j in items(conveyor_service, done.id)] == [
        JobStatus.COMPLETED, JobStatus.COMPLETED, JobStatus.DEAD_LETTER,
        JobStatus.CANCELLED, JobStatus.CANCELLED, JobStatus.CANCELLED,
    ]  # fmt: skip
    assert runs_of(database_url, "after") == []


def test_run_all_runs_every_item_then_fails_listing_the_failed_ones(
    conveyor_service: Conveyor, database_url: str
) -> None:
    done = run(conveyor_service, "map_run_all", [
        py("m", "item", map={"over": "{{ input.rows }}", "on_item_failure": "run_all"},
           inputs={"value": "{{ item }}", "fail_on": [1, 3]}),
    ], {"rows": list(range(5))})  # fmt: skip

    assert done.status is ExecutionStatus.FAILED
    assert (done.error or "").startswith("node 'm' failed: 2 of 5 items failed (indices 1, 3)")
    assert len(runs_of(database_url, "m")) == 5


def test_continue_completes_with_each_failed_item_s_error_in_its_slot(
    conveyor_service: Conveyor,
) -> None:
    done = run(conveyor_service, "map_continue", [
        py("m", "item", map={"over": "{{ input.rows }}", "on_item_failure": "continue"},
           inputs={"value": "{{ item }}", "fail_on": [1]}),
    ], {"rows": ["a", "b", "c"]})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"m": [
        {"value": "a", "index": 0, "item": "a"},
        {"error": "item 1 refused (the error is not retryable)"},
        {"value": "c", "index": 2, "item": "c"},
    ]}  # fmt: skip


def test_a_map_chained_after_a_map_maps_over_its_outputs(conveyor_service: Conveyor) -> None:
    done = run(conveyor_service, "map_chain", [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs={"value": "{{ item * 2 }}"}),
        py("m2", "item", ["m"], map={"over": "{{ nodes.m }}"},
           inputs={"value": "{{ item.value + 1 }}"}),
    ], {"rows": [1, 2, 3, 4]})  # fmt: skip

    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert [o["value"] for o in done.output["m2"]] == [3, 5, 7, 9]


def test_cancelling_mid_map_cancels_the_items_not_started(
    conveyor_service: Conveyor, database_url: str
) -> None:
    name = "map_cancel"
    conveyor_service.apply(parse_workflow({"name": name, "defaults": NO_RETRY, "nodes": [
        py("m", "sleep", map={"over": "{{ input.rows }}", "concurrency": 2},
           inputs={"seconds": 30}),
    ]}))  # fmt: skip
    execution_id = conveyor_service.trigger(name, {"rows": list(range(10))})
    deadline = time.monotonic() + 20
    while [j.status for j in items(conveyor_service, execution_id)].count(
        JobStatus.PROCESSING
    ) < 2:  # both items of the window run
        assert time.monotonic() < deadline, "the items did not start"
        time.sleep(0.05)

    conveyor_service.cancel(execution_id)
    done = wait_for(conveyor_service, execution_id)
    deadline = time.monotonic() + 20
    while JobStatus.PROCESSING in {j.status for j in items(conveyor_service, execution_id)}:
        assert time.monotonic() < deadline, "the running items did not stop"
        time.sleep(0.05)

    assert done.status is ExecutionStatus.CANCELLED
    assert {j.status for j in items(conveyor_service, execution_id)} == {JobStatus.CANCELLED}
    with conveyor_service.db.transaction() as store:
        (m,) = store.execution_nodes(execution_id)
    assert m.status is NodeStatus.CANCELLED
    assert len(runs_of(database_url, "m")) <= 2  # the two that ran, stopped early


def test_a_map_failing_fast_takes_its_parked_items_out_of_the_limiters_lines_at_once(
    conveyor_service: Conveyor,
) -> None:
    # Given a map under a workflow limit of one: its first item runs (sleeping), the rest
    # parked, waiting in the limiter's lines for the permit the first holds
    conveyor_service.apply(parse_workflow({
        "name": "map_parked", "defaults": NO_RETRY, "concurrency": 1, "nodes": [
            py("m", "sleep", map={"over": "{{ input.rows }}"}, inputs={"seconds": 30}),
        ],
    }))  # fmt: skip
    execution_id = conveyor_service.trigger("map_parked", {"rows": list(range(4))})
    wait_until(
        lambda: (
            sorted(j.status for j in items(conveyor_service, execution_id))
            == sorted([JobStatus.PROCESSING] + [JobStatus.PARKED] * 3)
        )
    )
    limiter = conveyor_service.gate.limiter  # type: ignore[union-attr]
    assert {u.key: u.waiting for u in limiter.snapshot()}["global"] == 3

    # When the running item dies (here its worker taken for lost by the recovery sweep) and
    # the map fails fast, the running item still holding its permit
    conveyor_service.recover(heartbeat_timeout=0, lost_after=3600)

    # Then the parked items, cancelled, left the limiter's lines with that transaction, not
    # at the limiter's sweep nor at the release of the first item's permit
    assert {j.status for j in items(conveyor_service, execution_id)} == {
        JobStatus.DEAD_LETTER, JobStatus.CANCELLED,
    }  # fmt: skip
    assert {u.key: u.waiting for u in limiter.snapshot()}["global"] == 0
    wait_until(  # the sleeping item sees its execution failed, stops, gives the permit back
        lambda: all(u.in_use == 0 for u in limiter.snapshot())
    )


def test_a_cancel_racing_a_map_s_expansion_leaves_no_item_of_it_to_run(
    conveyor_service: Conveyor,
) -> None:
    # Given a map node's own try, claimed (here, not by the worker: nothing is published)
    conveyor_service.apply(parse_workflow({"name": "map_race", "defaults": NO_RETRY, "nodes": [
        py("m", "item", map={"over": "{{ input.rows }}"}, inputs=ITEM),
    ]}))  # fmt: skip
    made = conveyor_service.db.autocommit(
        lambda s: triggering.trigger(
            s, workflow_name="map_race", tenant="default", input={"rows": list(range(5))},
            now=utcnow(),
        )
    )  # fmt: skip
    (dispatch,) = made.dispatches
    run = conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, dispatch.job_id, utcnow(), "racer")
    )
    assert run is not None
    rows = mapping.items_of(run)
    with conveyor_service.db.transaction() as holder:
        # and its transaction held up by another's lock on its job, once it has begun
        holder.session.execute(
            text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": run.job.id}
        )
        expanding, expanded = in_thread(
            lambda: conveyor_service.db.run(
                lambda s: success.expand(s, run, rows, utcnow(), 0.01, 2)
            )
        )
        wait_until(lambda: lock_waiters(conveyor_service) == 1)

        # When the execution is cancelled meanwhile (it waits for the expansion, or not)
        cancelling, cancelled = in_thread(lambda: conveyor_service.cancel(made.execution_id))
        wait_until(lambda: not cancelling.is_alive() or lock_waiters(conveyor_service) == 2)
    expanding.join(timeout=30)
    cancelling.join(timeout=30)

    # Then both went through, and nothing of the map is left to run in the cancelled execution
    assert not isinstance(expanded[0], Exception) and cancelled == [None]
    with conveyor_service.db.transaction() as store:
        assert store.execution_row(made.execution_id).status is ExecutionStatus.CANCELLED
        (m,) = store.execution_nodes(made.execution_id)
    assert {j.status for j in items(conveyor_service, made.execution_id)} <= {JobStatus.CANCELLED}
    assert m.status is NodeStatus.CANCELLED


def test_the_execution_s_view_sums_a_map_s_items_up_and_a_route_and_show_items_page_them(
    conveyor_service: Conveyor, api_url: str, make_key: Callable[[str], str]
) -> None:
    # Given a map of 30 items, two of which failed (continue)
    key = make_key("mapper")
    conveyor_service.apply(parse_workflow({"name": "map_view", "defaults": NO_RETRY, "nodes": [
        py("m", "item", map={"over": "{{ input.rows }}", "on_item_failure": "continue"},
           inputs={"value": "{{ item }}", "fail_on": [4, 17]}),
    ]}), tenant="mapper")  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_url, headers=headers, timeout=30) as api:
        made = api.post(
            "/v1/workflows/map_view/executions", json={"input": {"rows": list(range(30))}}
        )
        execution_id = made.json()["id"]
        done = wait_for(conveyor_service, uuid.UUID(execution_id))
        assert done.status is ExecutionStatus.COMPLETED, done.error

        # When the execution is shown
        view = api.get(f"/v1/executions/{execution_id}").json()

        # Then its map's items are summed up, the failed ones listed; no item is a job of its
        # own
        (node,) = view["nodes"]
        failed = {f["index"]: f for f in node["items"]["failures"]}
        assert node["items"] | {"failures": sorted(failed)} == {
            "total": 30, "left": 0, "failed": 2, "statuses": {"completed": 28, "dead_letter": 2},
            "failures": [4, 17],
        }  # fmt: skip
        assert failed[4]["error"] == "item 4 refused (the error is not retryable)"
        assert [j["node"] for j in view["jobs"]] == ["m"]  # the map node's own job only
        # And its items come a page at a time, in order, from the route and from the CLI
        page = api.get(
            f"/v1/executions/{execution_id}/nodes/m/items", params={"after": 9, "limit": 5}
        ).json()
        assert [i["index"] for i in page] == [10, 11, 12, 13, 14]
        assert page[0] | {"job_id": "", "started_at": "", "finished_at": ""} == {
            "index": 10, "job_id": "", "status": "completed", "item": 10,
            "output": {"value": 10, "index": 10, "item": 10}, "error": None, "attempts": 1,
            "started_at": "", "finished_at": "", "child": None,
        }  # fmt: skip
        dead = api.get(
            f"/v1/executions/{execution_id}/nodes/m/items", params={"status": "dead_letter"}
        ).json()
        assert [i["index"] for i in dead] == [4, 17]
    shown = CliRunner().invoke(
        app, ["executions", "show", execution_id, "--items", "m", "--after", "27", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    assert [i["index"] for i in json.loads(shown.output)] == [28, 29]
    table = CliRunner().invoke(app, ["executions", "show", execution_id])
    assert table.exit_code == 0, table.output
    assert "30 items" not in table.output  # completed: its output is shown, not its counts
    assert "failed items" in table.output and "item 17 refused" in table.output
