"""Waits: event sent -> the waiting node's successor started, beside raw Celery's round trip
of a task that publishes a second task (apply -> second task started), p50 / p95 / p99.

Each Conveyor run starts an execution whose wait node waits for ``bench.go`` on a key of its
own, and once it waits (its row in ``waits``) sends the event and times until the successor's
code starts (it pushes the time to a Redis list, as the latency figure's node does). The raw
run applies ``bench.raw_relay``, which publishes ``bench.raw_started``. The runs alternate on
idle workers; the first five of each warm connections and caches. A figure of
``python -m benchmarks`` (``--skip waits`` leaves it out).
"""

from __future__ import annotations

import time
import uuid

from benchmarks.bench import Bench
from conveyor.engine.validation import parse_workflow

EVENT = "bench.go"
WAITER = {
    "name": "waiter",
    "nodes": [
        {"id": "wait", "type": "wait", "config": {"event": EVENT, "key": "{{ input.order }}"}},
        {"id": "started", "type": "python", "needs": ["wait"],
         "config": {"function": "bench.started"}, "inputs": {"key": "{{ input.key }}"}},
    ],
}  # fmt: skip
SETTLE = 0.002  # as the latency figure's: the workers idle when a run starts
WARM = 5


def waits(bench: Bench, runs: int) -> tuple[list[float], list[float]]:
    """Seconds from the event sent to the successor's start (Conveyor), and from apply to the
    second task's start (raw Celery), ``runs`` of each after ``WARM`` warm-up runs."""
    bench.client.apply(parse_workflow(WAITER))
    bench.at_rest()
    raw = bench.raw_app()
    ours, theirs = (f"bench:waits:{uuid.uuid4().hex[:6]}" for _ in range(2))
    woke, relayed = [], []
    with bench.conveyor_workers(), bench.raw_workers():
        for i in range(runs + WARM):
            took = _conveyor_run(bench, ours, f"{ours}:{i}")
            time.sleep(SETTLE)
            sent = time.time()
            raw.send_task("bench.raw_relay", args=[theirs], queue="raw")
            second = _popped(bench, theirs)
            if i >= WARM:
                woke.append(took)
                relayed.append(second - sent)
    return woke, relayed


def _conveyor_run(bench: Bench, key: str, order: str) -> float:
    made = bench.client.trigger("waiter", {"key": key, "order": order})
    _until_waiting(bench, order)
    time.sleep(SETTLE)
    sent = time.time()
    bench.client.send_event(EVENT, {}, key=order)
    started = _popped(bench, key)
    bench.finished_at(made, timeout=30)
    return started - sent


def _until_waiting(bench: Bench, order: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with bench.client.db.transaction() as store:
            if store.waits_for(store.tenant_id("default"), EVENT, order):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the wait for {order!r} did not begin within {timeout:g} s")
        time.sleep(0.002)


def _popped(bench: Bench, key: str) -> float:
    popped = bench.redis.blpop([key], timeout=30)
    if popped is None:
        raise RuntimeError("the successor (second task) did not start within 30 s")
    return float(popped[1])
