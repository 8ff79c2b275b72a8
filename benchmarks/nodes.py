"""Node functions and the raw-Celery twin the benchmarks run."""

from __future__ import annotations

import os
from functools import lru_cache

import redis
from celery import Celery
from celery.signals import worker_ready

import conveyor


@conveyor.node("bench.noop")
def noop() -> dict[str, bool]:
    return {"ok": True}


# The same no-op as a plain Celery task, with the settings Conveyor uses (acks late, prefetch 1).
raw = Celery("bench", broker=os.environ.get("BENCH_BROKER_URL", "memory://"))
raw.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
)


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["BENCH_BROKER_URL"])


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
