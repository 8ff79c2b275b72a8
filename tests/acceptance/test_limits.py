"""Limits and priority with real `celery worker` processes, real Redis and PostgreSQL; the
limits and the priority overtake on RabbitMQ as broker too (the limiter stays on Redis).

Each node records when it ran (``test.span``); the checks are on those intervals, which lie
inside the permits their jobs held, so an observed overlap above a limit is a real breach.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from subprocess import Popen

import pytest

from conveyor.engine.states import ExecutionStatus, JobStatus, Priority, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.limiter import RedisLimiter
from conveyor.service import Conveyor
from conveyor.store.listing import ExecutionFilter
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, ACCEPTANCE_REDIS, await_ready
from tests.acceptance.test_cli import conveyor
from tests.support.services import Span, effects, max_overlap, spans, wait_for

StartWorker = Callable[..., Popen[str]]


def span_workflow(name: str, tenant: str, width: int, seconds: float, **extra: object) -> dict:
    nodes = [
        {
            "id": f"n{i}",
            "type": "python",
            "config": {"function": "test.span"},
            "inputs": {"tenant": tenant, "workflow": name, "seconds": seconds},
        }
        for i in range(width)
    ]
    return {"name": name, "nodes": nodes, **extra}


def wait_all(client: Conveyor, ids: list[uuid.UUID], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for execution_id in ids:
        try:
            row = wait_for(client, execution_id, timeout=max(1.0, deadline - time.monotonic()))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{limiter_view(client, execution_id)}") from None
        assert row.status is ExecutionStatus.COMPLETED, row.error


def limiter_view(client: Conveyor, execution_id: uuid.UUID) -> str:
    """What the limiter knows of a stuck execution's jobs, for the failure message."""
    limiter = RedisLimiter.from_url(ACCEPTANCE_REDIS)
    with client.db.transaction() as store:
        job_ids = [job.id for job, _ in store.execution_jobs(execution_id) if job.node_id]
    return f"limiter: {limiter.known(job_ids)}; {limiter.snapshot()}"


def peaks(runs: list[Span], key: Callable[[Span], str]) -> dict[str, int]:
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in runs:
        groups[key(s)].append((s.started, s.ended))
    return {k: max_overlap(v) for k, v in groups.items()}


@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_no_limit_is_exceeded_across_worker_processes_and_everything_completes(
    client: Conveyor, start_worker: StartWorker, acceptance_env: dict[str, str]
) -> None:
    # Given three node workers of four processes each (12 slots) under limits of
    # global 6, tenant 4 (tenant t3: 2) and workflow 3 (workflow "single": 1)
    limits = {
        "CONVEYOR_LIMIT_GLOBAL": "6",
        "CONVEYOR_LIMIT_TENANT": "4",
        "CONVEYOR_LIMIT_WORKFLOW": "3",
    }
    await_ready(
        start_worker("workflow-execution", concurrency=2, name="exec", env=limits, wait=False),
        *(start_worker("workflow-node", concurrency=4, name=f"node{i}", env=limits, wait=False)
          for i in range(3)),
    )  # fmt: skip
    with client.db.transaction() as store:
        for tenant in ("t1", "t2", "t3"):
            store.create_tenant(tenant)
        store.set_tenant_concurrency("t3", 2)
    for tenant in ("t1", "t2", "t3"):
        for workflow in ("a", "b"):
            client.apply(parse_workflow(span_workflow(workflow, tenant, 3, 0.1)), tenant)
    client.apply(parse_workflow(span_workflow("single", "t1", 3, 0.1, concurrency=1)), "t1")

    # When many executions are triggered across all of them
    ids = [
        client.trigger(workflow, tenant=tenant)
        for _ in range(6)
        for tenant in ("t1", "t2", "t3")
        for workflow in ("a", "b")
    ] + [client.trigger("single", tenant="t1") for _ in range(3)]
    wait_all(client, ids, timeout=90)

    # Then every execution completed and no limit was ever exceeded
    runs = spans(ACCEPTANCE_DB_URL)
    assert len(runs) == len(ids) * 3
    overall = max_overlap([(s.started, s.ended) for s in runs])
    by_tenant = peaks(runs, lambda s: s.tenant)
    by_workflow = peaks(runs, lambda s: f"{s.tenant}/{s.workflow}")
    assert overall == 6  # the global limit was reached (so was tested) and held
    assert by_tenant["t1"] <= 4 and by_tenant["t2"] <= 4 and by_tenant["t3"] <= 2
    assert max(by_workflow.values()) <= 3
    assert by_workflow["t1/single"] == 1
    # and every permit came back, nobody is left waiting
    shown = conveyor("limits", "--json", env={**acceptance_env, **limits})
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert {(r["scope"], r["name"]) for r in rows} >= {("tenant", "t3"), ("workflow", "t1/single")}
    assert all(r["in_use"] == 0 and r["waiting"] == 0 for r in rows), rows
    assert {r["name"]: r["limit"] for r in rows if r["scope"] == "tenant"}["t3"] == 2


