"""Where a node's CPU goes: one-node executions drained by real workers, and the same number of
raw Celery tasks, with the CPU time of every process that served them read from ``/proc``
before and after (Linux). Printed per node and process group, both sides in turns:

    python -m benchmarks.cpu [--executions 6000] [--rounds 2] [--json cpu.json]

With ``--fanout N``, fan-outs of N members one after another instead (``--executions``
nodes' worth, the width's root and join counted), against as many chords of N tasks; with
``--chain N``, chains of N steps (:mod:`benchmarks.chains`) against Celery chains of N tasks.

On a 2-core machine the CPU per node is what the throughput is made of, and it moves less from
run to run than the throughput itself: a change that saves CPU shows here first. Needs what
the tests need (a database of its own; Redis db 14, flushed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks import chains, harness
from benchmarks.bench import Bench
from benchmarks.compare import (
    ONE_NODE,
    conveyor_fanout,
    fanout_definition,
    raw_fanout,
    wait_completed,
)
from conveyor.engine.validation import parse_workflow

_TICK = os.sysconf("SC_CLK_TCK")
GROUPS = ("node worker, main", "node worker, pool", "PostgreSQL", "Redis", "other workers")


def _stat(pid: int) -> tuple[int, float] | None:
    """A process's parent and CPU seconds (user and system), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _descendants(root: int) -> dict[int, int]:
    """Every live process under ``root``: pid -> parent."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = found[0]
    below, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        below.update({pid: parents[pid] for pid in frontier})
    return below


class Processes:
    """The processes serving a drain, grouped: the node workers' main process and pool
    processes, the database's backends, the Redis server, and any other worker."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.database = bench.svc.database_url.rsplit("/", 1)[1]
        self.redis_pid = int(bench.redis.info("server")["process_id"])

    def groups(self) -> dict[int, str]:
        found = {self.redis_pid: "Redis"}
        with self.bench.database.engine.connect() as conn:
            backends = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": self.database},
            ).scalars()
            found.update(dict.fromkeys(backends, "PostgreSQL"))
        workers = _descendants(os.getpid())
        for pid, parent in workers.items():
            queue_of = _cmdline(pid if parent == os.getpid() else parent)
            node = "-Q workflow-node" in queue_of or "-Q raw" in queue_of
            role = "main" if parent == os.getpid() else "pool"
            found[pid] = f"node worker, {role}" if node else "other workers"
        return found

    def cpu(self) -> dict[int, tuple[str, float]]:
        return {
            pid: (group, stat[1])
            for pid, group in self.groups().items()
            if (stat := _stat(pid)) is not None
        }


@contextmanager
def counted(processes: Processes, per: int, into: dict[str, float]) -> Iterator[None]:
    """Milliseconds of CPU per ``per`` nodes of each group, over the block: a process that
    starts inside it counts from zero."""
    before = processes.cpu()
    yield
    spent: dict[str, float] = defaultdict(float)
    for pid, (group, seconds) in processes.cpu().items():
        spent[group] += seconds - (before[pid][1] if pid in before else 0.0)
    into.update({group: 1000 * spent[group] / per for group in GROUPS})


def conveyor_drain(bench: Bench, processes: Processes, n: int) -> dict[str, float]:
    made = {bench.client.trigger("one") for _ in range(n)}
    found: dict[str, float] = {}
    with bench.conveyor_workers(), counted(processes, n, found):
        wait_completed(bench, made, timeout=120 + n / 10)
    return found


def raw_drain(bench: Bench, processes: Processes, n: int) -> dict[str, float]:
    raw, key = bench.raw_app(), f"bench:count:{uuid.uuid4().hex[:6]}"
    with raw.producer_or_acquire() as producer:
        for _ in range(n):
            raw.send_task("bench.raw_count", args=[key, n], queue="raw", producer=producer)
    found: dict[str, float] = {}
    with bench.raw_workers(), counted(processes, n, found):
        deadline = time.monotonic() + 120 + n / 10
        while bench.redis.get(f"{key}:done") is None:
            if time.monotonic() > deadline:
                raise RuntimeError("raw tasks not drained")
            time.sleep(0.05)
    return found


def one_by_one(
    workers: AbstractContextManager[Any],
    one: Callable[[], float],
    processes: Processes,
    n: int,
    size: int,
) -> dict[str, float]:
    """Runs of ``size`` nodes each (``one`` runs one: a fan-out and its chord, a chain and
    its Celery chain) one after another, about ``n`` nodes in all, on ``workers``, after an
    untimed one (the definition cache, the connections)."""
    count = max(1, round(n / size))
    found: dict[str, float] = {}
    with workers:
        one()
        with counted(processes, count * size, found):
            for _ in range(count):
                one()
    return found


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {group: statistics.median(r[group] for r in rounds) for group in GROUPS}


def table(conveyor: dict[str, float], raw: dict[str, float]) -> str:
    lines = [f"{'CPU per node (ms)':<26}{'Conveyor':>10}{'raw Celery':>12}"]
    for group in GROUPS:
        lines.append(f"{group:<26}{conveyor[group]:>10.3f}{raw[group]:>12.3f}")
    lines.append(f"{'all':<26}{sum(conveyor.values()):>10.3f}{sum(raw.values()):>12.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=6_000)
    parser.add_argument("--concurrency", type=int, default=4, help="processes per node pool")
    parser.add_argument("--rounds", type=int, default=2, help="drains a side (the median)")
    parser.add_argument("--fanout", type=int, default=0, help="fan-outs this wide instead")
    parser.add_argument("--chain", type=int, default=0, help="chains this long instead")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)

    sides: dict[str, list[dict[str, float]]] = {"conveyor": [], "raw": []}
    drains: dict[str, Callable[[Bench, Processes, int], dict[str, float]]] = {
        "conveyor": conveyor_drain, "raw": raw_drain,
    }  # fmt: skip
    if args.fanout:  # a fan-out's width, its root and its join
        size = args.fanout + 2
        drains = {
            "conveyor": lambda b, p, n: one_by_one(
                b.conveyor_workers(), lambda: conveyor_fanout(b, args.fanout), p, n, size
            ),
            "raw": lambda b, p, n: one_by_one(
                b.raw_workers(), lambda: raw_fanout(b, args.fanout), p, n, size
            ),
        }
    elif args.chain:
        drains = {
            "conveyor": lambda b, p, n: one_by_one(
                b.conveyor_workers(), lambda: chains.conveyor_chain(b, args.chain), p, n,
                args.chain,
            ),
            "raw": lambda b, p, n: one_by_one(
                b.raw_workers(), lambda: chains.raw_chain(b, args.chain), p, n, args.chain
            ),
        }  # fmt: skip
    with harness.services() as svc:
        bench = Bench(svc, args.concurrency)
        bench.client.apply(parse_workflow(ONE_NODE))
        if args.fanout:
            bench.client.apply(parse_workflow(fanout_definition(args.fanout)))
        if args.chain:
            bench.client.apply(parse_workflow(chains.definition(args.chain)))
        processes = Processes(bench)
        for _ in range(args.rounds):  # the sides take turns: the machine drifts
            for side, drain in drains.items():
                sides[side].append(drain(bench, processes, args.executions))
        bench.database.dispose()
        bench.redis.close()

    results = {
        "params": vars(args),
        "conveyor_ms_per_node": medians(sides["conveyor"]),
        "raw_ms_per_node": medians(sides["raw"]),
        "rounds": sides,
    }
    print(table(results["conveyor_ms_per_node"], results["raw_ms_per_node"]))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
