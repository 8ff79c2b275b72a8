"""What sibling batching buys and costs: the same fan-outs with batching on (the defaults)
and off (``CONVEYOR_BATCH_MOST=1``), in one run, the two sides taking turns.

1. wide and small: one root, 200 (``--width``) no-op members, a join: time per node;
2. narrow and slow: one root, 8 members of 40 ms each, a join, on 8 processes: the time from
   trigger to the join's end, and how far apart the members started (batching packs the 8 in
   one message; the hand-back should start them within a quarter of the budget).

    python -m benchmarks.batching [--rounds 5] [--width 200] [--json results.json]

Needs PostgreSQL and Redis as the tests do (a database of its own; Redis db 14, flushed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from sqlalchemy import func, select

from benchmarks import harness
from benchmarks.bench import NOOP, Bench
from benchmarks.compare import conveyor_fanout, fanout_definition
from conveyor.engine.validation import parse_workflow
from conveyor.models import NodeState

SLOW = {"function": "bench.sleep"}
SLOW_MEMBERS = 8
SLOW_SECONDS = 0.04
SIDES = (("on", "8"), ("off", "1"))  # CONVEYOR_BATCH_MOST


def slow_definition() -> dict[str, Any]:
    members = [f"s{i}" for i in range(SLOW_MEMBERS)]
    member = {"type": "python", "needs": ["root"], "config": SLOW}
    return {
        "name": "slow8",
        "nodes": [
            {"id": "root", "type": "python", "config": NOOP},
            *({"id": m, **member, "inputs": {"seconds": SLOW_SECONDS}} for m in members),
            {"id": "join", "type": "python", "needs": members, "config": NOOP},
        ],
    }


def slow_fanout(bench: Bench) -> tuple[float, float]:
    """Seconds from trigger to the join's end, and between the first and last member's start."""
    started = time.time()
    made = bench.client.trigger("slow8")
    finished = bench.finished_at(made, timeout=60, poll=0.002)
    with bench.database.engine.connect() as conn:
        first, last = conn.execute(
            select(func.min(NodeState.started_at), func.max(NodeState.started_at)).where(
                NodeState.execution_id == made, NodeState.node_id.like("s%")
            )
        ).one()
    if first is None or last is None:
        raise RuntimeError("the members have no start recorded")
    return finished.timestamp() - started, (last - first).total_seconds()


def run(rounds: int, width: int) -> dict[str, Any]:
    """Each round starts one side's workers, warms every process (untimed runs: connections,
    imports, the definition cache), then times each figure; the sides take turns."""
    results: dict[str, Any] = {}
    with harness.services() as svc:
        wide, slow = Bench(svc, concurrency=4), Bench(svc, concurrency=SLOW_MEMBERS)
        wide.client.apply(parse_workflow(fanout_definition(width)))
        slow.client.apply(parse_workflow(slow_definition()))
        for name, _ in SIDES:
            results[name] = {"wide_s_per_node": [], "slow_total_s": [], "slow_spread_s": []}
        for _ in range(rounds):
            for name, batch_most in SIDES:
                env = {**wide.env, "CONVEYOR_BATCH_MOST": batch_most}
                with wide.conveyor_workers(env):
                    conveyor_fanout(wide, width)
                    results[name]["wide_s_per_node"].append(conveyor_fanout(wide, width))
                with slow.conveyor_workers(env):
                    for _ in range(3):
                        slow_fanout(slow)
                    total, spread = slow_fanout(slow)
                results[name]["slow_total_s"].append(total)
                results[name]["slow_spread_s"].append(spread)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=200, help="the wide fan-out's members")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    results = run(args.rounds, args.width)
    med = {
        side: {k: statistics.median(v) for k, v in figures.items()}
        for side, figures in results.items()
    }
    on, off = med["on"], med["off"]
    rows = [
        (f"fan-out {args.width} no-op: per node", "wide_s_per_node"),
        ("fan-out 8 x 40 ms: trigger to end", "slow_total_s"),
        ("fan-out 8 x 40 ms: starts spread", "slow_spread_s"),
    ]
    print(f"{'':36}{'batching on':>14}{'off':>12}  ratio")
    for label, key in rows:
        ratio = on[key] / off[key] if off[key] else float("nan")
        print(f"{label:36}{on[key] * 1e3:>11.2f} ms{off[key] * 1e3:>9.2f} ms  x{ratio:.2f}")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump({"medians": med, "rounds": results}, out, indent=2)


if __name__ == "__main__":
    main()