def job_status(client: Conveyor, execution_id: uuid.UUID) -> JobStatus | None:
    with client.db.transaction() as store:
        jobs = [job for job, _ in store.execution_jobs(execution_id) if job.node_id]
    return jobs[0].status if jobs else None


def wait_status(client: Conveyor, execution_id: uuid.UUID, status: JobStatus) -> None:
    deadline = time.monotonic() + 20
    while job_status(client, execution_id) is not status:
        assert time.monotonic() < deadline, job_status(client, execution_id)
        time.sleep(0.05)


def test_permits_of_a_sigkilled_worker_come_back_within_the_lease(
    client: Conveyor, start_worker: StartWorker
) -> None:
    # Given a workflow limited to one at a time, its permit held by a worker's running node
    lease = {"CONVEYOR_PERMIT_LEASE": "2", "CONVEYOR_LIMITS_SWEEP_INTERVAL": "0.2"}
    planner = start_worker("workflow-execution", concurrency=1, name="exec", env=lease,
                           wait=False)  # fmt: skip
    doomed = start_worker("workflow-node", concurrency=1, name="doomed", env=lease, wait=False)
    await_ready(planner, doomed)
    workflow = {
        "name": "solo",
        "concurrency": 1,
        "nodes": [
            {
                "id": "work",
                "type": "python",
                "config": {"function": "test.sleep"},
                "inputs": {"seconds": "{{ input.seconds }}"},
            }
        ],
    }
    client.apply(parse_workflow(workflow))
    holder = client.trigger("solo", {"seconds": 60})
    wait_status(client, holder, JobStatus.PROCESSING)
    # and a second run of it parked behind it, with another worker alive
    start_worker("workflow-node", concurrency=1, name="survivor", env=lease)
    waiter = client.trigger("solo", {"seconds": 0})
    wait_status(client, waiter, JobStatus.PARKED)
    time.sleep(3)  # more than a lease: the holder's heartbeat keeps its permit meanwhile
    assert job_status(client, waiter) is JobStatus.PARKED

    # When the holder's worker is killed outright, pool children and all
    os.killpg(doomed.pid, signal.SIGKILL)
    killed_at = time.monotonic()

    # Then its permit lapses within the lease and the parked run gets it and completes
    row = wait_for(client, waiter, timeout=15)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert time.monotonic() - killed_at < 2 + 0.2 + 2.5  # lease + sweep + publish and run


