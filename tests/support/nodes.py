"""Node functions the integration and acceptance tests register (CONVEYOR_IMPORTS).

Their side effects go to the ``test_effects`` table through plain SQL on the test database,
so that a test run in another process (a real ``celery worker``) can be checked too.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sqlalchemy import create_engine, text

import conveyor
from conveyor import NodeContext

_engine_lock = threading.Lock()
_engines: dict[str, Any] = {}
barriers: dict[str, threading.Barrier] = {}


def _engine() -> Any:
    url = os.environ["CONVEYOR_DATABASE_URL"]
    with _engine_lock:
        if url not in _engines:
            _engines[url] = create_engine(url, pool_size=5)
        return _engines[url]


def record(ctx: NodeContext, value: Any = None) -> None:
    """Write one effect row keyed by the node run; a second run of the node shows as a row."""
    with _engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO test_effects (idempotency_key, node_id, attempt, value) "
                "VALUES (:k, :n, :a, :v)"
            ),
            {"k": ctx.idempotency_key, "n": ctx.node_id, "a": ctx.attempt, "v": str(value)},
        )


@conveyor.node("test.noop")
def noop() -> None:
    """No work and no effect: what such a node costs is the engine's alone."""


@conveyor.node("test.add")
def add(a: float, b: float, ctx: NodeContext) -> dict[str, float]:
    record(ctx, a + b)
    return {"sum": a + b}


@conveyor.node("test.sleep_add")
def sleep_add(a: float, b: float, seconds: float, ctx: NodeContext) -> dict[str, float]:
    time.sleep(seconds)
    record(ctx, a + b)
    return {"sum": a + b}


@conveyor.node("test.flaky")
def flaky(failures: int, ctx: NodeContext) -> dict[str, int]:
    record(ctx, "try")
    if ctx.attempt <= failures:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"succeeded_on": ctx.attempt}


@conveyor.node("test.fail")
def fail(message: str, ctx: NodeContext) -> None:
    record(ctx, "try")
    raise RuntimeError(message)


@conveyor.node("test.fail_permanently")
def fail_permanently(ctx: NodeContext) -> None:
    record(ctx, "try")
    raise conveyor.NonRetryableError("the input can never work")


@conveyor.node("test.fails_first_run")
def fails_first_run(ctx: NodeContext) -> dict[str, int]:
    """Fail (not retryable) on the first try the node ever makes in its execution, as counted
    in ``test_effects`` (so across processes and a requeue); succeed on any later one."""
    record(ctx, "try")
    with _engine().begin() as conn:
        tries = conn.execute(
            text("SELECT count(*) FROM test_effects WHERE idempotency_key = :k"),
            {"k": ctx.idempotency_key},
        ).scalar_one()
    if tries == 1:
        raise conveyor.NonRetryableError("its first run fails")
    return {"tries": tries}


@conveyor.node("test.barrier")
def barrier(name: str, value: int, ctx: NodeContext) -> dict[str, int]:
    """Wait until every parallel sibling reaches the barrier, so they all finish together."""
    barriers[name].wait(timeout=20)
    record(ctx, value)
    return {"value": value}


@conveyor.node("test.sleep")
def sleep(seconds: float, ctx: NodeContext) -> dict[str, bool]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.02)
    record(ctx, "slept")
    return {"cancelled": ctx.cancelled}


@conveyor.node("test.stops_once")
def stops_once(ctx: NodeContext) -> dict[str, bool]:
    """Its first try is told to stop, as the watcher tells a node whose execution ended, while
    the execution runs on (the end undone at once, as by a requeued dead letter), and returns
    early, saying so. The worker is waiting on the call by then (its next look at the cancel
    is 0.2 s away), so the try ends by its return, not by the worker giving up on it."""
    if ctx.attempt == 1:
        time.sleep(0.02)
        ctx.cancel_event.set()
    return {"cancelled": ctx.cancelled}


@conveyor.node("test.span")
def span(tenant: str, workflow: str, seconds: float, ctx: NodeContext) -> dict[str, float]:
    """Sleep, and record when this run started and ended (for concurrency checks)."""
    started = time.time()
    time.sleep(seconds)
    ended = time.time()
    with _engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO test_spans (execution_id, node_id, tenant, workflow, started, "
                "ended, pid) VALUES (:e, :n, :t, :w, :s, :d, :p)"
            ),
            {
                "e": ctx.execution_id,
                "n": ctx.node_id,
                "t": tenant,
                "w": workflow,
                "s": started,
                "d": ended,
                "p": os.getpid(),
            },
        )
    return {"started": started}


switches: dict[str, bool] = {}  # in-process worker only: a test turns a failing node good


@conveyor.node("test.switch")
def switch(name: str, ctx: NodeContext) -> dict[str, bool]:
    """Fail while the switch is off (a broken third party), succeed once a test turns it on."""
    record(ctx, "try")
    if not switches.get(name):
        raise RuntimeError(f"switch {name} is off")
    return {"on": True}


