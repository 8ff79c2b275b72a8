"""Node functions and the raw-Celery twin the benchmarks run."""

from __future__ import annotations

import os
import time
from functools import lru_cache

import redis
from celery import Celery, chord, group
from celery.signals import worker_ready

import conveyor


@conveyor.node("bench.noop")
def noop() -> dict[str, bool]:
    return {"ok": True}


@conveyor.node("bench.nothing")
def nothing() -> None:
    """A no-op whose output is null (a map's item that adds least to its map's output)."""


@conveyor.node("bench.sleep")
def sleep(seconds: float) -> dict[str, bool]:
    """A node that waits, as one calling a remote service would (benchmarks.batching)."""
    time.sleep(seconds)
    return {"ok": True}


# The same no-op as a plain Celery task, with the settings Conveyor's workers use by default:
# acks late, prefetch 1, and task events on (CONVEYOR_TASK_EVENTS, for Flower).
raw = Celery("bench", broker=os.environ.get("BENCH_BROKER_URL", "memory://"))
raw.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    task_send_sent_event=True,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
)


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL") or os.environ["BENCH_BROKER_URL"])


@raw.task(name="bench.raw_noop")
def raw_noop(counter_key: str) -> None:
    """No work; the counter is how the benchmark sees the last task finish."""
    _redis().incr(counter_key)


@worker_ready.connect
def _announce(sender: object = None, **_: object) -> None:
    """Tell the harness this worker is consuming (a file named after the worker's pid)."""
    ready_dir = os.environ.get("BENCH_READY_DIR")
    if ready_dir:
        open(os.path.join(ready_dir, str(os.getpid())), "w").close()


# -- the raw-Celery twins of the comparison benchmark (benchmarks.compare) -----------------
# A chord needs a result backend: the same Redis. Only the chord's members keep results.
raw.conf.update(
    result_backend=os.environ.get("BENCH_REDIS_URL")
    or os.environ.get("BENCH_BROKER_URL", "cache+memory://"),
    task_default_queue="raw",  # the chord's tasks too
)


@raw.task(name="bench.raw_count")
def raw_count(counter_key: str, target: int) -> None:
    """Count; the first task records when it ran, and so does the one that brings the count
    to ``target`` (the others make one round trip, as Conveyor's no-op makes none)."""
    count = _redis().incr(counter_key)
    if count == 1:
        _redis().set(f"{counter_key}:first", time.time())
    if count == target:
        _redis().set(f"{counter_key}:done", time.time())


@conveyor.node("bench.started")
def started(key: str) -> dict[str, bool]:
    """Record when the node's code started (the latency benchmark's trigger -> start)."""
    _redis().rpush(key, time.time())
    return {"ok": True}


@raw.task(name="bench.raw_started")
def raw_started(key: str) -> None:
    """Record when the task started (the latency benchmark's apply_async -> start)."""
    _redis().rpush(key, time.time())


@raw.task(name="bench.raw_member", ignore_result=False)
def raw_member() -> None:
    """A chord member: no work, a result for the chord to count."""


@raw.task(name="bench.raw_join")
def raw_join(_results: object, key: str) -> None:
    """The chord's callback: records when the fan-in ran."""
    _redis().set(key, time.time())


@raw.task(name="bench.raw_root")
def raw_root(n: int, key: str) -> None:
    """The root of the fan-out: starts a chord of ``n`` members and the join."""
    chord([raw_member.s() for _ in range(n)])(raw_join.s(key))


@raw.task(name="bench.raw_item", ignore_result=False)
def raw_item(item: object) -> object:
    """A chord member over a list's item: no work, the item as its result."""
    return item


@raw.task(name="bench.raw_map_root")
def raw_map_root(items: list[object], key: str) -> None:
    """The root of the map's twin: a chord over ``items`` and the join, as a map's own job
    makes a job per item of the list it reads."""
    chord(group(raw_item.s(i) for i in items))(raw_join.s(key))


@raw.task(name="bench.raw_relay")
def raw_relay(key: str) -> None:
    """Publish the task that records its start: the raw twin of an event that wakes a wait
    whose successor then starts (benchmarks.waits: apply -> the second task started)."""
    raw_started.delay(key)


@raw.task(name="bench.raw_step")
def raw_step() -> None:
    """A raw chain's step: no work (the chain's next message is sent as it ends)."""


@raw.task(name="bench.raw_end")
def raw_end(key: str) -> None:
    """A raw chain's last step: records when it ran."""
    _redis().set(key, time.time())
