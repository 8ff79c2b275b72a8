"""Conveyor beside raw Celery, in one run on the same Redis, PostgreSQL and worker settings:

1. fan-out / fan-in: one root, N parallel no-op nodes and a join, against a root task that
   starts a Celery chord of N no-op tasks and a callback (time per node); in the same
   rounds, a map of N no-op items against a chord over the same list (time per item, against
   the chord's and the static fan-out's: :mod:`benchmarks.maps`);
2. throughput: one-node executions drained by fresh workers, against plain Celery tasks with
   ``acks_late`` (nodes per second);
3. latency: trigger -> node start and trigger -> execution completed over sequential runs on
   idle workers, against apply_async -> task start (p50 / p95 / p99; the raw task is a no-op,
   so its start is its end: trigger -> completed is held to apply -> done);
   and a chain of N no-op nodes against a raw Celery ``chain`` of N no-op tasks (time per
   step, the sides taking turns: :mod:`benchmarks.chains`);
4. waits: event sent -> the waiting node's successor started, against a task that publishes
   a second task: apply -> second task started (p50 / p95 / p99: :mod:`benchmarks.waits`);
5. scale: the throughput again with finished jobs already in the tables; then the retention
   sweep deletes them (executions per second, Conveyor's alone); then a map of 100,000 items
   (its time, and the peak RSS of the workers and of the process that triggered it).

    python -m benchmarks [--fanout 200,2000] [--executions 10000] [--latency-runs 500]
                         [--wait-runs 200]
                         [--scale-rows 1000000] [--scale-map 100000] [--chain 40]
                         [--concurrency 4] [--rounds 3] [--skip fanout,map,chain,...]
                         [--json results.json]

Needs PostgreSQL and Redis as the tests do (a database of its own; Redis db 14, flushed).
Both sides run real ``celery worker`` processes with the same concurrency, prefetch 1 and late
acks; Conveyor's limits are on but never binding (what taking permits costs, not waiting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, text

from benchmarks import chains, harness, maps, waits
from benchmarks.bench import END_POLL, HOT_TABLES, NOOP, Bench
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, NodeState

ONE_NODE = {"name": "one", "nodes": [{"id": "n", "type": "python", "config": NOOP}]}
# The latency's node: it records when its code started, as the raw task does.
STARTED = {"name": "started", "nodes": [{"id": "n", "type": "python",
                                         "config": {"function": "bench.started"},
                                         "inputs": {"key": "{{ input.key }}"}}]}  # fmt: skip
# A pause before each latency run: the workers finish the last run's aftermath (acks, task
# events, permits) and are idle when the next run starts.
SETTLE = 0.002


def fanout_definition(n: int) -> dict[str, Any]:
    members = [f"n{i}" for i in range(n)]
    return {
        "name": f"fanout{n}",
        "nodes": [
            {"id": "root", "type": "python", "config": NOOP},
            *({"id": m, "type": "python", "needs": ["root"], "config": NOOP} for m in members),
            {"id": "join", "type": "python", "needs": members, "config": NOOP},
        ],
    }


# -- 1. fan-out / fan-in -------------------------------------------------------------------


def fanout(bench: Bench, n: int, rounds: int, mapped: bool = False) -> dict[str, list[float]]:
    """Seconds per node from trigger to the join's end, for Conveyor and for a chord (and,
    ``mapped``, per item of a map of ``n`` items and of a chord over the same list,
    :mod:`benchmarks.maps`): ``rounds`` runs of each, the sides taking turns with both pools
    running, after one untimed run each (connections, imports, the definition cache)."""
    bench.client.apply(parse_workflow(fanout_definition(n)))
    sides: dict[str, Callable[[], float]] = {
        "conveyor": lambda: conveyor_fanout(bench, n), "raw": lambda: raw_fanout(bench, n),
    }  # fmt: skip
    if mapped:
        bench.client.apply(parse_workflow(maps.DEFINITION))
        sides |= {"map": lambda: maps.conveyor_map(bench, n),
                  "raw_map": lambda: maps.raw_map(bench, n)}  # fmt: skip
    bench.at_rest()
    found: dict[str, list[float]] = {side: [] for side in sides}
    with bench.conveyor_workers(), bench.raw_workers():
        for i in range(rounds + 1):
            for side, one in sides.items():
                took = one()
                if i:
                    found[side].append(took)
    return found


def figure(ours: list[float], raws: list[float], per: str) -> dict[str, Any]:
    """Both sides' medians (seconds per ``per``) and every round's figure."""
    return {
        f"conveyor_s_per_{per}": statistics.median(ours),
        f"raw_s_per_{per}": statistics.median(raws),
        "conveyor_rounds": ours, "raw_rounds": raws,
    }  # fmt: skip


def conveyor_fanout(bench: Bench, n: int) -> float:
    started = time.time()
    made = bench.client.trigger(f"fanout{n}")
    finished = bench.finished_at(made, timeout=120 + n, poll=END_POLL)
    return (finished.timestamp() - started) / (n + 2)


def raw_fanout(bench: Bench, n: int) -> float:
    key = f"bench:chord:{uuid.uuid4().hex[:6]}"
    started = time.time()
    bench.raw_app().send_task("bench.raw_root", args=[n, key], queue="raw")
    return (bench.raw_finished_at(key, timeout=120 + n) - started) / (n + 2)


# -- 2. and 4. throughput ------------------------------------------------------------------


def conveyor_throughput(bench: Bench, n: int) -> float:
    """Nodes per second: n one-node executions queued, then drained by fresh workers, from
    the first node's start to the last execution's end (the workers' start-up is not timed,
    on either side)."""
    made = [bench.client.trigger("one") for _ in range(n)]
    with bench.conveyor_workers():
        wait_completed(bench, set(made), timeout=120 + n / 10)
    with bench.database.engine.connect() as conn:
        first = conn.execute(
            select(func.min(NodeState.started_at)).where(NodeState.execution_id.in_(made))
        ).scalar_one()
        last = conn.execute(
            select(func.max(Execution.finished_at)).where(Execution.id.in_(made))
        ).scalar_one()
    if first is None or last is None:
        raise RuntimeError("the drained executions have no start or end recorded")
    return n / (last - first).total_seconds()


def wait_completed(bench: Bench, ids: set[uuid.UUID], timeout: float) -> None:
    """Poll until every execution completed: every 0.2 s, a hundred of those not seen
    completed yet (the poll must not be the load, nor grow with the tables)."""
    deadline = time.monotonic() + timeout
    left = set(ids)
    with bench.database.engine.connect() as conn:
        while left:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(left)} executions not completed after {timeout:.0f} s")
            some = list(left)[:100]
            done = conn.execute(
                select(Execution.id).where(
                    Execution.id.in_(some), Execution.status == ExecutionStatus.COMPLETED
                )
            ).scalars()
            left.difference_update(done)
            conn.rollback()
            if left and not left & set(some):
                continue  # all those were done: look at the next ones at once
            time.sleep(0.2)


def raw_throughput(bench: Bench, n: int) -> float:
    """Tasks per second: the same no-op as n plain Celery tasks (acks late), drained, from
    the first task's start to the last one's end."""
    raw, key = bench.raw_app(), f"bench:count:{uuid.uuid4().hex[:6]}"
    with raw.producer_or_acquire() as producer:
        for _ in range(n):
            raw.send_task("bench.raw_count", args=[key, n], queue="raw", producer=producer)
    with bench.raw_workers():
        deadline = time.monotonic() + 120 + n / 10
        while (done := bench.redis.get(f"{key}:done")) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("raw tasks not drained")
            time.sleep(0.05)
    first = bench.redis.get(f"{key}:first")
    assert first is not None
    return n / (float(done) - float(first))


# -- 3. latency ----------------------------------------------------------------------------


def latency(bench: Bench, runs: int) -> tuple[dict[str, list[float]], list[float]]:
    """Conveyor: seconds from trigger to the node's code starting (it pushes the time to a
    Redis list the harness waits on) and to the execution completed. Raw Celery: seconds from
    apply_async to the task's code starting (the same push). Both pools run at once and the
    runs alternate, one after the other on idle workers (``SETTLE`` apart), so that both
    sides see the same machine; the first five of each warm connections, imports and caches."""
    bench.client.apply(parse_workflow(STARTED))
    bench.at_rest()
    raw = bench.raw_app()
    ours, theirs = (f"bench:started:{uuid.uuid4().hex[:6]}" for _ in range(2))
    to_start, to_done, raw_start = [], [], []
    with bench.conveyor_workers(), bench.raw_workers():
        for i in range(runs + 5):
            took_to_start, took_to_done = conveyor_latency(bench, ours)
            time.sleep(SETTLE)
            raw_started = time.time()
            raw.send_task("bench.raw_started", args=[theirs], queue="raw")
            task_start = _popped(bench, theirs)
            if i >= 5:
                to_start.append(took_to_start)
                to_done.append(took_to_done)
                raw_start.append(task_start - raw_started)
    return {"trigger_to_node_start": to_start, "trigger_to_completed": to_done}, raw_start


def conveyor_latency(bench: Bench, key: str) -> tuple[float, float]:
    """One run on idle workers (``SETTLE`` after the last): seconds from trigger to the
    node's code starting (it pushes the time to the Redis list ``key``) and to the execution
    completed."""
    time.sleep(SETTLE)
    started = time.time()
    made = bench.client.trigger("started", {"key": key})
    node_start = _popped(bench, key)
    finished = bench.finished_at(made, timeout=30)
    return node_start - started, finished.timestamp() - started


def _popped(bench: Bench, key: str) -> float:
    popped = bench.redis.blpop([key], timeout=30)
    if popped is None:
        raise RuntimeError("the node (task) did not start within 30 s")
    return float(popped[1])


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98]}


# -- 4. scale ------------------------------------------------------------------------------


def load_finished(bench: Bench, rows: int, chunk: int = 100_000) -> float:
    """``rows`` finished one-node executions, each with its node state, its completed job and
    its attempt, finished a day ago. Triggers off while loading (the status NOTIFYs), then
    vacuumed, analyzed and checkpointed, as a table that grew over months would be."""
    started = time.perf_counter()
    with bench.database.engine.connect() as conn:
        tenant, workflow = conn.execute(
            text("SELECT tenant_id, id FROM workflows WHERE name = 'one'")
        ).one()
        for first in range(0, rows, chunk):
            size = min(chunk, rows - first)
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text(LOAD_SQL), {"n": size, "tenant": tenant, "workflow": workflow})
            conn.commit()
        conn.execute(text("COMMIT"))
    with bench.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f"VACUUM ANALYZE {', '.join(HOT_TABLES)}"))
        # Flush what the load dirtied now: the checkpoint would otherwise fall inside the
        # measurement, which is of rows in the tables, not of having just written them.
        c.execute(text("CHECKPOINT"))
    return time.perf_counter() - started


def retention_sweep(bench: Bench, rows: int) -> dict[str, float]:
    """The retention sweep over the ``rows`` executions loaded (finished a day ago; those the
    other figures ran finished minutes ago, and stay): executions deleted per second. Conveyor's
    own figure, with no raw Celery counterpart: it keeps the sweep's cost in view as the
    tables grow."""
    started = time.perf_counter()
    pruned = bench.client.prune(timedelta(hours=1), most=rows)
    seconds = time.perf_counter() - started
    return {"pruned": pruned, "prune_seconds": seconds, "pruned_per_s": pruned / seconds}


LOAD_SQL = """
WITH made AS (
    INSERT INTO executions (id, tenant_id, workflow_id, status, priority, trigger, input,
                            output, remaining_nodes, created_at, started_at, finished_at)
    SELECT gen_random_uuid(), :tenant, :workflow, 'completed', 'normal', 'api', '{}',
           '{"n": {"ok": true}}', 0, t, t, t + interval '10 ms'
    FROM (SELECT now() - interval '1 day' - g * interval '1 ms' AS t
          FROM generate_series(1, :n) g) s
    RETURNING id, created_at
), states AS (
    INSERT INTO node_states (execution_id, node_id, status, waiting_on, output, started_at,
                             finished_at)
    SELECT id, 'n', 'completed', 0, '{"ok": true}', created_at, created_at FROM made
), jobs AS (
    INSERT INTO jobs (id, kind, queue, data, status, priority, max_retries, retry_count,
                      tries_before, tenant_id, workflow_id, execution_id, node_id, created_at,
                      enqueued_at, processed_at, heartbeat_at, completed_at)
    SELECT gen_random_uuid(), 'node', 'workflow-node', '{}', 'completed', 'normal', 2, 0, 0,
           :tenant, :workflow, id, 'n', created_at, created_at, created_at, created_at,
           created_at FROM made
    RETURNING id, created_at
)
INSERT INTO job_attempts (job_id, attempt_number, status, worker, started_at, finished_at,
                          duration, waited, timed_out, queue, workflow_id)