@conveyor.node("test.until_file")
def until_file(path: str, ctx: NodeContext, after: str = "") -> dict[str, bool]:
    """Fail while no file is at ``path`` (a broken third party), succeed once a test puts one
    there: a switch every process sees, a real ``celery worker``'s too. With ``after``, it
    first waits (up to 20 s) for that node of its execution to have run, so that a sibling
    finishes before this one fails its execution, however the workers take them."""
    deadline = time.monotonic() + 20
    sibling = f"{ctx.execution_id}:{after}"
    while after and time.monotonic() < deadline:
        with _engine().connect() as conn:
            ran = conn.execute(
                text("SELECT count(*) FROM test_effects WHERE idempotency_key = :k"),
                {"k": sibling},
            ).scalar_one()
        if ran:
            break
        time.sleep(0.02)
    record(ctx, "try")
    if not os.path.exists(path):
        raise RuntimeError(f"no file at {path} yet")
    return {"on": True}


@conveyor.node("test.wait_for_file")
def wait_for_file(path: str, ctx: NodeContext) -> dict[str, bool]:
    """Run until a test puts a file at ``path`` (60 s at most), then write the effect: a node
    a test keeps running for as long as it needs, whatever the load (a cancel ends it)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.02)
    record(ctx, "waited")
    return {"found": os.path.exists(path)}


@conveyor.node("test.chaos_effect")
def chaos_effect(seconds: float, ctx: NodeContext) -> dict[str, str]:
    """The side effect of a careful node author: keyed by ctx.idempotency_key, so that a node
    run again (a worker killed after the effect, a duplicate) leaves one effect row (whose
    `runs` counts the re-runs)."""
    time.sleep(seconds)
    _chaos_record(ctx.idempotency_key)
    return {"key": ctx.idempotency_key}


@conveyor.node("test.chaos_collect")
def chaos_collect(values: list[Any], ctx: NodeContext) -> dict[str, Any]:
    """A map's successor with the same careful effect (keyed, its re-runs counted), returning
    the values it got, in the order it got them."""
    _chaos_record(ctx.idempotency_key)
    return {"values": values}


def _chaos_record(key: str) -> None:
    with _engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO chaos_effects (key) VALUES (:k) "
                "ON CONFLICT (key) DO UPDATE SET runs = chaos_effects.runs + 1"
            ),
            {"k": key},
        )


@conveyor.node("test.current_span")
def current_span(ctx: NodeContext) -> dict[str, str]:
    """The trace and span ids of the span current in the node's code (its try's)."""
    from opentelemetry import trace

    seen = trace.get_current_span().get_span_context()
    return {"trace_id": format(seen.trace_id, "032x"), "span_id": format(seen.span_id, "016x")}


def _tries(ctx: NodeContext) -> int:
    """How many effects this node run recorded before."""
    with _engine().connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM test_effects WHERE idempotency_key = :k"),
            {"k": ctx.idempotency_key},
        ).scalar_one()
    return int(found)


@conveyor.node("test.snooze")
def snooze(times: int, seconds: float, ctx: NodeContext) -> dict[str, int]:
    """Snooze ``times`` times ("not ready yet"), then succeed."""
    tried = _tries(ctx)
    record(ctx, "try")
    if tried < times:
        ctx.snooze(seconds, f"not ready yet ({tried + 1} of {times})")
    return {"tries": tried + 1, "attempt": ctx.attempt}


@conveyor.node("test.cancel")
def cancel(reason: str, ctx: NodeContext) -> None:
    record(ctx, "try")
    raise conveyor.CancelExecution(reason)


@conveyor.node("test.skip")
def skip(reason: str, ctx: NodeContext) -> None:
    record(ctx, "try")
    raise conveyor.Skip(reason)


@conveyor.node("test.item")
def item(value: Any, ctx: NodeContext, seconds: float = 0.0, fail_on: Any = ()) -> dict[str, Any]:
    """A map's item: sleeps ``seconds``, records its effect (keyed by execution, node and
    index), and fails (not retried) for the indices in ``fail_on``."""
    time.sleep(seconds)
    record(ctx, value)
    if ctx.index in fail_on:
        raise conveyor.NonRetryableError(f"item {ctx.index} refused")
    return {"value": value, "index": ctx.index, "item": ctx.item}


@conveyor.node("test.collect")
def collect(values: list[Any], ctx: NodeContext) -> dict[str, Any]:
    """A map's successor: records how many values it got, and returns them."""
    record(ctx, len(values))
    return {"values": values}


_OVERLAP = """
local running = redis.call('INCR', KEYS[1])
if running > tonumber(redis.call('GET', KEYS[2]) or '0') then
    redis.call('SET', KEYS[2], running)
end
return running
"""


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["CONVEYOR_REDIS_URL"])


@conveyor.node("test.overlap")
def overlap(key: str, seconds: float, ctx: NodeContext) -> dict[str, Any]:
    """Count itself running under ``key`` in Redis (the peak kept atomically), for
    ``seconds``: how many ran at once is the nodes' own count, not the engine's."""
    client = _redis()
    running = client.eval(_OVERLAP, 2, f"test:overlap:{key}:running", f"test:overlap:{key}:peak")
    try:
        time.sleep(seconds)
    finally:
        client.decr(f"test:overlap:{key}:running")
        client.close()
    record(ctx, running)
    return {"index": ctx.index}


def overlap_peak(key: str) -> int:
    """The most ``test.overlap`` nodes under ``key`` that ran at once."""
    client = _redis()
    try:
        return int(client.get(f"test:overlap:{key}:peak") or 0)
    finally:
        client.close()
