"""``conveyor stats``: the metrics of ``GET /metrics`` as a table, once or refreshed."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from conveyor import metrics, wiring
from conveyor.cli import render
from conveyor.cli.common import JsonFlag, embedded_schema
from conveyor.config import get_settings


def _take() -> metrics.Snapshot:
    database, broker_url = wiring.database(), get_settings().resolved_broker_url
    return metrics.take(database, broker_url, wiring.limiter(), labelled=False)


def stats(
    watch: Annotated[
        float | None,
        typer.Option(min=0.5, help="Refresh every this many seconds (Ctrl-C stops)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Queue depth, jobs, latency, throughput, errors, dead letters, permits, schedule lag."""
    with embedded_schema():
        if as_json:
            render.print_json(snapshot_json(_take()))
            return
        if watch is None:
            render.out.print(view(_take(), None))
            return
        before = _take()
        with Live(view(before, None), console=render.out, auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(watch)
                    now = _take()
                    live.update(view(now, before), refresh=True)
                    before = now
            except KeyboardInterrupt:
                pass


def snapshot_json(snap: metrics.Snapshot) -> dict[str, Any]:
    return {
        "taken_at": snap.taken_at.isoformat(),
        "queue_depth": None if snap.queue_depth is None else [
            {"queue": q, "priority": p, "messages": n} for (q, p), n in snap.queue_depth.items()
        ],
        "jobs": [{"kind": k, "status": s, "count": n} for (k, s), n in snap.jobs.items()],
        "executions": snap.executions,
        "attempts": snap.attempts,
        "dead_letters": snap.dead_letters,
        "discarded": snap.discarded,
        "wait_seconds": {"p50": snap.wait.quantile(0.5), "p95": snap.wait.quantile(0.95),
                         "count": snap.wait.count},
        "run_seconds": {"p50": snap.run.quantile(0.5), "p95": snap.run.quantile(0.95),
                        "count": snap.run.count},
        "permits": [{"key": u.key, "in_use": u.in_use, "limit": u.limit, "waiting": u.waiting}
                    for u in snap.permits],
        "schedules_late": snap.schedules_late,
        "schedule_lag_seconds": round(snap.schedule_lag, 3),
    }  # fmt: skip


def view(snap: metrics.Snapshot, before: metrics.Snapshot | None) -> Group:
    """The tables; with an earlier snapshot, tries per second since then too."""
    depth = snap.queue_depth or {}
    # by priority where the broker keeps one line each (Redis), one count a queue (RabbitMQ)
    labels = [p for p in ("high", "normal", "low", "all") if any(p == k[1] for k in depth)]
    queues = Table("queue", *labels, title="broker queues", box=None)
    for queue in sorted({q for q, _ in depth}):
        queues.add_row(queue, *(str(depth.get((queue, p), 0)) for p in labels))
    work = Table("what", "count", title="work", box=None)
    for status, n in sorted(snap.executions.items()):
        work.add_row(f"executions {status}", str(n))
    for (kind, status), n in sorted(snap.jobs.items()):
        work.add_row(f"{kind} jobs {status}", str(n))
    health = Table("measure", "value", title="health", box=None)
    tries = sum(snap.attempts.values())
    failed = snap.attempts.get("failed", 0)
    health.add_row("tries (failed)", f"{tries} ({failed}, {100 * failed / tries:.1f} %)"
                   if tries else "0")  # fmt: skip
    if before is not None:
        seconds = max(1e-9, (snap.taken_at - before.taken_at).total_seconds())
        done = tries - sum(before.attempts.values())
        health.add_row("tries per second", f"{done / seconds:.1f}")
    health.add_row("wait p50 / p95", _pair(snap.wait))
    health.add_row("run p50 / p95", _pair(snap.run))
    health.add_row("dead letters (discarded)", f"{snap.dead_letters} ({snap.discarded})")
    health.add_row("schedules late (lag)", f"{snap.schedules_late} ({snap.schedule_lag:.1f} s)")
    parts: list[Any] = [queues] if snap.queue_depth is not None else []
    parts += [work, health]
    if snap.permits:
        parts.append(render.limits_table([render.limit_json(u, {}) for u in snap.permits]))
    return Group(*parts)


def _pair(hist: metrics.Histogram) -> str:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"≤{v:g} s"

    return f"{fmt(hist.quantile(0.5))} / {fmt(hist.quantile(0.95))}"