SELECT id, 1, 'succeeded', 'bench', created_at, created_at, 0.001, 0.001, false,
       'workflow-node', :workflow FROM jobs
"""


# -- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--fanout", default="200,2000", help="fan-out widths, comma-separated")
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--latency-runs", type=int, default=500)
    parser.add_argument("--wait-runs", type=int, default=200)
    parser.add_argument("--scale-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--scale-map", type=int, default=100_000, help="items of the scale's map (0: none)"
    )
    parser.add_argument("--chain", type=int, default=40, help="steps of the chain")
    parser.add_argument("--concurrency", type=int, default=4, help="processes per node pool")
    parser.add_argument(
        "--rounds", type=int, default=3, help="fan-out, chain and throughput runs (the median)"
    )
    parser.add_argument(
        "--skip", default="", help="skip: fanout,map,chain,throughput,latency,scale"
    )
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--broker",
        default="",
        help="both sides' broker (amqp://...: RabbitMQ); default Redis",
    )
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    results: dict[str, Any] = {"params": vars(args), "figures": {}}
    figures = results["figures"]
    with harness.services(args.broker) as svc:
        bench = Bench(svc, args.concurrency)
        bench.client.apply(parse_workflow(ONE_NODE))
        if "fanout" not in skip:
            for n in (int(w) for w in args.fanout.split(",") if w):
                found = fanout(bench, n, args.rounds, mapped="map" not in skip)
                figures[f"fanout_{n}"] = figure(found["conveyor"], found["raw"], "node")
                if "map" in found:
                    figures[f"map_{n}"] = figure(found["map"], found["raw_map"], "item")
        if "chain" not in skip:
            found = chains.rounds(bench, args.chain, args.rounds)
            figures[f"chain_{args.chain}"] = figure(found["conveyor"], found["raw"], "step")
        if "throughput" not in skip or "scale" not in skip:
            figures["throughput"] = throughput(bench, args)
        if "latency" not in skip:
            found, raw = latency(bench, args.latency_runs)
            figures["latency"] = {
                "conveyor_node_start": percentiles(found["trigger_to_node_start"]),
                "conveyor_completed": percentiles(found["trigger_to_completed"]),
                "raw_task_start": percentiles(raw),
            }
            results["raw_latencies"] = {**found, "raw_task_start": raw}
        if "waits" not in skip:
            woke, relayed = waits.waits(bench, args.wait_runs)
            figures["waits"] = {
                "conveyor_event_to_start": percentiles(woke),
                "raw_relay_start": percentiles(relayed),
            }
            results["raw_waits"] = {"event_to_start": woke, "raw_relay_start": relayed}
        if "scale" not in skip:
            loaded = load_finished(bench, args.scale_rows)
            figures["scale"] = {
                "rows": args.scale_rows,
                "load_seconds": loaded,
                "conveyor_per_s": median(conveyor_throughput, bench, args),
                **retention_sweep(bench, args.scale_rows),
            }
            if args.scale_map:
                figures["map_scale"] = maps.scale(bench, args.scale_map)
        bench.database.dispose()
        bench.redis.close()

    results["ratios"] = ratios(figures)
    print(table(figures, results["ratios"], args))
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump(results, out, indent=2)
    return results


def throughput(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """The medians of ``--rounds`` runs each side, the rounds alternating between the two so
    that the machine's drift (this one's moves by 15 to 30 % within minutes) falls on both."""
    bench.at_rest()
    ours, raws = [], []
    for _ in range(args.rounds):
        ours.append(conveyor_throughput(bench, args.executions))
        raws.append(raw_throughput(bench, args.executions))
    return {
        "conveyor_per_s": statistics.median(ours), "raw_per_s": statistics.median(raws),
        "conveyor_rounds": ours, "raw_rounds": raws,
    }  # fmt: skip


def median(measure: Any, bench: Bench, args: argparse.Namespace) -> float:
    """The median of ``--rounds`` runs: one run's figure moves by 15 % on a busy machine."""
    return float(statistics.median(measure(bench, args.executions) for _ in range(args.rounds)))


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    """Each of Conveyor's figures over raw Celery's (for throughput: the share of raw's)."""
    found: dict[str, float] = {}
    for name, f in figures.items():
        if name.startswith("fanout_"):
            found[f"{name}_per_node"] = f["conveyor_s_per_node"] / f["raw_s_per_node"]
        if name.startswith("map_") and name != "map_scale":
            found[f"{name}_per_item"] = f["conveyor_s_per_item"] / f["raw_s_per_item"]
            static = figures[f"fanout_{name[4:]}"]["conveyor_s_per_node"]
            found[f"{name}_of_static"] = f["conveyor_s_per_item"] / static
        if name.startswith("chain_"):
            found[f"{name}_per_step"] = f["conveyor_s_per_step"] / f["raw_s_per_step"]
    if "throughput" in figures:
        t = figures["throughput"]
        found["throughput_of_raw"] = t["conveyor_per_s"] / t["raw_per_s"]
    if "latency" in figures:
        lat = figures["latency"]
        for what in ("node_start", "completed"):
            for p in ("p50", "p95", "p99"):
                found[f"latency_{what}_{p}"] = lat[f"conveyor_{what}"][p] / lat["raw_task_start"][p]
    if "waits" in figures:
        w = figures["waits"]
        for p in ("p50", "p95", "p99"):
            found[f"waits_{p}"] = w["conveyor_event_to_start"][p] / w["raw_relay_start"][p]
    if "scale" in figures and "throughput" in figures:
        found["scale_of_empty"] = (
            figures["scale"]["conveyor_per_s"] / figures["throughput"]["conveyor_per_s"]
        )
    return found


