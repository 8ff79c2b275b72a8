"""The cron due check's cost: ``check_schedules`` over a large table with a few schedules due,
against raw Celery publishing as many messages to the same broker — in one run, as ratios.

    python -m benchmarks.schedules [--schedules 100000] [--due 1000] [--rounds 5]
                                   [--json results.json]

Needs PostgreSQL and Redis as the tests do (a database of its own; Redis db 14, flushed).
No worker runs: the started runs stay queued, and each round begins from the same state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery
from sqlalchemy import func, insert, select, text, update

from benchmarks import harness
from conveyor.config import Settings
from conveyor.engine.cron import MisfirePolicy, parse_cron
from conveyor.engine.queues import EXECUTION_QUEUE
from conveyor.engine.states import ScheduleOrigin
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Schedule
from conveyor.scheduler.schedules import check_due
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher

TINY = {"name": "tiny", "nodes": [{"id": "n", "type": "delay", "config": {"seconds": 0}}]}
TENANTS = 10
# The schedules not due, a day ahead on a slot of their own; the due ones fire every minute.
IDLE = [("*/5 * * * *", "UTC"), ("0 9 * * 1-5", "Europe/Paris"), ("@hourly", "Asia/Tokyo"),
        ("30 2 * * *", "America/New_York"), ("15 */6 * * *", "Asia/Kolkata")]  # fmt: skip
DUE_CRON = "* * * * *"
ZONES = [zone for _, zone in IDLE]
CHUNK = 10_000


def populate(service: Conveyor, n: int, due: int) -> dict[str, list[uuid.UUID]]:
    """n schedules of one workflow over TENANTS tenants, none due yet; the ids of the `due`
    every-minute ones (spread over the table, the tenants and the zones), by timezone."""
    with service.db.transaction() as store:
        tenants = [store.create_tenant(f"tenant{i}") for i in range(TENANTS)]
    for i in range(TENANTS):
        service.apply(parse_workflow(TINY), f"tenant{i}")
    now = datetime.now(UTC)
    combos = [*IDLE, *((DUE_CRON, zone) for zone in ZONES)]
    later = {c: parse_cron(*c).next_after(now + timedelta(days=1)) for c in combos}
    marked: dict[str, list[uuid.UUID]] = {zone: [] for zone in ZONES}
    step, rows = n // due, []
    for i in range(n):
        k, sid = i // step, uuid.uuid4()
        cron, zone = IDLE[i % len(IDLE)]
        tenant = tenants[i % TENANTS]
        if i % step == 0 and k < due:
            cron, zone, tenant = DUE_CRON, ZONES[k % len(ZONES)], tenants[k % TENANTS]
            marked[zone].append(sid)
        rows.append(
            {"id": sid, "tenant_id": tenant, "name": f"s{i}", "workflow_name": "tiny",
             "origin": ScheduleOrigin.MANUAL, "cron": cron, "timezone": zone, "input": {},
             "priority": None, "misfire": MisfirePolicy.ONCE, "catch_up": 10, "enabled": True,
             "next_run_at": later[cron, zone], "last_run_at": None, "run_count": 0,
             "created_at": now, "updated_at": now}
        )  # fmt: skip
    with service.db.engine.begin() as conn:
        for start in range(0, n, CHUNK):
            conn.execute(insert(Schedule), rows[start : start + CHUNK])
    with service.db.engine.begin() as conn:  # after the commit: the planner sees the rows
        conn.execute(text("ANALYZE"))
    return marked


def reset(svc: harness.Services, db: Database, marked: dict[str, list[uuid.UUID]]) -> None:
    """Forget the last round's runs and messages; make the marked schedules due at their latest
    slot (under a minute old: on time), never in a minute's last seconds, so that no check
    straddles the next slot (which would rightly start a second run): ~2 ms a run, and more."""
    left = 60 - (time.time() % 60)
    if left < 3 + sum(map(len, marked.values())) / 500:
        time.sleep(left + 0.05)
    svc.flush()
    now = datetime.now(UTC)
    with db.engine.begin() as conn:
        conn.execute(text("TRUNCATE jobs, executions CASCADE"))
        for zone, ids in marked.items():
            (slot,) = parse_cron(DUE_CRON, zone).latest(now, now - timedelta(days=2), 1)
            values = {"next_run_at": slot, "last_run_at": None, "run_count": 0}
            conn.execute(update(Schedule).where(Schedule.id.in_(ids)).values(**values))


def check_round(service: Conveyor, due: int) -> float:
    """Seconds for one ``check_schedules``; it must have started exactly ``due`` runs."""
    started_at = time.perf_counter()
    started = service.check_schedules()
    elapsed = time.perf_counter() - started_at
    with service.db.engine.connect() as conn:
        query = select(func.count()).where(Execution.trigger == "schedule")
        stored = conn.execute(query).scalar_one()
    if started != due or stored != due:  # a benchmark that measured nothing must say so
        raise RuntimeError(f"expected {due} runs, started {started}, stored {stored}")
    return elapsed


def raw_publish(app: Celery, n: int) -> float:
    """Seconds for raw Celery to publish n messages to the same queue, as the dispatcher does."""
    started_at = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            app.send_task("bench.noop", args=[str(uuid.uuid4())], queue=EXECUTION_QUEUE,
                          priority=3, producer=producer)  # fmt: skip
    return time.perf_counter() - started_at


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    n, due = args.schedules, args.due
    if not 0 < due <= n or args.rounds < 1:
        parser.error("need 0 < --due <= --schedules and --rounds >= 1")

    with harness.services() as svc:
        app = create_app(Settings(database_url=svc.database_url, broker_url=svc.redis_url))
        dispatcher, db = CeleryDispatcher(app), Database(svc.database_url)
        service = Conveyor(db, dispatcher)
        marked = populate(service, n, due)
        checks: list[float] = []
        raws: list[float] = []
        for _ in range(args.rounds):
            reset(svc, db, marked)
            checks.append(check_round(service, due))
            svc.flush()
            raws.append(raw_publish(app, due))
        # its parts, once: the due check as one transaction, then publishing what it started
        reset(svc, db, marked)
        began = time.perf_counter()
        grace = service.misfire_grace
        checked = db.run(lambda s: check_due(s, datetime.now(UTC), limit=due, grace=grace))
        transaction = time.perf_counter() - began
        dispatcher.publish(checked.dispatches)
        publish = time.perf_counter() - began - transaction
        if len(checked.dispatches) != due:
            raise RuntimeError(f"the due check alone started {len(checked.dispatches)} runs")
        db.dispose()

    check, raw, fastest = statistics.median(checks), statistics.median(raws), min(checks)
    results = {
        "schedules": n, "due": due, "rounds": args.rounds,
        "check_seconds": checks, "raw_publish_seconds": raws,
        "parts_seconds": {"check_due_transaction": transaction, "publish": publish},
        "ratios": {"check_vs_raw_publish": check / raw},
    }  # fmt: skip
    rows = [
        (f"due check ({n} schedules, {due} due, {args.rounds} rounds)", "", ""),
        (f"  raw Celery, publish {due} messages, median", f"{raw * 1e3:.1f} ms", ""),
        ("  check_schedules, median", f"{check * 1e3:.1f} ms", f"x{check / raw:.2f} of raw"),
        ("  check_schedules, min", f"{fastest * 1e3:.1f} ms", f"x{fastest / min(raws):.2f} of raw"),
        ("  per started run", f"{check / due * 1e6:.1f} µs", f"raw {raw / due * 1e6:.1f} µs"),
        (f"  parts: check_due, one transaction of {due}", f"{transaction * 1e3:.1f} ms", ""),
        ("  parts: publishing them", f"{publish * 1e3:.1f} ms", f"x{publish / raw:.2f} of raw"),
    ]  # fmt: skip
    for label, value, ratio in rows:
        print(f"{label:<52} {value:>12}  {ratio}")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump(results, out, indent=2)
    return results


if __name__ == "__main__":
    main()
