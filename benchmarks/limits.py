"""The limiter's cost: acquire + release against plain Redis round trips, and node throughput
with limits on, off, and raw Celery doing the same no-op — all in one run, as ratios.

    python -m benchmarks.limits [--executions 2000] [--pairs 5000] [--concurrency 8]
                                [--json results.json]

Needs PostgreSQL and Redis as the tests do (a database of its own; Redis db 14, flushed).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import redis
from sqlalchemy import create_engine, func, select

from benchmarks import harness
from conveyor.config import Settings
from conveyor.engine.limits import Limits, PermitRequest
from conveyor.engine.states import ExecutionStatus, Priority
from conveyor.engine.validation import parse_workflow
from conveyor.limiter import RedisLimiter
from conveyor.models import Execution
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher

NOOP = {
    "name": "noop",
    "nodes": [{"id": "n", "type": "python", "config": {"function": "bench.noop"}}],
}


def limiter_cost(url: str, pairs: int) -> dict[str, float]:
    """Microseconds per acquire + release, uncontended and with a hand-over, and per two
    PINGs (the floor: two round trips)."""
    client = redis.Redis.from_url(url)
    limiter = RedisLimiter(client, prefix=f"bench:{uuid.uuid4().hex[:6]}")
    tenant = uuid.uuid4()

    def request(limit: int) -> PermitRequest:
        return PermitRequest(
            job_id=uuid.uuid4(), tenant_id=tenant, workflow_name="w", priority=Priority.NORMAL,
            limits=Limits(global_=1000, tenant=1000, workflow=limit), enqueued_at_ms=0,
        )  # fmt: skip

    started = time.perf_counter()
    for _ in range(pairs):
        client.ping()
        client.ping()
    pings = (time.perf_counter() - started) / pairs

    started = time.perf_counter()
    for _ in range(pairs):
        permit = limiter.acquire(request(1000)).permit
        assert permit is not None
        limiter.release(permit)
    free = (time.perf_counter() - started) / pairs

    # contended: a limit of one; each cycle parks a job, releases, and takes the grant
    holder = limiter.acquire(request(1)).permit
    started = time.perf_counter()
    for _ in range(pairs // 2):
        waiting = request(1)
        assert limiter.acquire(waiting).permit is None
        assert holder is not None
        (_woken,) = limiter.release(holder)
        holder = limiter.acquire(waiting).permit
    contended = (time.perf_counter() - started) / max(1, pairs // 2)
    client.close()
    return {"two_pings_us": pings * 1e6, "free_us": free * 1e6, "handover_us": contended * 1e6}


def conveyor_throughput(svc: harness.Services, n: int, concurrency: int, limits_on: bool) -> float:
    """Nodes per second: n one-node executions queued, then drained by fresh workers."""
    svc.reset_tables()
    svc.flush()
    settings = Settings(database_url=svc.database_url, broker_url=svc.redis_url)
    database = Database(svc.database_url)
    client = Conveyor(database, CeleryDispatcher(create_app(settings)))
    client.apply(parse_workflow(NOOP))
    for _ in range(n):
        client.trigger("noop")
    # Limits on but never binding: this measures what taking and giving back permits costs,
    # not the waiting a binding limit causes by design.
    env = svc.env(
        CONVEYOR_LIMITS_ENABLED=str(limits_on).lower(),
        CONVEYOR_LIMIT_GLOBAL="100000",
        CONVEYOR_LIMIT_TENANT="100000",
        CONVEYOR_LIMIT_WORKFLOW="100000",
    )
    specs = [("workflow-execution", max(2, concurrency // 2)), ("workflow-node", concurrency)]
    with harness.workers("conveyor.tasks", specs, env) as ready:
        _wait_completed(svc.database_url, n, timeout=60 + n / 10)
        elapsed = time.perf_counter() - ready
    database.dispose()
    return n / elapsed


def _wait_completed(url: str, n: int, timeout: float) -> None:
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    query = select(func.count()).where(Execution.status == ExecutionStatus.COMPLETED)
    with engine.connect() as conn:
        while conn.execute(query).scalar_one() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"executions not completed after {timeout:.0f} s")
            time.sleep(0.02)
            conn.rollback()
    engine.dispose()


def raw_throughput(svc: harness.Services, n: int, concurrency: int) -> float:
    """Tasks per second: the same no-op as n plain Celery tasks (acks late), drained."""
    svc.flush()
    from benchmarks.nodes import raw

    raw.conf.update(broker_url=svc.redis_url)
    key = f"bench:done:{uuid.uuid4().hex[:6]}"
    with raw.producer_or_acquire() as producer:
        for _ in range(n):
            raw.send_task("bench.raw_noop", args=[key], queue="raw", producer=producer)
    client = redis.Redis.from_url(svc.redis_url)
    with harness.workers("benchmarks.nodes:raw", [("raw", concurrency)], svc.env()) as ready:
        deadline = time.monotonic() + 60 + n / 10
        while int(client.get(key) or 0) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("raw tasks not drained")
            time.sleep(0.02)
        elapsed = time.perf_counter() - ready
    client.close()
    return n / elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)

    with harness.services() as svc:
        cost = limiter_cost(svc.redis_url, args.pairs)
        on = conveyor_throughput(svc, args.executions, args.concurrency, limits_on=True)
        off = conveyor_throughput(svc, args.executions, args.concurrency, limits_on=False)
        raw = raw_throughput(svc, args.executions, args.concurrency)

    results = {
        "params": vars(args),
        "limiter": cost,
        "throughput": {"limits_on": on, "limits_off": off, "raw_celery": raw},
        "ratios": {
            "acquire_release_vs_two_pings": cost["free_us"] / cost["two_pings_us"],
            "handover_vs_two_pings": cost["handover_us"] / cost["two_pings_us"],
            "limits_on_vs_off": on / off,
            "limits_on_vs_raw_celery": on / raw,
            "limits_off_vs_raw_celery": off / raw,
        },
    }
    ratios = results["ratios"]
    rows = [
        (f"limiter, per acquire + release ({args.pairs} pairs)", "", ""),
        ("  two Redis PINGs (the floor)", f"{cost['two_pings_us']:.1f} us", ""),
        ("  uncontended", f"{cost['free_us']:.1f} us",
         f"x{ratios['acquire_release_vs_two_pings']:.2f} of the floor"),
        ("  park, wake, take the grant", f"{cost['handover_us']:.1f} us",
         f"x{ratios['handover_vs_two_pings']:.2f} of the floor"),
        (f"node throughput ({args.executions} executions, {args.concurrency} processes)", "", ""),
        ("  raw Celery, acks late", f"{raw:.1f} /s", ""),
        ("  Conveyor, limits off", f"{off:.1f} /s",
         f"x{ratios['limits_off_vs_raw_celery']:.2f} of raw"),
        ("  Conveyor, limits on", f"{on:.1f} /s",
         f"x{ratios['limits_on_vs_raw_celery']:.2f} of raw, "
         f"x{ratios['limits_on_vs_off']:.2f} of off"),
    ]  # fmt: skip
    for label, value, ratio in rows:
        print(f"{label:<52} {value:>12}  {ratio}")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump(results, out, indent=2)
    return results


if __name__ == "__main__":
    main()
