"""The operators' overview: process-wide figures as JSON, which the overview page fetches
every few seconds and draws as SVG (ui.js). Only an operator's session reads them: they span
every tenant (queues, limits and alerts are shared by all)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor import metrics
from conveyor.engine.limits import KeyUsage
from conveyor.engine.ports import Limiter
from conveyor.store import Database

STEP = timedelta(minutes=5)
STEPS = 12  # an hour of steps


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile ``q`` (0 to 1) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def limits_json(permits: list[KeyUsage], tenant_names: dict[str, str]) -> list[dict[str, Any]]:
    """Each limit in use or with jobs waiting, named as `conveyor limits` names it."""
    return [
        {"scope": p.kind, "name": p.name(tenant_names), "in_use": p.in_use, "limit": p.limit,
         "waiting": p.waiting}
        for p in permits
        if p.in_use or p.waiting
    ]  # fmt: skip


def figures(database: Database, broker_url: str, limiter: Limiter | None) -> dict[str, Any]:
    """Every figure of the operators' overview, now."""
    now = datetime.now(UTC)
    since = now - STEP * STEPS
    # the last step ends now: steps begin at since, since + STEP, ...
    with database.snapshot() as store:
        steps = store.attempt_steps(since, STEP, STEPS)
        latencies = store.start_latencies(since)
        firing = store.alerts_firing()
        permits = limiter.snapshot() if limiter is not None else []
        names = {str(t.id): t.name for t in store.tenants()} if permits else {}
    depth = metrics.queue_depth(broker_url)
    return {
        "taken_at": now.isoformat(),
        "queues": (
            [{"queue": q, "priority": p, "depth": n} for (q, p), n in sorted(depth.items())]
            if depth is not None else None
        ),
        "steps": [
            {"start": s.start.isoformat(), "succeeded": s.succeeded, "failed": s.failed,
             "error_rate": round(s.failed / (s.succeeded + s.failed), 4)
             if s.succeeded + s.failed else None}
            for s in steps
        ],
        "latency": {"count": len(latencies), "p50": percentile(latencies, 0.5),
                    "p95": percentile(latencies, 0.95)},
        "limits": limits_json(permits, names),
        "alerts": firing,
    }  # fmt: skip
