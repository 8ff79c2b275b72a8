"""Run-time fan-out (a map) for :mod:`benchmarks.compare`:

1. a map of N no-op items and a successor, against raw Celery's
   ``chord(group(noop.s(i) for i in items))(callback)`` over the same list, started by a root
   task as the static fan-out's chord is (time per item: the map node's own job, the items and
   the successor, against the root, the members and the callback). It runs in the fan-out's
   rounds, the sides taking turns with the static fan-out's, so that the map's time per item
   is set beside both the static fan-out's time per node and the chord's;
2. scale: one map of 100,000 items on fresh workers, from a trigger in a process of its own:
   the time from trigger to the execution's end, and the peak RSS of each worker process and
   of the process that triggered it (the map must not hold all its items' jobs in memory).

``python -m benchmarks.maps trigger N`` is that trigger's process (used by :func:`scale`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.bench import END_POLL, NOOP, Bench
from conveyor.config import Settings
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher

DEFINITION = {
    "name": "map",
    "nodes": [
        {"id": "m", "type": "python", "config": NOOP, "map": {"over": "{{ input.rows }}"}},
        {"id": "after", "type": "python", "needs": ["m"], "config": NOOP},
    ],
}
# The scale's map: its items return nothing, so that its output (a list of 100,000 nulls,
# 600 kB) stays under the default CONVEYOR_MAX_OUTPUT_BYTES.
SCALE = {
    "name": "map_scale",
    "nodes": [
        {"id": "m", "type": "python", "config": {"function": "bench.nothing"},
         "map": {"over": "{{ input.rows }}"}},
        {"id": "after", "type": "python", "needs": ["m"], "config": NOOP},
    ],
}  # fmt: skip


def conveyor_map(bench: Bench, n: int) -> float:
    """Seconds per job from trigger to the successor's end: the map node's own, its ``n``
    items' and the successor's (as the static fan-out counts its root, members and join)."""
    started = time.time()
    made = bench.client.trigger("map", {"rows": list(range(n))})
    finished = bench.finished_at(made, timeout=120 + n, poll=END_POLL)
    return (finished.timestamp() - started) / (n + 2)


def raw_map(bench: Bench, n: int) -> float:
    """The chord over the same list: its root, its ``n`` members and its callback."""
    key = f"bench:map:{uuid.uuid4().hex[:6]}"
    started = time.time()
    bench.raw_app().send_task("bench.raw_map_root", args=[list(range(n)), key], queue="raw")
    return (bench.raw_finished_at(key, timeout=120 + n) - started) / (n + 2)


# -- 2. scale ------------------------------------------------------------------------------


def scale(bench: Bench, n: int) -> dict[str, Any]:
    """A map of ``n`` items on fresh workers (the execution's planner and the node pool),
    triggered by a process of its own: seconds from trigger to the end, and the peak RSS
    (VmHWM) of each worker process and of the trigger's, with each worker's RSS when it was
    ready (what the map added is the difference)."""
    bench.client.apply(parse_workflow(SCALE))
    bench.at_rest()
    with bench.conveyor_workers():
        ready = {pid: _status(pid, "VmRSS") for pid in _workers()}
        started = time.time()
        triggered = _trigger(bench, n)
        execution_id = uuid.UUID(triggered["execution_id"])
        finished = bench.finished_at(execution_id, timeout=600 + n / 10, poll=0.5)
        peaks = {pid: _status(pid, "VmHWM") for pid in ready}
        roles = {pid: _role(pid) for pid in ready}
    return {
        "items": n,
        "seconds": finished.timestamp() - started,
        "trigger_rss_mb": triggered["peak_kb"] / 1024,
        "trigger_rss_before_mb": triggered["before_kb"] / 1024,
        "workers": [
            {
                "process": roles[pid],
                "ready_rss_mb": ready[pid] / 1024,
                "peak_rss_mb": peaks[pid] / 1024,
            }
            for pid in sorted(ready, key=lambda p: roles[p])
        ],
    }


def scale_rows(found: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The scale map's rows of the printed table: its time, then each process's peak RSS."""
    rows = [
        (f"map of {found['items']:,} items, trigger -> done", f"{found['seconds']:.1f} s", "",
         f"{found['seconds'] / found['items'] * 1e3:.2f} ms per item"),
        ("  peak RSS, the trigger's process", f"{found['trigger_rss_mb']:.0f} MB", "",
         f"{found['trigger_rss_before_mb']:.0f} MB before it triggered"),
    ]  # fmt: skip
    rows += [
        (
            f"  peak RSS, {w['process']}",
            f"{w['peak_rss_mb']:.0f} MB",
            "",
            f"{w['ready_rss_mb']:.0f} MB when ready",
        )
        for w in found["workers"]
    ]
    return rows


def _trigger(bench: Bench, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.maps", "trigger", str(n)],
        cwd=harness.ROOT, env=bench.env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the trigger's process failed:\n{done.stdout}{done.stderr}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _workers() -> list[int]:
    """The worker processes under this one: each worker's main process and its pool's."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _below(int(entry.name), me):
            found.append(int(entry.name))
    return found


def _below(pid: int, ancestor: int) -> bool:
    while pid > 1:
        pid = _parent(pid)
        if pid == ancestor:
            return True
    return False


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _status(pid: int, field: str) -> int:
    """A field of /proc/PID/status in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _role(pid: int) -> str:
    """Which worker a process is, and whether its main process or one of its pool."""
    main = pid if _parent(pid) == os.getpid() else _parent(pid)
    try:
        command = Path(f"/proc/{main}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return "gone"
    queue = command[command.index("-Q") + 1] if "-Q" in command else "?"
    return f"{queue}, {'main' if main == pid else f'pool {pid}'}"


def trigger_main(n: int) -> None:
    """Trigger a map of ``n`` items from this process (CONVEYOR_* from the environment);
    print the execution's id and this process's RSS before and at its peak, as JSON."""
    settings = Settings()
    database = Database(settings.database_url)
    client = Conveyor(database, CeleryDispatcher(create_app(settings)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    made = client.trigger("map_scale", {"rows": list(range(n))})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    database.dispose()
    print(json.dumps({"execution_id": str(made), "before_kb": before, "peak_kb": peak}))


if __name__ == "__main__":
    if sys.argv[1:2] != ["trigger"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.maps trigger N")
    trigger_main(int(sys.argv[2]))
