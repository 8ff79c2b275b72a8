"""The Redis limiter's contract, against the real Redis: all-or-nothing permits, parking,
wake-ups in priority order, round-robin across tenants, leases, ageing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis

from conveyor.engine.limits import Limits, Permit, PermitRequest, Wake
from conveyor.engine.states import Priority
from conveyor.limiter import RedisLimiter
from tests.conftest import REDIS_URL

TENANT_A, TENANT_B = uuid.UUID(int=1), uuid.UUID(int=2)


@pytest.fixture
def limiter() -> Iterator[RedisLimiter]:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"conveyor:test-limits:{uuid.uuid4().hex[:8]}"
    yield RedisLimiter(client, lease=30.0, prefix=prefix)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


def request(
    *,
    tenant: uuid.UUID = TENANT_A,
    workflow: str = "wf",
    priority: Priority = Priority.NORMAL,
    limits: tuple[int, int, int] = (100, 10, 5),
    enqueued_at_ms: int | None = None,
) -> PermitRequest:
    return PermitRequest(
        job_id=uuid.uuid4(),
        tenant_id=tenant,
        workflow_name=workflow,
        priority=priority,
        limits=Limits(global_=limits[0], tenant=limits[1], workflow=limits[2]),
        enqueued_at_ms=enqueued_at_ms if enqueued_at_ms is not None else int(time.time() * 1000),
    )


def held(limiter: RedisLimiter, req: PermitRequest) -> Permit:
    answer = limiter.acquire(req)
    assert answer.permit is not None, "expected a permit"
    return answer.permit


def usage(limiter: RedisLimiter) -> dict[str, tuple[int, int, int]]:
    return {u.key: (u.in_use, u.limit, u.waiting) for u in limiter.snapshot()}


def test_permits_are_granted_up_to_the_workflow_limit_then_jobs_park(
    limiter: RedisLimiter,
) -> None:
    reqs = [request(limits=(100, 10, 2)) for _ in range(3)]

    answers = [limiter.acquire(r) for r in reqs]

    assert [a.permit is not None for a in answers] == [True, True, False]
    assert answers[2].blocked_by == reqs[2].workflow_key
    u = usage(limiter)
    assert u["global"] == (2, 100, 1)
    assert u[reqs[0].tenant_key] == (2, 10, 1)
    assert u[reqs[0].workflow_key] == (2, 2, 1)
    assert limiter.known([reqs[2].job_id]) == {reqs[2].job_id: "parked"}


def test_a_job_blocked_by_one_key_takes_no_permit_under_the_others(
    limiter: RedisLimiter,
) -> None:
    held(limiter, request(workflow="one", limits=(100, 1, 5)))

    blocked = limiter.acquire(request(workflow="two", limits=(100, 1, 5)))

    assert blocked.permit is None
    assert blocked.blocked_by == f"tenant:{TENANT_A}"
    u = usage(limiter)
    assert u["global"][0] == 1  # the parked job holds nothing
    assert u[f"workflow:{TENANT_A}:two"][0] == 0


def test_a_release_wakes_the_next_parked_job_and_its_grant_is_taken_on_arrival(
    limiter: RedisLimiter,
) -> None:
    first = held(limiter, request(limits=(100, 10, 1)))
    waiting = request(limits=(100, 10, 1))
    assert limiter.acquire(waiting).permit is None

    woken = limiter.release(first)

    assert [w.job_id for w in woken] == [waiting.job_id]
    assert limiter.known([waiting.job_id]) == {waiting.job_id: "granted"}
    # the grant counts against the limit: nobody else gets in meanwhile
    assert limiter.acquire(request(limits=(100, 10, 1))).permit is None
    arrived = limiter.acquire(waiting)
    assert arrived.permit is not None
    assert usage(limiter)[waiting.workflow_key] == (1, 1, 1)


def test_a_woken_job_carries_the_workflow_and_node_it_was_parked_with(
    limiter: RedisLimiter,
) -> None:
    # (its message is named from them, without a read: conveyor.limiter.gate)
    first = held(limiter, request(workflow="orders:eu", limits=(100, 10, 1)))
    charge = replace(request(workflow="orders:eu", limits=(100, 10, 1)), node_id="charge")
    older = request(workflow="orders:eu", limits=(100, 10, 1))  # as an older version's: no node
    assert limiter.acquire(charge).permit is None
    assert limiter.acquire(older).permit is None

    assert limiter.release(first) == [
        Wake(job_id=charge.job_id, priority=Priority.NORMAL, workflow="orders:eu", node="charge")
    ]
    assert limiter.forget([charge.job_id]) == [
        Wake(job_id=older.job_id, priority=Priority.NORMAL, workflow="orders:eu", node="")
    ]


def test_parked_jobs_wake_in_priority_order_and_fifo_within_a_priority(
    limiter: RedisLimiter,
) -> None:
    running = held(limiter, request(limits=(100, 10, 1)))
    order = [Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.NORMAL, Priority.HIGH]
    parked = [request(priority=p, limits=(100, 10, 1)) for p in order]
    for r in parked:
        assert limiter.acquire(r).permit is None

    served = []
    permit = running
    for _ in parked:
        (wake,) = limiter.release(permit)
        served.append(wake.job_id)
        by_id = {r.job_id: r for r in parked}
        permit = held(limiter, by_id[wake.job_id])

    expected = [parked[i].job_id for i in (2, 4, 1, 3, 0)]
    assert served == expected


def test_a_parked_job_asking_again_stays_parked_once(limiter: RedisLimiter) -> None:
    held(limiter, request(limits=(100, 10, 1)))
    waiting = request(limits=(100, 10, 1))

    assert limiter.acquire(waiting).permit is None
    assert limiter.acquire(waiting).permit is None

    assert usage(limiter)[waiting.workflow_key] == (1, 1, 1)


def test_tenants_are_served_round_robin_under_the_global_limit(limiter: RedisLimiter) -> None:
    # Given: tenant A holds the only global permit and parks a backlog of 30; B parks 3 later
    permit = held(limiter, request(tenant=TENANT_A, limits=(1, 100, 100)))
    backlog = [request(tenant=TENANT_A, limits=(1, 100, 100)) for _ in range(30)]
    handful = [request(tenant=TENANT_B, limits=(1, 100, 100)) for _ in range(3)]
    for r in backlog + handful:
        assert limiter.acquire(r).permit is None
    by_id = {r.job_id: r for r in backlog + handful}

    # When: permits are released one by one
    tenants = []
    for _ in range(8):
        (wake,) = limiter.release(permit)
        tenants.append(by_id[wake.job_id].tenant_id)
        permit = held(limiter, by_id[wake.job_id])

    # Then: B's three jobs are among the first six served, alternating with A's
    assert tenants[:6] == [TENANT_A, TENANT_B] * 3 or tenants[:6] == [TENANT_B, TENANT_A] * 3
    assert tenants[6:] == [TENANT_A, TENANT_A]


def test_priority_beats_round_robin_across_tenants(limiter: RedisLimiter) -> None:
    permit = held(limiter, request(tenant=TENANT_A, limits=(1, 100, 100)))
    low = request(tenant=TENANT_A, priority=Priority.LOW, limits=(1, 100, 100))
    high = request(tenant=TENANT_B, priority=Priority.HIGH, limits=(1, 100, 100))
    assert limiter.acquire(low).permit is None
    assert limiter.acquire(high).permit is None

    (wake,) = limiter.release(permit)

    assert wake.job_id == high.job_id


def test_a_lapsed_lease_is_taken_back_by_the_sweep_and_wakes_a_parked_job() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"conveyor:test-limits:{uuid.uuid4().hex[:8]}"
    limiter = RedisLimiter(client, lease=0.3, prefix=prefix)
    try:
        held(limiter, request(limits=(100, 10, 1)))  # never renewed: its worker "died"
        waiting = request(limits=(100, 10, 1))
        assert limiter.acquire(waiting).permit is None
        assert limiter.sweep(age_after=300).woken == []

        time.sleep(0.4)
        report = limiter.sweep(age_after=300)

        assert [w.job_id for w in report.woken] == [waiting.job_id]
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)


def test_renewed_leases_do_not_lapse() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"conveyor:test-limits:{uuid.uuid4().hex[:8]}"
    limiter = RedisLimiter(client, lease=0.3, prefix=prefix)
    try:
        permit = held(limiter, request(limits=(100, 10, 1)))
        waiting = request(limits=(100, 10, 1))
        assert limiter.acquire(waiting).permit is None
        for _ in range(4):
            time.sleep(0.15)
            assert limiter.renew([permit]) == []

        assert limiter.sweep(age_after=300).woken == []
        limiter.release(permit)
        assert limiter.renew([permit]) == [permit.token]
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)


def test_a_low_job_waiting_past_the_age_limit_is_served_as_normal(limiter: RedisLimiter) -> None:
    permit = held(limiter, request(limits=(100, 10, 1)))
    ten_minutes_ago = int(time.time() * 1000) - 600_000
    old_low = request(priority=Priority.LOW, limits=(100, 10, 1), enqueued_at_ms=ten_minutes_ago)
    normal = request(priority=Priority.NORMAL, limits=(100, 10, 1))
    assert limiter.acquire(old_low).permit is None
    assert limiter.acquire(normal).permit is None

    assert limiter.sweep(age_after=300).aged == 1
    (wake,) = limiter.release(permit)

    assert wake.job_id == old_low.job_id
    assert wake.priority is Priority.NORMAL


def test_a_forgotten_job_leaves_the_line_and_a_forgotten_grant_is_given_back(
    limiter: RedisLimiter,
) -> None:
    permit = held(limiter, request(limits=(100, 10, 1)))
    cancelled, woken_then_cancelled, last = (request(limits=(100, 10, 1)) for _ in range(3))
    for r in (cancelled, woken_then_cancelled, last):
        assert limiter.acquire(r).permit is None

    assert limiter.forget([cancelled.job_id]) == []
    (wake,) = limiter.release(permit)
    assert wake.job_id == woken_then_cancelled.job_id
    (passed_on,) = limiter.forget([woken_then_cancelled.job_id])

    assert passed_on.job_id == last.job_id
    assert usage(limiter)[last.workflow_key] == (1, 1, 0)
