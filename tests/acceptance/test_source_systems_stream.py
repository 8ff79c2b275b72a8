"""Issue 27, item 8: a tenant's live stream (GET /v1/stream) through `conveyor api` in its own
process and real `celery worker` processes: it sees an execution triggered after it opened,
only its tenant's and only what its filters ask for, and a client that reconnects with
Last-Event-ID after a dropped connection misses no event. The same stream printed by
`conveyor executions watch --json` in a process of its own, and read in Python
(`Conveyor.stream`), while a trigger happens. On Redis and on RabbitMQ (``acceptance_broker``):
the workers, the API, the CLI and the Python client on the same broker."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from itertools import islice
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import await_ready
from tests.acceptance.test_api import Start, serving_api
from tests.acceptance.test_cli import conveyor, conveyor_session
from tests.support.watch import Watch
from tests.support.watch import finished as printed

Event = tuple[str, str, dict[str, Any]]  # id, kind, data

NODES = {"CONVEYOR_IMPORTS": "tests.support.nodes"}
EXPORT = {"name": "export", "nodes": [
    {"id": "render", "type": "python", "config": {"function": "test.add"},
     "inputs": {"a": "{{ input.n }}", "b": 1}}]}  # fmt: skip


@pytest.fixture
def api(broker_env: dict[str, str], tmp_path: Path, client: object) -> Iterator[str]:
    """`conveyor api` in its own process, on the test's broker; an idle stream sends a comment
    every half second (CONVEYOR_STREAMS_KEEPALIVE), so that a reader told to stop hangs up
    soon."""
    env = {**broker_env, **NODES, "CONVEYOR_STREAMS_KEEPALIVE": "0.5"}
    with serving_api(env, tmp_path) as url:
        yield url


@contextmanager
def listening(http: httpx.Client, path: str, **headers: str) -> Iterator[queue.Queue[Event]]:
    """A stream read on a thread; its events arrive on the queue. Leaving the block hangs up
    (at the next line: a comment comes every half second), whatever the stream was doing."""
    events: queue.Queue[Event] = queue.Queue()
    opened = threading.Event()
    stop = threading.Event()
    failed: list[BaseException] = []

    def read() -> None:
        try:
            with http.stream("GET", path, headers=headers) as response:
                assert response.status_code == 200, response.read()
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if stop.is_set():
                        return
                    if line.startswith(":"):
                        opened.set()
                    elif line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                    elif "data" in fields:
                        events.put((fields["id"], fields["event"], json.loads(fields["data"])))
                        fields = {}
        except BaseException as exc:  # reported by the test
            failed.append(exc)
            opened.set()

    reader = threading.Thread(target=read)
    reader.start()
    opened.wait(15)
    try:
        assert not failed and opened.is_set(), f"the stream did not open: {failed}"
        yield events
    finally:
        stop.set()
        reader.join(timeout=15)
    assert not reader.is_alive() and not failed, failed


def collect(events: queue.Queue[Event], until: Callable[[list[Event]], bool]) -> list[Event]:
    got: list[Event] = []
    deadline = time.monotonic() + 30
    while not until(got):
        assert time.monotonic() < deadline, f"the stream stopped at {got}"
        with suppress(queue.Empty):
            got.append(events.get(timeout=1))
    return got


def finished(execution_id: str) -> Callable[[list[Event]], bool]:
    return lambda got: any(
        d["execution_id"] == execution_id and d["status"] == "completed" for _, _, d in got
    )


@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_a_tenant_stream_sees_later_executions_and_resumes_without_missing_one(
    api: str,
    start_worker: Start,
    broker_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    # Given workers, two tenants with a workflow of the same name, and a key each
    worker = start_worker("workflow-execution,workflow-node", concurrency=2, env=NODES,
                          wait=False)  # fmt: skip
    made = conveyor_session(
        ["tenants", "create", "acme"], ["keys", "create", "--tenant", "acme"],
        ["tenants", "create", "other"], ["keys", "create", "--tenant", "other"],
        env=broker_env,
    )  # fmt: skip
    assert [m.returncode for m in made] == [0] * 4, made
    keys = {"acme": made[1].stdout.strip(), "other": made[3].stdout.strip()}
    await_ready(worker)

    def client(tenant: str) -> httpx.Client:
        http = httpx.Client(
            base_url=api, headers={"Authorization": f"Bearer {keys[tenant]}"}, timeout=30
        )
        request.addfinalizer(http.close)
        return http

    acme, other = client("acme"), client("other")
    for http in (acme, other):
        assert http.post("/v1/workflows", json=EXPORT).status_code == 201

    def trigger(http: httpx.Client, key: str, n: int) -> str:
        body = {"input": {"n": n}, "dedupe_key": key}
        started = http.post("/v1/workflows/export/executions", json=body)
        assert started.status_code == 201, started.text
        return str(started.json()["id"])

    # When acme opens a stream on one document's exports before any exists, and executions
    # are triggered: its document's, another document's, and the other tenant's
    path = "/v1/stream?workflow=export&dedupe_key=doc-1"
    with listening(client("acme"), path) as events:
        first = trigger(acme, "doc-1", 1)
        trigger(acme, "doc-2", 2)
        trigger(other, "doc-1", 3)
        seen = collect(events, finished(first))

    # Then it saw its document's execution, every status in order (planned as it was
    # triggered, it starts running), and nothing else
    assert [(d["execution_id"], d["status"]) for _, _, d in seen] == [
        (first, "running"), (first, "completed")
    ]  # fmt: skip
    assert {(kind, d["workflow"], d["dedupe_key"]) for _, kind, d in seen} == {
        ("execution", "export", "doc-1")
    }

    # When the connection drops, a second export of the document runs meanwhile (with the
    # other tenant's and another document's), and the client reconnects with the last id
    second = trigger(acme, "doc-1", 4)
    trigger(other, "doc-1", 5)
    trigger(acme, "doc-2", 6)
    deadline = time.monotonic() + 30
    while acme.get(f"/v1/executions/{second}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with listening(client("acme"), path, **{"Last-Event-ID": seen[-1][0]}) as events:
        resumed = collect(events, finished(second))
        third = trigger(acme, "doc-1", 7)
        resumed += collect(events, finished(third))

    # Then it gets every event it missed, once, and goes on live
    assert [(d["execution_id"], d["status"]) for _, _, d in resumed] == [
        (second, "running"), (second, "completed"), (third, "running"), (third, "completed"),
    ]  # fmt: skip
    ids = [event_id for event_id, _, _ in seen + resumed]
    assert len(set(ids)) == len(ids)

    # And a Last-Event-ID that is none of its ids is refused, naming the problem
    refused = acme.get("/v1/stream", headers={"Last-Event-ID": "yesterday"})
    assert refused.status_code == 422
    assert "Last-Event-ID 'yesterday'" in refused.json()["detail"]


@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_conveyor_executions_watch_and_the_python_stream_see_a_trigger_as_it_happens(
    client: Conveyor,
    start_worker: Start,
    broker_env: dict[str, str],
    tmp_path: Path,
) -> None:
    # Given a worker, a tenant with the export workflow, and, before any export exists,
    # `conveyor executions watch --json` on one document's exports and the same stream in Python
    worker = start_worker("workflow-execution,workflow-node", concurrency=2, env=NODES,
                          wait=False)  # fmt: skip
    assert conveyor("tenants", "create", "acme", env=broker_env).returncode == 0
    client.apply(parse_workflow(EXPORT), "acme")
    env = {**broker_env, **NODES}
    args = ("--tenant", "acme", "--workflow", "export", "--dedupe-key", "doc-1")
    watch = Watch(*args, env=env, cwd=tmp_path)
    stream = client.stream("acme", workflow="export", dedupe_key="doc-1", poll=0.1)
    try:
        await_ready(worker)
        # When the document's export is triggered (by `conveyor run`), and another's
        ran = conveyor("run", "export", "--tenant", "acme", "--dedupe-key", "doc-1",
                       "--input", '{"n": 1}', env=env)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        export = ran.stdout.strip()
        client.submit("export", {"n": 2}, tenant="acme", dedupe_key="doc-2")

        # Then the watch prints its events as they happen, one JSON object a line
        lines = watch.collect(printed(export))
    finally:
        code = watch.stop()
    assert code == 0, watch.stderr  # Ctrl-C ends it
    assert [(e["kind"], e["data"]["execution_id"], e["data"]["status"]) for e in lines] == [
        ("execution", export, "running"), ("execution", export, "completed"),
    ]  # fmt: skip
    # ... and the Python stream yields the same events, ids and all
    got = [{"id": e.id, "kind": e.kind, "data": e.data} for e in islice(stream, 2)]
    stream.close()
    assert got == lines
