"""Sequential steps for :mod:`benchmarks.compare` (and ``python -m benchmarks.ab REF --figure
chain``): a chain of N no-op python nodes, each needing the one before, against a raw Celery
``chain`` of N no-op tasks (the last records its end), from trigger (apply_async) to the last
step's end: seconds per step. The two sides take turns, round after round, both pools
running, after one untimed run each (connections, imports, the definition cache).

This is the shape published comparisons measure (Windmill's study: 40 light sequential
tasks), and the one where each step costs Conveyor a success, a message and a claim where a
chain costs Celery a message: what a continuation (CONVEYOR_CONTINUE_STEPS, see
docs/guarantees.md#continuations) saves.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from benchmarks.bench import END_POLL, NOOP, Bench
from conveyor.engine.validation import parse_workflow


def definition(n: int) -> dict[str, Any]:
    """``n`` no-op python nodes in a line."""
    steps = [f"s{i}" for i in range(n)]
    return {
        "name": f"chain{n}",
        "nodes": [
            {"id": s, "type": "python", "config": NOOP, **({"needs": [steps[i - 1]]} if i else {})}
            for i, s in enumerate(steps)
        ],
    }


def conveyor_chain(bench: Bench, n: int) -> float:
    """Seconds per step from trigger to the execution's end (its last step's)."""
    started = time.time()
    made = bench.client.trigger(f"chain{n}")
    finished = bench.finished_at(made, timeout=60 + n, poll=END_POLL)
    return (finished.timestamp() - started) / n


def raw_chain(bench: Bench, n: int) -> float:
    """Seconds per step from apply_async to the raw chain's last task's end."""
    from celery import chain

    from benchmarks.nodes import raw_end, raw_step

    key = f"bench:chain:{uuid.uuid4().hex[:6]}"
    bench.raw_app()  # its broker and backend set
    steps = [raw_step.si() for _ in range(n - 1)]
    started = time.time()
    chain(*steps, raw_end.si(key)).apply_async(queue="raw")
    return (bench.raw_finished_at(key, timeout=60 + n) - started) / n


def rounds(bench: Bench, n: int, count: int) -> dict[str, list[float]]:
    """``count`` runs of each side, taking turns, after one untimed run each."""
    bench.client.apply(parse_workflow(definition(n)))
    bench.at_rest()
    found: dict[str, list[float]] = {"conveyor": [], "raw": []}
    with bench.conveyor_workers(), bench.raw_workers():
        for i in range(count + 1):
            ours, theirs = conveyor_chain(bench, n), raw_chain(bench, n)
            if i:
                found["conveyor"].append(ours)
                found["raw"].append(theirs)
    return found
