"""The dashboard's cost: the server time of the executions list and of an execution's page
with many executions stored, and what ten live execution pages (ten SSE clients) cost node
throughput, against none — in one run.

    python -m benchmarks.ui [--executions 1000000] [--requests 50] [--throughput 1000]
                            [--clients 10] [--concurrency 4] [--json results.json]

Needs PostgreSQL and Redis as the tests do (a database of its own; Redis db 14, flushed).
The stored executions are loaded by one INSERT ... SELECT over generate_series (completed,
one a second back in time); the timed pages are fetched over HTTP from the API served in this
process (uvicorn), signed in as a tenant's key.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import create_engine, func, select, text

from benchmarks import harness
from conveyor.config import Settings
from conveyor.engine.credentials import new_api_key
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution
from conveyor.service import Conveyor
from conveyor.store import Database
from conveyor.tasks.app import create_app
from conveyor.tasks.dispatch import CeleryDispatcher

NOOP = {
    "name": "noop",
    "nodes": [
        {"id": "a", "type": "python", "config": {"function": "bench.noop"}},
        {"id": "b", "type": "python", "config": {"function": "bench.noop"}, "needs": ["a"]},
    ],
}
NODES = len(NOOP["nodes"])
LOAD = """
INSERT INTO executions (id, tenant_id, workflow_id, status, priority, trigger, input,
                        remaining_nodes, reruns, depth, created_at)
SELECT gen_random_uuid(), :tenant, :workflow, 'completed', 'normal', 'bench-load', '{}',
       0, 0, 0, now() - make_interval(secs => g)
