"""Abuse: template bombs in a definition, on real PostgreSQL, Redis and Celery workers.

A bomb in a node's templates fails that node once, not retried, with an error naming the
budget it blew, whatever the node's retry policy; never "the worker stopped sending
heartbeats", never a try left running. A bomb rendered at trigger time (a root delay's
seconds) answers 422 at once, and another tenant's requests keep answering meanwhile.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from conveyor.engine import template_budget as budgets
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.support.services import wait_for

MakeKey = Callable[[str], str]

# Each burns its whole budget (about a second of CPU), not refused at once by a size check.
FORK = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}"
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
POWER = "{{ 9 ** (9 ** 9) }}"
LAUGHS = "{{ [[[[[[[input.text] * 10] * 10] * 10] * 10] * 10] * 10] }}"


def apply(service: Conveyor, name: str, nodes: list[dict[str, Any]], **extra: Any) -> None:
    service.apply(parse_workflow({"name": name, "nodes": nodes, **extra}))


def python_node(inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "n",
        "type": "python",
        "config": {"function": "test.add"},
        "inputs": inputs,
        "retry": {"max_attempts": 3, "backoff": 0.1},
        **extra,
    }


def settled_once(service: Conveyor, name: str, payload: Any = None) -> tuple[Any, Any, list[Any]]:
    """Trigger ``name`` and wait for it: (the execution, its node job, the job's tries)."""
    row = wait_for(service, service.trigger(name, payload or {"text": "x" * 100_000}))
    with service.db.transaction() as store:
        ((job, attempts),) = [(j, a) for j, a in store.execution_jobs(row.id) if j.node_id]
        states = {n.node_id: n for n in store.execution_nodes(row.id)}
    assert all(s.status is not NodeStatus.RUNNING for s in states.values())
    return row, job, attempts


@pytest.fixture
def budget() -> Iterator[Callable[[budgets.Budget], None]]:
    """Set this process's budget (the in-process worker's too) for one test."""
    before = budgets.budget()
    yield budgets.configure
    budgets.configure(before)


@pytest.mark.parametrize(
    ("template", "named"),
    [
        (LOOPS, "CONVEYOR_TEMPLATE_MAX_OPERATIONS"),
        (FORK, "CONVEYOR_TEMPLATE_"),
        (POWER, "bits"),
        (LAUGHS, "CONVEYOR_TEMPLATE_MAX_SIZE"),
    ],
    ids=["nested-loops", "macro-fork", "power", "billion-laughs"],
)
def test_a_node_whose_input_template_bombs_fails_once_not_retried_naming_the_budget(
    conveyor_service: Conveyor, template: str, named: str
) -> None:
    apply(conveyor_service, "bomb", [python_node({"a": template, "b": 1})])

    row, job, attempts = settled_once(conveyor_service, "bomb")

    assert row.status is ExecutionStatus.FAILED
    assert "went over its budget" in (row.error or "") and named in (row.error or "")
    assert "heartbeat" not in (row.error or "")
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER


def test_a_template_that_would_loop_past_the_node_s_timeout_stops_at_the_timeout(
    conveyor_service: Conveyor, budget: Callable[[budgets.Budget], None]
) -> None:
    # Given a budget that would let the render run for a minute,
    budget(budgets.Budget(seconds=60, operations=10**12, size=10**6))
    loop = (
        "{% for i in range(100000) %}{% for j in input.list %}{% set x = j %}{% endfor %}"
        "{% endfor %}"
    )
    apply(conveyor_service, "slow-render", [python_node({"a": loop, "b": 1}, timeout=0.5)])

    # when the node's timeout is half a second,
    started = time.monotonic()
    row, job, attempts = settled_once(conveyor_service, "slow-render", {"list": [1] * 10_000})

    # then the render stops at the timeout, and the try is over, not left running.
    assert time.monotonic() - started < 20
    assert row.status is ExecutionStatus.FAILED
    assert "the node's timeout of 0.5 s" in (row.error or "")
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER


def test_a_condition_whose_expression_bombs_fails_without_retrying(
    conveyor_service: Conveyor,
) -> None:
    apply(
        conveyor_service,
        "bomb-condition",
        [
            {
                "id": "n",
                "type": "condition",
                "config": {"expression": "(9 ** (9 ** 9)) > 1", "if_true": ["yes"]},
                "retry": {"max_attempts": 3},
            },
            {**python_node({"a": 1, "b": 1}), "id": "yes", "needs": ["n"]},
        ],
    )

    row, job, attempts = settled_once(conveyor_service, "bomb-condition")

    assert row.status is ExecutionStatus.FAILED and "bits" in (row.error or "")
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER


def test_a_workflow_output_template_that_bombs_fails_the_execution_with_the_budget(
    conveyor_service: Conveyor,
) -> None:
    apply(
        conveyor_service,
        "bomb-output",
        [python_node({"a": 1, "b": 1})],
        output={"all": "{{ [[[[[[nodes.n] * 100] * 100] * 100] * 100] * 100] }}"},
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("bomb-output", {}))

    assert row.status is ExecutionStatus.FAILED
    assert "workflow output failed" in (row.error or "")
    assert "CONVEYOR_TEMPLATE_MAX_SIZE" in (row.error or "")


def test_the_worker_runs_other_executions_after_a_bomb(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "bomb", [python_node({"a": FORK, "b": 1})])
    apply(conveyor_service, "fine", [python_node({"a": "{{ input.a }}", "b": 1})])

    bombs = [conveyor_service.trigger("bomb", {}) for _ in range(3)]
    fine = wait_for(conveyor_service, conveyor_service.trigger("fine", {"a": 41}))

    assert fine.status is ExecutionStatus.COMPLETED and fine.output == {"n": {"sum": 42}}
    assert all(wait_for(conveyor_service, b).status is ExecutionStatus.FAILED for b in bombs)


# -- at trigger time, through the API ----------------------------------------------------------


def delayed(seconds: str | float) -> dict[str, Any]:
    return {
        "name": "wait",
        "nodes": [
            {"id": "pause", "type": "delay", "config": {"seconds": seconds}},
            {
                "id": "n",
                "type": "python",
                "needs": ["pause"],
                "config": {"function": "test.add"},
                "inputs": {"a": 1, "b": 1},
            },
        ],
    }


def client(api_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


@pytest.mark.parametrize(
    ("seconds", "named"),
    [
        ("{{ 9 ** (9 ** 9) }}", "bits"),
        ("{{ ('x' * 10 ** 10)|length }}", "CONVEYOR_TEMPLATE_MAX_SIZE"),
        (FORK + "1", "CONVEYOR_TEMPLATE_"),
    ],
    ids=["power", "repeat", "macro-fork"],
)
def test_a_trigger_whose_root_delay_template_bombs_answers_422_and_stores_nothing(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey, seconds: str, named: str
) -> None:
    with client(api_url, make_key("mallory")) as api:
        assert api.post("/v1/workflows", json=delayed(seconds)).status_code == 201

        started = time.monotonic()
        answer = api.post("/v1/workflows/wait/executions", json={"input": {}})

        assert answer.status_code == 422, answer.text
        assert time.monotonic() - started < 10
        assert "went over its budget" in answer.json()["detail"]
        assert named in answer.json()["detail"]
        assert api.get("/v1/executions").json() == []


def test_an_event_starting_a_bomb_starts_its_other_workflows_and_fails_the_bomb_s_node(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given two workflows listening to the same event, one whose root delay bombs,
    with client(api_url, make_key("acme")) as api:
        bomb = {**delayed("{{ 9 ** (9 ** 9) }}"), "events": ["order.placed"]}
        fine = {**delayed(0), "name": "fine", "events": ["order.placed"]}
        for flow in (bomb, fine):
            assert api.post("/v1/workflows", json=flow).status_code == 201

        # when the event comes,
        answer = api.post("/v1/events", json={"type": "order.placed", "payload": {}})

    # then both start (the event is not refused for one workflow's template): the bomb's
    # node fails with its budget's error, the other completes.
    assert answer.status_code == 202, answer.text
    rows = [wait_for(conveyor_service, uuid.UUID(i)) for i in answer.json()["executions"]]
    by_status = {row.status: row for row in rows}
    assert set(by_status) == {ExecutionStatus.FAILED, ExecutionStatus.COMPLETED}
    assert "bits" in (by_status[ExecutionStatus.FAILED].error or "")


def test_another_tenant_keeps_answering_while_eight_trigger_bombs_run(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a tenant whose workflow's root delay burns its whole template budget,
    attacker, victim = client(api_url, make_key("mallory")), client(api_url, make_key("alice"))
    assert attacker.post("/v1/workflows", json=delayed(FORK + "1")).status_code == 201
    victim_calls: list[tuple[float, float]] = []  # (sent, answered), on one clock
    bomb_calls: list[tuple[float, float]] = []
    stop = threading.Event()

    def victim_requests() -> None:
        while not stop.is_set():
            for path in ("/health", "/v1/executions"):
                sent = time.monotonic()
                assert victim.get(path).status_code == 200
                victim_calls.append((sent, time.monotonic()))

    def bomb(_: int) -> int:
        with client(api_url, attacker.headers["Authorization"].split()[1]) as api:
            sent = time.monotonic()
            code = api.post("/v1/workflows/wait/executions", json={"input": {}}).status_code
            bomb_calls.append((sent, time.monotonic()))
            return code

    # when eight of its triggers run at once, twice over,
    watcher = threading.Thread(target=victim_requests)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(bomb, range(16)))
    finally:
        stop.set()
        watcher.join(timeout=30)
        attacker.close()
        victim.close()

    # then each answers 422, and the other tenant's requests kept being answered while the
    # bombs ran: more of them were sent and answered between the first bomb's send and the
    # last bomb's answer than there were bombs (an API that a bomb blocked would answer it
    # between bombs only, once each at most), whatever the machine's pace
    assert codes == [422] * 16
    first_sent, last_answered = min(s for s, _ in bomb_calls), max(a for _, a in bomb_calls)
    meanwhile = [s for s, a in victim_calls if first_sent <= s and a <= last_answered]
    assert len(meanwhile) > len(bomb_calls), (len(meanwhile), len(victim_calls))


def test_a_trigger_after_a_bomb_was_mended_runs_the_mended_version(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a workflow whose root delay bombs, started once by an event (this process now
    # remembers that version as the one to trigger),
    with client(api_url, make_key("acme")) as api:
        bomb = {**delayed("{{ 9 ** (9 ** 9) }}"), "events": ["order.placed"]}
        assert api.post("/v1/workflows", json=bomb).status_code == 201
        started = api.post("/v1/events", json={"type": "order.placed", "payload": {}})
        [first] = started.json()["executions"]
        assert wait_for(conveyor_service, uuid.UUID(first)).status is ExecutionStatus.FAILED

        # when the tenant mends it and triggers it,
        assert api.post("/v1/workflows", json=delayed(0)).status_code == 201
        answer = api.post("/v1/workflows/wait/executions", json={})

    # then the mended version runs: the remembered version's bomb is not the answer.
    assert answer.status_code == 201, answer.text
    done = wait_for(conveyor_service, uuid.UUID(answer.json()["id"]))
    assert done.status is ExecutionStatus.COMPLETED, done.error