@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_a_high_job_overtakes_a_thousand_queued_low_jobs(
    client: Conveyor, start_worker: StartWorker
) -> None:
    # Given 1,000 low-priority node jobs queued (planned by an execution worker)
    start_worker("workflow-execution", concurrency=4, name="exec")
    low = {
        "name": "background",
        "nodes": [
            {
                "id": "chore",
                "type": "python",
                "config": {"function": "test.sleep_add"},
                "inputs": {"a": 1, "b": 1, "seconds": 0.01},
            }
        ],
    }
    urgent = {**low, "name": "urgent"}
    client.apply(parse_workflow(low))
    client.apply(parse_workflow(urgent))
    lows = [client.trigger("background", source=TriggerSource.BACKGROUND) for _ in range(1000)]
    with client.db.transaction() as store:
        assert store.execution(lows[0]).priority is Priority.LOW
    wait_planned(client, 1000)
    # and one worker slot taking them in order
    start_worker("workflow-node", concurrency=1, name="node")
    while len(effects(ACCEPTANCE_DB_URL)) < 3:
        time.sleep(0.01)

    # When a user triggers a high-priority run
    taken = len(effects(ACCEPTANCE_DB_URL))
    high = client.trigger("urgent")
    assert wait_for(client, high, timeout=30).status is ExecutionStatus.COMPLETED

    # Then it started before all but the few low jobs already taken
    order = [e["idempotency_key"].startswith(str(high)) for e in effects(ACCEPTANCE_DB_URL)]
    lows_before = order.index(True)
    assert lows_before <= taken + 5, (taken, lows_before)
    assert lows_before < 100


def wait_planned(client: Conveyor, count: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        with client.db.transaction() as store:
            running = len(
                store.list_executions(
                    None, where=ExecutionFilter(status=ExecutionStatus.RUNNING), limit=count
                )
            )
        if running >= count:
            return
        assert time.monotonic() < deadline, f"{running} of {count} executions planned"
        time.sleep(0.1)


def test_a_tenant_with_a_handful_is_not_starved_by_a_tenant_with_a_backlog(
    client: Conveyor, start_worker: StartWorker
) -> None:
    # Given a global limit of two, and tenant A with a backlog of 150 runs
    limits = {
        "CONVEYOR_LIMIT_GLOBAL": "2",
        "CONVEYOR_LIMIT_TENANT": "100",
        "CONVEYOR_LIMIT_WORKFLOW": "100",
    }
    await_ready(
        start_worker("workflow-execution", concurrency=2, name="exec", env=limits, wait=False),
        start_worker("workflow-node", concurrency=4, name="node1", env=limits, wait=False),
        start_worker("workflow-node", concurrency=4, name="node2", env=limits, wait=False),
    )
    with client.db.transaction() as store:
        store.create_tenant("big")
        store.create_tenant("small")
    client.apply(parse_workflow(span_workflow("job", "big", 1, 0.1)), "big")
    client.apply(parse_workflow(span_workflow("job", "small", 1, 0.1)), "small")
    big = [client.trigger("job", tenant="big") for _ in range(150)]
    # (fairness is among parked jobs: wait until A's backlog has left the broker and waits)
    deadline = time.monotonic() + 30
    while parked_count(client) < 100:
        assert time.monotonic() < deadline, parked_count(client)
        time.sleep(0.05)

    # When tenant B triggers five runs after A's backlog
    small = [client.trigger("job", tenant="small") for _ in range(5)]
    b_arrived = time.time()
    wait_all(client, small, timeout=60)
    wait_all(client, big, timeout=90)

    # Then B's runs were served round-robin with A's, not after A's backlog
    runs = spans(ACCEPTANCE_DB_URL)
    b_done = max(s.started for s in runs if s.tenant == "small")
    a_between = [s for s in runs if s.tenant == "big" and b_arrived <= s.started < b_done]
    a_after = [s for s in runs if s.tenant == "big" and s.started >= b_done]
    assert len(a_between) <= 10, len(a_between)
    assert len(a_after) >= 50  # A still had a backlog B went ahead of
    assert max_overlap([(s.started, s.ended) for s in runs]) <= 2


def parked_count(client: Conveyor) -> int:
    with client.db.transaction() as store:
        return len(store.parked_jobs(None, 1000))