FROM generate_series(1, :n) AS g
"""


def load(database: Database, tenant_id: uuid.UUID, workflow_id: uuid.UUID, n: int) -> float:
    """Store ``n`` completed executions in one statement; the seconds it took."""
    began = time.perf_counter()
    with database.engine.begin() as conn:
        conn.execute(text(LOAD), {"tenant": tenant_id, "workflow": workflow_id, "n": n})
    with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE executions"))
    return time.perf_counter() - began


@contextmanager
def served(service: Conveyor, settings: Settings) -> Iterator[str]:
    """The API (and so /ui) served over HTTP in this process; its URL."""
    import uvicorn

    from conveyor.api import create_app as create_api

    server = uvicorn.Server(
        uvicorn.Config(create_api(service, settings), host="127.0.0.1", port=0,
                       log_level="warning", lifespan="on")
    )  # fmt: skip
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def signed_in(url: str, key: str) -> Iterator[httpx.Client]:
    """A client with a dashboard session of ``key``."""
    with httpx.Client(base_url=url, timeout=60) as browser:
        answer = browser.post("/ui/signin", data={"key": key})
        if answer.status_code != 303:
            raise RuntimeError(f"sign-in refused: {answer.status_code}")
        yield browser


def timed(browser: httpx.Client, path: str, requests: int) -> dict[str, float]:
    """p50 and p95 (milliseconds) of ``requests`` GETs of ``path``, each answered 200."""
    took = []
    for _ in range(requests):
        began = time.perf_counter()
        answer = browser.get(path)
        took.append((time.perf_counter() - began) * 1e3)
        if answer.status_code != 200:
            raise RuntimeError(f"{path} answered {answer.status_code}")
    took.sort()
    return {"p50_ms": statistics.median(took), "p95_ms": took[max(0, round(0.95 * len(took)) - 1)]}


def throughput(
    svc: harness.Services, client: Conveyor, url: str, key: str, n: int, clients: int,
    concurrency: int,
) -> float:  # fmt: skip
    """Nodes per second: ``n`` executions queued, drained by fresh workers while ``clients``
    live execution pages follow the first of them."""
    ids = [client.trigger("noop") for _ in range(n)]
    stop = threading.Event()
    followers = [
        threading.Thread(target=_follow, args=(url, key, ids[i * n // clients], stop), daemon=True)
        for i in range(clients)
    ]
    for follower in followers:
        follower.start()
    specs = [("workflow-execution", max(2, concurrency // 2)), ("workflow-node", concurrency)]
    try:
        with harness.workers("conveyor.tasks", specs, svc.env()) as ready:
            _wait_completed(svc.database_url, ids, timeout=60 + n / 5)
            elapsed = time.perf_counter() - ready
    finally:
        stop.set()
        for follower in followers:
            follower.join(timeout=10)
    return n * NODES / elapsed


def _follow(url: str, key: str, execution_id: uuid.UUID, stop: threading.Event) -> None:
    """One open execution page: its live stream read until told to stop. A stream that ended
    (its execution finished) is opened again, as a page left open would."""
    with signed_in(url, key) as browser:
        while not stop.is_set():
            try:
                path = f"/ui/executions/{execution_id}/events"
                with browser.stream("GET", path, timeout=httpx.Timeout(60, read=1)) as events:
                    for _ in events.iter_lines():
                        if stop.is_set():
                            return
            except httpx.ReadTimeout:
                continue  # quiet for a second: look at stop, and go on reading
            stop.wait(0.2)


def _wait_completed(url: str, ids: list[uuid.UUID], timeout: float) -> None:
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    query = select(func.count()).where(
        Execution.status == ExecutionStatus.COMPLETED, Execution.id.in_(ids)
    )
    with engine.connect() as conn:
        while conn.execute(query).scalar_one() < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"executions not completed after {timeout:.0f} s")
            time.sleep(0.02)
            conn.rollback()
    engine.dispose()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--throughput", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if min(args.executions, args.requests, args.throughput, args.clients) < 1:
        parser.error("every count must be at least 1")

    with harness.services() as svc:
        settings = Settings(
            database_url=svc.database_url, broker_url=svc.redis_url, redis_url=svc.redis_url
        )
        database = Database(svc.database_url)
        client = Conveyor(database, CeleryDispatcher(create_app(settings)))
        workflow, _ = client.apply(parse_workflow(NOOP))
        made = new_api_key()
        with database.transaction() as store:
            tenant_id = store.tenant_id("default")
            store.add_api_key(tenant_id, "bench", made.prefix, made.digest, datetime.now(UTC))
        loaded = load(database, tenant_id, workflow.id, args.executions)
        with served(client, settings) as url:
            base = throughput(svc, client, url, made.key, args.throughput, 0, args.concurrency)
            live = throughput(
                svc, client, url, made.key, args.throughput, args.clients, args.concurrency
            )
            with database.transaction() as store:
                real = store.session.scalar(
                    select(Execution.id).where(Execution.trigger != "bench-load").limit(1)
                )
            with signed_in(url, made.key) as browser:
                pages = {
                    "executions_list": timed(browser, "/ui/executions", args.requests),
                    "executions_list_failed": timed(
                        browser, "/ui/executions?status=failed", args.requests
                    ),
                    "execution_page": timed(browser, f"/ui/executions/{real}", args.requests),
                }
        database.dispose()

    results = {
        "executions": args.executions, "load_seconds": loaded, "requests": args.requests,
        "pages": pages, "clients": args.clients,
        "nodes_per_second": {"no_pages": base, "live_pages": live},
        "ratios": {"live_pages_of_none": live / base},
    }  # fmt: skip
    print(f"{'loaded ' + str(args.executions) + ' executions':<44} {loaded:>10.1f} s")
    for name, figure in pages.items():
        print(f"{name:<44} p50 {figure['p50_ms']:>8.1f} ms  p95 {figure['p95_ms']:>8.1f} ms")
    print(f"{'nodes/s, no page open':<44} {base:>10.1f}")
    print(f"{f'nodes/s, {args.clients} live pages':<44} {live:>10.1f}  x{live / base:.2f} of none")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump(results, out, indent=2)
    return results


if __name__ == "__main__":
    main()