TARGETS = {
    "per_node": ("<=", 1.5),
    "per_step": ("<=", 1.5),
    "per_item": ("<=", 1.3),
    "of_static": ("<=", 1.2),
    "throughput_of_raw": (">=", 0.5),
    "node_start_p50": ("<=", 2.0),
    "node_start_p99": ("<=", 3.0),
    "completed_p50": ("<=", 1.5),  # a one-node execution against apply -> done
    "scale_of_empty": (">=", 0.9),
}


def _verdict(name: str, value: float) -> str:
    for suffix, (op, bound) in TARGETS.items():
        if name.endswith(suffix):
            met = value <= bound if op == "<=" else value >= bound
            return f"target {op} {bound:g}: {'met' if met else 'MISSED'}"
    return ""


def table(figures: dict[str, Any], found: dict[str, float], args: argparse.Namespace) -> str:
    rows: list[tuple[str, str, str, str]] = [("", "Conveyor", "raw Celery", "ratio")]
    for name, f in figures.items():
        if name.startswith("fanout_"):
            r = found[f"{name}_per_node"]
            rows.append((f"fan-out {name[7:]}: per node",
                         f"{f['conveyor_s_per_node'] * 1e3:.2f} ms",
                         f"{f['raw_s_per_node'] * 1e3:.2f} ms",
                         f"x{r:.2f}  {_verdict('per_node', r)}"))  # fmt: skip
        if name.startswith("map_") and name != "map_scale":
            r, static = found[f"{name}_per_item"], found[f"{name}_of_static"]
            rows.append((f"map {name[4:]}: per item",
                         f"{f['conveyor_s_per_item'] * 1e3:.2f} ms",
                         f"{f['raw_s_per_item'] * 1e3:.2f} ms",
                         f"x{r:.2f}  {_verdict('per_item', r)}"))  # fmt: skip
            rows.append((f"map {name[4:]}: of the static fan-out", "", "",
                         f"x{static:.2f}  {_verdict('of_static', static)}"))  # fmt: skip
        if name.startswith("chain_"):
            r = found[f"{name}_per_step"]
            rows.append((f"chain of {name[6:]}: per step",
                         f"{f['conveyor_s_per_step'] * 1e3:.2f} ms",
                         f"{f['raw_s_per_step'] * 1e3:.2f} ms",
                         f"x{r:.2f}  {_verdict('per_step', r)}"))  # fmt: skip
    if "throughput" in figures:
        t, r = figures["throughput"], found["throughput_of_raw"]
        rows.append((f"throughput ({args.executions} one-node)", f"{t['conveyor_per_s']:.0f} /s",
                     f"{t['raw_per_s']:.0f} /s",
                     f"x{r:.2f} of raw  {_verdict('throughput_of_raw', r)}"))  # fmt: skip
    if "latency" in figures:
        lat = figures["latency"]
        for what, label in (("node_start", "trigger->node start"), ("completed", "trigger->done")):
            for p in ("p50", "p95", "p99"):
                r = found[f"latency_{what}_{p}"]
                rows.append((f"{label} {p}", f"{lat[f'conveyor_{what}'][p] * 1e3:.1f} ms",
                             f"{lat['raw_task_start'][p] * 1e3:.1f} ms",
                             f"x{r:.2f}  {_verdict(f'{what}_{p}', r)}"))  # fmt: skip
    if "waits" in figures:
        w = figures["waits"]
        for p in ("p50", "p95", "p99"):
            rows.append((f"event->waiting node's successor {p}",
                         f"{w['conveyor_event_to_start'][p] * 1e3:.1f} ms",
                         f"{w['raw_relay_start'][p] * 1e3:.1f} ms (task->task)",
                         f"x{found[f'waits_{p}']:.2f}"))  # fmt: skip
    if "scale" in figures:
        s = figures["scale"]
        r = found.get("scale_of_empty", 0.0)
        rows.append((f"throughput, {s['rows']:,} finished jobs", f"{s['conveyor_per_s']:.0f} /s",
                     "", f"x{r:.2f} of empty  {_verdict('scale_of_empty', r)}"))  # fmt: skip
        rows.append((f"retention sweep of {s['pruned']:,} executions",
                     f"{s['pruned_per_s']:.0f} /s", "", ""))  # fmt: skip
    if "map_scale" in figures:
        rows += maps.scale_rows(figures["map_scale"])
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>12}  {c:>12}  {d}" for a, b, c, d in rows)


if __name__ == "__main__":
    main()
